package fence_test

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/edgefence/edgefence/fence"
)

func resetRec(counter, epoch uint64, id string) fence.ResetRecord {
	return fence.ResetRecord{Counter: counter, Epoch: epoch, ID: id}
}

// epochCmd is cmd issued in epoch e.
func epochCmd(dev string, e uint64, tok fence.Token, seq uint64) *fence.Envelope {
	c := cmd(dev, tok, seq)
	c.Epoch = e
	return c
}

// Table.Reset sets a device's mark, lower included, in the reset's epoch,
// durably; drops the device's unapplied commands; refuses a counter not
// above the last one, or an epoch not above the device's (replay), the
// mark unchanged; the other devices are untouched.
func TestTableReset(t *testing.T) {
	ctx := context.Background()
	path := tablePath(t)
	tab := openTable(t, path, nil)
	for _, c := range []*fence.Envelope{cmd("dev-1", 10, 1), cmd("dev-1", 1<<63, 1), cmd("dev-2", 5, 1)} {
		if v, _, err := tab.Admit(ctx, c); v != fence.Accepted || err != nil {
			t.Fatalf("%v %v", v, err)
		}
	}
	if err := tab.Applied(ctx, "dev-1", fence.Mark{Token: 10, Seq: 1}); err != nil {
		t.Fatal(err)
	}
	to := fence.Mark{Token: 9, Seq: math.MaxUint64}
	if st, err := tab.Reset(ctx, "dev-1", to, resetRec(1, 1, "reset:one"), 0); err != nil || st != (fence.State{Epoch: 1, Mark: to}) {
		t.Fatalf("reset: %v %v", st, err)
	}
	if un, err := tab.Unapplied("dev-1"); err != nil || len(un) != 0 {
		t.Fatalf("unapplied after the reset: %v %v (the forgery above the new mark must go)", un, err)
	}
	// The in-memory copy follows: the holder, in the reset's epoch, is
	// accepted; an old token, or the old epoch, stale.
	if v, st, err := tab.AdmitAt(ctx, epochCmd("dev-1", 1, 10, 2), 0); v != fence.Accepted || err != nil || st.Epoch != 1 {
		t.Fatalf("holder after the reset: %v %v %v", v, st, err)
	}
	if v, _, _ := tab.AdmitAt(ctx, epochCmd("dev-1", 1, 8, 1), 0); v != fence.Stale {
		t.Fatalf("token 8 after the reset: %v", v)
	}
	for _, r := range []fence.ResetRecord{resetRec(1, 5, "reset:again"), resetRec(0, 5, "reset:zero"), resetRec(2, 1, "reset:old-epoch"), resetRec(2, 0, "reset:no-epoch")} {
		st, err := tab.Reset(ctx, "dev-1", to, r, 0)
		replay := r.Counter == 1 || r.Epoch == 1
		if !errors.Is(err, fence.ErrInvalid) || (replay && (!errors.Is(err, fence.ErrReplayedReset) || st != (fence.State{Epoch: 1, Mark: fence.Mark{Token: 10, Seq: 2}}))) {
			t.Fatalf("%+v: %v %v", r, st, err)
		}
	}
	if r, _ := mustGet(t, tab, "dev-2"); r.Mark != (fence.Mark{Token: 5, Seq: 1}) || r.Epoch != 0 {
		t.Fatalf("dev-2 %+v", r)
	}
	// Durable.
	if err := tab.Close(); err != nil {
		t.Fatal(err)
	}
	tab = openTable(t, path, nil)
	if r, _ := mustGet(t, tab, "dev-1"); r.Mark != (fence.Mark{Token: 10, Seq: 2}) || r.Epoch != 1 {
		t.Fatalf("after a reopen: %+v", r)
	}
	if r, err := tab.LastReset("dev-1"); err != nil || r.Counter != 1 || r.Epoch != 1 || r.ID != "reset:one" {
		t.Fatalf("last reset %+v %v", r, err)
	}
	if _, err := tab.Reset(ctx, "dev-1", to, resetRec(1, 9, "reset:replay"), 0); !errors.Is(err, fence.ErrReplayedReset) {
		t.Fatalf("replay after a reopen: %v", err)
	}
	if st, err := tab.Reset(ctx, "dev-1", fence.Mark{Token: 2, Seq: 1}, resetRec(2, 2, "reset:two"), 0); err != nil || st != (fence.State{Epoch: 2, Mark: fence.Mark{Token: 2, Seq: 1}}) {
		t.Fatalf("next counter: %v %v", st, err)
	}
}

