package offline_test

import (
	"errors"
	"sync"
	"testing"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/offline"
)

// Concurrent Resolve calls share commits (group commit) and each gets its
// own outcome, as alone: the good acks are recorded durably, the bad ones
// are refused without touching their entries, and one bad call does not
// fail its group's others.
func TestResolveConcurrent(t *testing.T) {
	path := dbPath(t)
	ob := open(t, path, nil)
	a1, a2, b1, b2 := entry("dev-a", "a1", 3, 1), entry("dev-a", "a2", 3, 2), entry("dev-b", "b1", 3, 1), entry("dev-b", "b2", 3, 2)
	for _, e := range []*offline.Entry{a1, a2, b1, b2} {
		appendOK(t, ob, e)
	}
	if err := ob.Resolve("b2", ack(b2, fence.Accepted, "")); err != nil {
		t.Fatal(err)
	}
	wrongDev := ack(a2, fence.Accepted, "")
	wrongDev.Device = "dev-b"
	calls := []struct {
		id   string
		ack  *fence.Ack
		want error
	}{
		{"b1", ack(b1, fence.Stale, "token 3 below 4"), nil},
		{"b2", ack(b2, fence.Accepted, ""), offline.ErrResolved}, // resolved before
		{"zz", ack(entry("dev-a", "zz", 3, 9), fence.Accepted, ""), offline.ErrNotFound},
		{"a2", wrongDev, fence.ErrInvalid},
	}
	errs := make([]error, len(calls))
	var a1errs [2]error // a1 twice at once: exactly one wins
	var wg sync.WaitGroup
	for i, c := range calls {
		wg.Go(func() { errs[i] = ob.Resolve(c.id, c.ack) })
	}
	for i := range a1errs {
		wg.Go(func() { a1errs[i] = ob.Resolve("a1", ack(a1, fence.Accepted, "")) })
	}
	wg.Wait()
	for i, c := range calls {
		if (c.want == nil) != (errs[i] == nil) || (c.want != nil && !errors.Is(errs[i], c.want)) {
			t.Errorf("%s: %v, want %v", c.id, errs[i], c.want)
		}
	}
	if n := countNil(a1errs[:]); n != 1 || !errors.Is(errors.Join(a1errs[:]...), offline.ErrResolved) {
		t.Errorf("a1 twice: %v", a1errs)
	}
	ob.Close()

	ob = open(t, path, nil) // durable
	for id, want := range map[string]fence.Verdict{"a1": fence.Accepted, "a2": 0, "b1": fence.Stale, "b2": fence.Accepted} {
		if r, err := ob.Get(id); err != nil || r.State != want {
			t.Errorf("%s: %v %v, want %v", id, r.State, err, want)
		}
	}
	if n, _ := ob.Pending("dev-a"); n != 1 {
		t.Errorf("dev-a: %d pending", n)
	}
	if n, _ := ob.Pending("dev-b"); n != 0 {
		t.Errorf("dev-b: %d pending", n)
	}
	if e, ok, err := ob.Next("dev-a"); err != nil || !ok || e.Envelope.ID != "a2" {
		t.Errorf("next of dev-a: %+v %v %v", e, ok, err)
	}
	ob.Close()
	if err := ob.Resolve("a2", ack(a2, fence.Accepted, "")); !errors.Is(err, offline.ErrClosed) {
		t.Errorf("closed: %v", err)
	}
}

func countNil(errs []error) int {
	n := 0
	for _, err := range errs {
		if err == nil {
			n++
		}
	}
	return n
}
