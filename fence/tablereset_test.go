package fence_test

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/edgefence/edgefence/fence"
)

// Table.Reset sets a device's mark, lower included, durably; drops the
// device's unapplied commands above the new mark; refuses a counter not
// above the last one (replay), the mark unchanged; the other devices are
// untouched.
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
	if m, err := tab.Reset(ctx, "dev-1", to, 1, "reset:one"); err != nil || m != to {
		t.Fatalf("reset: %v %v", m, err)
	}
	if un, err := tab.Unapplied("dev-1"); err != nil || len(un) != 0 {
		t.Fatalf("unapplied after the reset: %v %v (the forgery above the new mark must go)", un, err)
	}
	// The in-memory copy follows: the holder is accepted, an old token stale.
	if v, m, err := tab.Admit(ctx, cmd("dev-1", 10, 2)); v != fence.Accepted || err != nil {
		t.Fatalf("holder after the reset: %v %v %v", v, m, err)
	}
	if v, _, _ := tab.Admit(ctx, cmd("dev-1", 8, 1)); v != fence.Stale {
		t.Fatalf("token 8 after the reset: %v", v)
	}
	for _, n := range []uint64{1, 0} {
		m, err := tab.Reset(ctx, "dev-1", to, n, "reset:again")
		if !errors.Is(err, fence.ErrInvalid) || (n == 1 && (!errors.Is(err, fence.ErrReplayedReset) || m != (fence.Mark{Token: 10, Seq: 2}))) {
			t.Fatalf("counter %d again: %v %v", n, m, err)
		}
	}
	if r, _ := mustGet(t, tab, "dev-2"); r.Mark != (fence.Mark{Token: 5, Seq: 1}) {
		t.Fatalf("dev-2 %v", r.Mark)
	}
	// Durable.
	if err := tab.Close(); err != nil {
		t.Fatal(err)
	}
	tab = openTable(t, path, nil)
	if r, _ := mustGet(t, tab, "dev-1"); r.Mark != (fence.Mark{Token: 10, Seq: 2}) {
		t.Fatalf("after a reopen: %v", r.Mark)
	}
	if r, err := tab.LastReset("dev-1"); err != nil || r.Counter != 1 || r.ID != "reset:one" {
		t.Fatalf("last reset %+v %v", r, err)
	}
	if _, err := tab.Reset(ctx, "dev-1", to, 1, "reset:replay"); !errors.Is(err, fence.ErrReplayedReset) {
		t.Fatalf("replay after a reopen: %v", err)
	}
	if m, err := tab.Reset(ctx, "dev-1", fence.Mark{Token: 2, Seq: 1}, 2, "reset:two"); err != nil || m != (fence.Mark{Token: 2, Seq: 1}) {
		t.Fatalf("next counter: %v %v", m, err)
	}
}