// A reset closes the past: an envelope captured at token T before a reset
// to a mark below T is refused stale after it (its epoch is closed), the
// mark unchanged, in memory and after a reopen; and so is one of an epoch
// below the fleet epoch the caller holds (AdmitAt's floor). On the code
// before epochs the captured envelope was accepted again.
func TestTableResetClosesThePast(t *testing.T) {
	ctx := context.Background()
	path := tablePath(t)
	tab := openTable(t, path, nil)
	captured := epochCmd("dev-1", 0, 900, 1)
	for _, c := range []*fence.Envelope{epochCmd("dev-1", 0, 100, 1), captured, epochCmd("dev-1", 0, 1<<62, 1)} {
		if v, _, err := tab.AdmitAt(ctx, c, 0); v != fence.Accepted || err != nil {
			t.Fatalf("%v %v", v, err)
		}
	}
	after := fence.State{Epoch: 7, Mark: fence.Mark{Token: 50, Seq: math.MaxUint64}}
	if st, err := tab.Reset(ctx, "dev-1", after.Mark, resetRec(1, 7, "reset:r"), 0); err != nil || st != after {
		t.Fatalf("reset: %v %v", st, err)
	}
	replay := func(tab *fence.Table, c *fence.Envelope, floor uint64, want fence.Verdict, wantErr error, st fence.State) {
		t.Helper()
		before, _ := mustGet(t, tab, "dev-1")
		v, got, err := tab.AdmitAt(ctx, c, floor)
		if v != want || !errors.Is(err, wantErr) || got != st {
			t.Fatalf("%d/%d/%d at floor %d: %v %v %v; want %v (%v), state %v", c.Epoch, c.Token, c.Seq, floor, v, got, err, want, wantErr, st)
		}
		if r, _ := mustGet(t, tab, "dev-1"); r.Epoch != before.Epoch || r.Mark != before.Mark {
			t.Fatalf("stored %+v after a refusal, %+v before", r, before)
		}
	}
	replay(tab, captured, 0, fence.Stale, fence.ErrEpochClosed, after)
	replay(tab, epochCmd("dev-1", 9, 60, 1), 0, fence.Invalid, fence.ErrUnknownEpoch, after)
	var ee *fence.EpochError
	if _, _, err := tab.AdmitAt(ctx, captured, 0); !errors.As(err, &ee) || ee.Error() != "epoch 0 closed: the fence point is at epoch 7" {
		t.Fatalf("reason: %v", err)
	}
	if err := tab.Close(); err != nil {
		t.Fatal(err)
	}
	tab = openTable(t, path, nil)
	replay(tab, captured, 0, fence.Stale, fence.ErrEpochClosed, after)
	if v, st, err := tab.AdmitAt(ctx, epochCmd("dev-1", 7, 60, 1), 0); v != fence.Accepted || err != nil || st != (fence.State{Epoch: 7, Mark: fence.Mark{Token: 60, Seq: 1}}) {
		t.Fatalf("the holder in epoch 7: %v %v %v", v, st, err)
	}
	// A fleet epoch above the device's: the mark of epoch 7 counts as none,
	// epoch 7 is closed, and a low token of epoch 8 is accepted.
	fleet := fence.State{Epoch: 8}
	replay(tab, epochCmd("dev-1", 7, 61, 1), 8, fence.Stale, fence.ErrEpochClosed, fleet)
	if v, st, err := tab.AdmitAt(ctx, epochCmd("dev-1", 8, 3, 1), 8); v != fence.Accepted || err != nil || st != (fence.State{Epoch: 8, Mark: fence.Mark{Token: 3, Seq: 1}}) {
		t.Fatalf("epoch 8: %v %v %v", v, st, err)
	}
	// The stored mark's epoch holds even when the caller forgets the fleet
	// epoch (a trust kept in memory only, restarted).
	if v, _, err := tab.AdmitAt(ctx, epochCmd("dev-1", 7, 1<<40, 1), 0); v != fence.Stale || !errors.Is(err, fence.ErrEpochClosed) {
		t.Fatalf("epoch 7 at floor 0 after epoch 8: %v %v", v, err)
	}
	// A reset must be above the fleet epoch too.
	if _, err := tab.Reset(ctx, "dev-1", after.Mark, resetRec(2, 8, "reset:s"), 8); !errors.Is(err, fence.ErrReplayedReset) {
		t.Fatalf("reset at the fleet epoch: %v", err)
	}
	if _, err := tab.Reset(ctx, "dev-1", after.Mark, resetRec(2, 8, "reset:s"), 9); !errors.Is(err, fence.ErrReplayedReset) {
		t.Fatalf("reset below the fleet epoch: %v", err)
	}
}
