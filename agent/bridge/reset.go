package bridge

import (
	"context"
	"fmt"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
)

// resetter is what a reset needs of the table; *fence.Table has it (the
// unsafe NoTable has not: resets are refused there).
type resetter interface {
	Reset(ctx context.Context, device string, to fence.Mark, r fence.ResetRecord, floor uint64) (fence.State, error)
}

// resetVerifier is what checks resets here: Config.Root, else Keys if it
// is the whole trust chain (an *auth.Trust), else nothing.
func (b *Bridge) resetVerifier() auth.ResetVerifier {
	if b.cfg.Root != nil {
		return b.cfg.Root
	}
	if v, ok := b.cfg.Keys.(auth.ResetVerifier); ok {
		return v
	}
	return nil
}

// onReset applies an operator's reset statement that arrived on dev's
// command topic: verified against the root, then set in the fence table
// (the mark and the reset counter in one fsynced transaction; a counter
// not above the last one is a replay) before the ack says accepted. Every
// refusal is invalid with the mark unchanged, counted and logged. It runs
// on the MQTT delivery goroutine, like onCommand, so before the PUBACK.
func (b *Bridge) onReset(dev string, raw []byte) {
	r, m, err := b.applyReset(dev, raw)
	if r == nil {
		r, _ = auth.PeekReset(raw) // unverified: only to name the reset in the refusal
	}
	a := auth.ResetAck(dev, r, fence.State{Mark: m}, err)
	if err != nil {
		b.invalid.Add(1)
		b.resetsRefused.Add(1)
		b.log.Warn("reset refused", "device", dev, "id", a.ID, "fence_token", m.Token, "err", err, "by", "fence table")
	} else {
		b.resets.Add(1)
		b.log.Warn("fence reset by the operator", "device", dev, "mark", m.String(), "counter", r.Counter, "id", r.ID, "by", "fence table")
	}
	b.ack(dev, &fence.Envelope{Device: dev, ID: a.ID, Token: a.Token, Seq: a.Seq}, a.Verdict, a.Mark(), a.Reason)
}

// applyReset verifies and applies; m is the device's mark afterwards (as
// far as the table knows it, on a refusal).
func (b *Bridge) applyReset(dev string, raw []byte) (*auth.Reset, fence.Mark, error) {
	cur := func() fence.Mark {
		if t, ok := b.cfg.Table.(*fence.Table); ok {
			if rec, _, err := t.Get(dev); err == nil {
				return rec.Mark
			}
		}
		return fence.Mark{}
	}
	v := b.resetVerifier()
	if v == nil {
		return nil, cur(), fmt.Errorf("%w: %w: this gateway's fence table cannot check a reset", fence.ErrInvalid, auth.ErrNoRoot)
	}
	r, err := v.VerifyReset(raw, dev)
	if err != nil {
		return nil, cur(), err
	}
	t, ok := b.cfg.Table.(resetter)
	if !ok {
		return r, fence.Mark{}, fmt.Errorf("%w: no fence table to reset", fence.ErrInvalid)
	}
	st, err := t.Reset(context.Background(), dev, r.Mark(), r.Record(), 0)
	if err != nil {
		b.tableErr.Add(1)
		return r, st.Mark, err
	}
	return r, st.Mark, nil
}
