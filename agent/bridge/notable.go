package bridge

import (
	"context"
	"fmt"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/history"
)

// NoTable returns a Table that admits every command and remembers
// nothing: the bridge then forwards stale and repeated commands to the
// device. TEST AND DEMO ONLY, to show what the fence table prevents; only a
// build with -tags edgefence_unsafe has it (ErrUnsafeBuild otherwise).
// Accepts go to hist (nil: none), as a Table records them.
func NoTable(hist *history.Writer) (Table, error) {
	if !unsafeBuild {
		return nil, fmt.Errorf("%w: NoTable", ErrUnsafeBuild)
	}
	return noTable{hist}, nil
}

type noTable struct{ hist *history.Writer }

func (t noTable) AdmitAt(_ context.Context, env *fence.Envelope, _ uint64) (fence.Verdict, fence.State, error) {
	if err := env.Validate(); err != nil {
		return fence.Invalid, fence.State{}, err
	}
	if t.hist != nil {
		_ = t.hist.Record(history.Event{Op: history.OpVerdict, Device: env.Device, ID: env.ID, Token: uint64(env.Token),
			Seq: env.Seq, Kind: env.Kind, Verdict: fence.Accepted.String()})
	}
	return fence.Accepted, fence.State{Epoch: env.Epoch, Mark: fence.Mark{Token: env.Token, Seq: env.Seq}}, nil
}
func (noTable) MarkApplied(string, fence.Mark) (uint64, error) { return 0, nil }
func (noTable) AwaitApplied(context.Context, uint64) error     { return nil }
func (noTable) Unapplied(string) ([]*fence.Envelope, error)    { return nil, nil }
