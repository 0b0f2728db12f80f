package history_test

import (
	"path/filepath"
	"testing"

	"github.com/edgefence/edgefence/fence/history"
)

// inEpoch is a fence point's verdict on a command of epoch e.
func inEpoch(i int, src, id string, e, tok, seq uint64, verdict string) history.Event {
	x := ev(i, src, history.OpVerdict, "dev-1", id, tok, seq, verdict)
	x.Epoch = e
	return x
}

// moved is a fence point's OpEpoch: dev (all its devices if "") moved to
// epoch e, by the reset id if one is given.
func moved(i int, src, dev string, e uint64, id string) history.Event {
	x := ev(i, src, history.OpEpoch, dev, id, 1, 1<<64-1, "")
	x.Epoch = e
	return x
}

// TestCheckEpoch: accepts are ordered by epoch first (a reset or an epoch
// statement starts the tokens over: no I1 breach), and T2 flags an accept
// of an epoch below one its fence point moved the device to, by a reset
// or by an epoch statement for all its devices — and nothing else: an
// accept before the move, a refusal after it, another fence point, an
// accept discarded as uncommitted.
func TestCheckEpoch(t *testing.T) {
	ok := []history.Event{
		inEpoch(1, "shim", "a1", 0, 3000, 1, "accepted"),
		moved(2, "shim", "dev-1", 7, "reset:r1"),
		inEpoch(3, "shim", "a2", 0, 3000, 2, "stale"),
		inEpoch(4, "shim", "b1", 7, 12, 1, "accepted"),
		func() history.Event { // another fence point (of another device), not moved
			e := inEpoch(5, "other", "x1", 0, 4000, 1, "accepted")
			e.Device = "dev-2"
			return e
		}(),
		moved(6, "shim", "", 9, ""),
		inEpoch(7, "shim", "b2", 9, 3, 1, "accepted"),
		inEpoch(8, "shim", "u1", 9, 99, 1, "accepted"), // never committed:
		func() history.Event { // the durable mark stayed at 3/1 in epoch 9
			e := ev(9, "shim", history.OpOpened, "dev-1", "", 3, 1, "")
			e.Epoch = 9
			return e
		}(),
	}
	if r := history.Check(ok); !r.OK() || r.Uncommitted != 1 {
		t.Fatalf("clean history fails:\n%s", r)
	}
	for _, tc := range []struct {
		name string
		late history.Event
		inv  string
	}{
		{"replayed before the reset", inEpoch(10, "shim", "a3", 0, 3000, 3, "accepted"), history.InvariantEpoch},
		{"of the reset's epoch after the statement", inEpoch(10, "shim", "b3", 7, 4, 1, "accepted"), history.InvariantEpoch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := history.Check(append(append([]history.Event(nil), ok...), tc.late))
			found := false
			for _, v := range r.Violations {
				found = found || v.Invariant == tc.inv && v.ID == tc.late.ID
			}
			if !found {
				t.Fatalf("want a %s violation about %s:\n%s", tc.inv, tc.late.ID, r)
			}
		})
	}
	// Without the OpEpoch lines the same late accepts are still I1
	// breaches (epoch below the last accept's), but not T2.
	r := history.Check([]history.Event{inEpoch(1, "shim", "b1", 7, 12, 1, "accepted"), inEpoch(2, "shim", "a3", 0, 3000, 3, "accepted")})
	want(t, r, history.InvariantOrder, "a3", "stale accept: token 3000/3 accepted by shim after token 12/1 in epoch 7")
}

// TestWriterRecoverEpoch: the durable mark's epoch decides which recorded
// accepts were never committed: one of a newer epoch above a durable mark
// of an older one was not; those of an older epoch below a durable mark
// of a newer one were.
func TestWriterRecoverEpoch(t *testing.T) {
	path := filepath.Join(t.TempDir(), "h.jsonl")
	w, err := history.Create(path, "shim")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for _, e := range []history.Event{
		inEpoch(1, "", "a1", 0, 3000, 1, "accepted"),
		moved(2, "", "dev-1", 7, "reset:r1"),
		inEpoch(3, "", "b1", 7, 12, 1, "accepted"),
	} {
		if err := w.Record(e); err != nil {
			t.Fatal(err)
		}
	}
	durable := func(string) (uint64, uint64, uint64, error) { return 7, 12, 1, nil }
	if err := w.Recover(durable); err != nil {
		t.Fatal(err)
	}
	if err := w.Record(inEpoch(4, "", "b2", 7, 12, 2, "accepted")); err != nil {
		t.Fatal(err)
	}
	if err := w.Recover(durable); err != nil { // b2 was not committed
		t.Fatal(err)
	}
	evs, err := history.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if r := history.Check(evs); !r.OK() || r.Uncommitted != 1 || r.FenceVerdicts["accepted"] != 2 {
		t.Fatalf("check:\n%s", r)
	}
	if last := evs[len(evs)-1]; last.Op != history.OpOpened || last.Epoch != 7 || last.Token != 12 || last.Seq != 1 {
		t.Fatalf("opened: %+v", last)
	}
}
