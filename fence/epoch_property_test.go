package fence_test

import (
	"errors"
	"testing"

	"pgregory.net/rapid"

	"github.com/edgefence/edgefence/fence"
)

// An epoch command as it travels: the holder that issued it, the epoch it
// knew, its token and seq, and when it was issued (a step of the run).
type epochCommand struct {
	holder int
	epoch  uint64
	tok    fence.Token
	seq    uint64
	issued int
}

// epochRun is one fence point, its holders and the operator's root, driven
// step by step (TestPropEpochClosesThePast).
type epochRun struct {
	t *rapid.T

	// The root: the newest epoch it issued, and when each was issued.
	rootEpoch uint64
	raisedAt  map[uint64]int
	lastTok   fence.Token // etcd's last revision (lowered by a rebuild)

	// Holders: token, the epoch they know, their last seq.
	holders []epochCommand

	// The fence point: the fleet epoch it holds and the stored state, as
	// committed (durable before effect), and a copy that restarts.
	fleet      uint64
	state      fence.State
	diskFleet  uint64
	disk       fence.State
	restarted  fence.State
	restartedE uint64

	queue    []epochCommand // issued, not delivered
	again    []epochCommand // delivered, may arrive again
	accepted []epochCommand
}

func (r *epochRun) grant() {
	r.lastTok += fence.Token(rapid.Uint64Range(1, 3).Draw(r.t, "revisionGap"))
	r.holders = append(r.holders, epochCommand{holder: len(r.holders), epoch: r.rootEpoch, tok: r.lastTok})
}

func (r *epochRun) issue(step int) {
	if len(r.holders) == 0 {
		return
	}
	h := &r.holders[rapid.IntRange(0, len(r.holders)-1).Draw(r.t, "issuer")]
	h.seq++
	r.queue = append(r.queue, epochCommand{holder: h.holder, epoch: h.epoch, tok: h.tok, seq: h.seq, issued: step})
}

// raise: the root issues the next fleet epoch (an etcd rebuild: revisions
// start low again); the fence point learns it at some later step.
func (r *epochRun) raise(step int) {
	r.rootEpoch++
	r.raisedAt[r.rootEpoch] = step
	r.lastTok = fence.Token(rapid.Uint64Range(0, 5).Draw(r.t, "rebuiltRevision"))
}

func (r *epochRun) learn() {
	r.fleet = r.rootEpoch
	r.diskFleet = r.fleet // the ledger commits before the effect
	r.restartedE = r.fleet
}

// reset: the root signs a reset in the next epoch to a mark below the
// device's, and the fence point applies it at once.
func (r *epochRun) reset(step int) {
	r.rootEpoch++
	r.raisedAt[r.rootEpoch] = step
	to := fence.Mark{Token: fence.Token(rapid.Uint64Range(1, uint64(r.lastTok)+1).Draw(r.t, "resetTo")), Seq: 1<<64 - 1}
	if err := fence.CheckReset(fence.ResetRecord{}, max(r.fleet, r.state.Epoch), 1, r.rootEpoch); err != nil {
		r.t.Fatalf("reset refused: %v", err)
	}
	r.state = fence.State{Epoch: r.rootEpoch, Mark: to}
	r.disk, r.restarted = r.state, r.state
	r.lastTok = max(r.lastTok, to.Token)
}

func (r *epochRun) deliver(step int) {
	n := len(r.queue) + len(r.again)
	if n == 0 {
		return
	}
	var c epochCommand
	if i := rapid.IntRange(0, n-1).Draw(r.t, "arrival"); i < len(r.queue) {
		c = r.queue[i]
		r.queue = append(r.queue[:i], r.queue[i+1:]...)
		if rapid.IntRange(0, 3).Draw(r.t, "duplicate") == 0 {
			r.again = append(r.again, c)
		}
	} else {
		c = r.again[i-len(r.queue)]
		r.again = append(r.again[:i-len(r.queue)], r.again[i-len(r.queue)+1:]...)
	}
	if rapid.IntRange(0, 5).Draw(r.t, "restart") == 0 {
		r.restarted, r.restartedE = r.disk, r.diskFleet
	}
	e := max(r.fleet, r.state.Epoch)
	want, wantErr := r.spec(c, e)
	v, next, err := fence.AdmitEpoch(r.fleet, r.state, c.epoch, c.tok, c.seq)
	if v != want || !errors.Is(err, wantErr) || (wantErr == nil) != (err == nil) {
		r.t.Fatalf("step %d: %+v at epoch %d, state %v: %v (%v), want %v (%v)", step, c, e, r.state, v, err, want, wantErr)
	}
	v2, next2, _ := fence.AdmitEpoch(r.restartedE, r.restarted, c.epoch, c.tok, c.seq)
	if v2 != v || next2 != next {
		r.t.Fatalf("step %d: restarted fence point says %v → %v, the other %v → %v", step, v2, next2, v, next)
	}
	if v != fence.Accepted {
		if next.Mark != r.state.At(r.fleet).Mark {
			r.t.Fatalf("step %d: %v moved the mark %v → %v", step, v, r.state, next)
		}
		return
	}
	// The past is closed: no command issued before the newest epoch the
	// fence point holds began is accepted.
	if c.issued <= r.raisedAt[e] || c.epoch != e {
		r.t.Fatalf("step %d: accepted %+v, issued before epoch %d began (step %d)", step, c, e, r.raisedAt[e])
	}
	r.state, r.disk, r.restarted = next, next, next
	r.accepted = append(r.accepted, c)
}

// spec is the verdict for c at a fence point at epoch e, from the history
// alone: the epoch first, then the token rule against what was accepted in
// e (and the mark a reset set in e).
func (r *epochRun) spec(c epochCommand, e uint64) (fence.Verdict, error) {
	switch {
	case c.epoch < e:
		return fence.Stale, fence.ErrEpochClosed
	case c.epoch > e:
		return fence.Invalid, fence.ErrUnknownEpoch
	}
	top := fence.Mark{}
	if r.state.Epoch == e {
		top = r.state.Mark // a reset's mark, or the highest accepted in e
	}
	for _, a := range r.accepted {
		if a.epoch == e && (a.tok > top.Token || a.tok == top.Token && a.seq > top.Seq) {
			r.t.Fatalf("accepted %+v above the state %v", a, r.state)
		}
	}
	switch {
	case c.tok < top.Token:
		return fence.Stale, nil
	case c.tok == top.Token && c.seq <= top.Seq:
		return fence.Duplicate, nil
	}
	return fence.Accepted, nil
}

// checkEpochI1: across the run, accepted epochs never go down and, within
// an epoch, tokens never go down and nothing is applied twice.
func (r *epochRun) checkEpochI1() {
	for i := 1; i < len(r.accepted); i++ {
		p, c := r.accepted[i-1], r.accepted[i]
		switch {
		case c.epoch < p.epoch:
			r.t.Fatalf("I1: epoch %d accepted after epoch %d", c.epoch, p.epoch)
		case c.epoch == p.epoch && (c.tok < p.tok || c.tok == p.tok && c.seq <= p.seq):
			r.t.Fatalf("I1: %+v accepted after %+v", c, p)
		}
	}
}

// TestPropEpochClosesThePast: holders issue commands in the epoch they
// know, keep issuing after they are superseded, and the network delays,
// reorders and repeats; the root raises the fleet epoch (an etcd rebuild:
// revisions start low again) and the fence point learns it later; the
// root resets the device to a lower mark in a new epoch; the fence point
// restarts from what it committed. AdmitEpoch's verdicts match the
// specification, no command issued before an epoch the fence point holds
// is ever accepted, and the restarted fence point decides as the other.
func TestPropEpochClosesThePast(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		r := &epochRun{t: t, raisedAt: map[uint64]int{0: -1}, lastTok: fence.Token(rapid.Uint64Range(0, 100).Draw(t, "firstRevision"))}
		steps := rapid.IntRange(0, 200).Draw(t, "steps")
		for step := range steps {
			switch rapid.IntRange(0, 9).Draw(t, "action") {
			case 0:
				r.grant()
			case 1, 2:
				r.issue(step)
			case 3:
				r.raise(step)
			case 4:
				r.learn()
			case 5:
				r.reset(step)
			default:
				r.deliver(step)
			}
		}
		for len(r.queue)+len(r.again) > 0 {
			r.deliver(steps)
		}
		r.checkEpochI1()
	})
}
