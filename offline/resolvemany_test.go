package offline_test

import (
	"errors"
	"testing"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/offline"
)

// ResolveMany records every ack it can in one commit and refuses the rest
// one by one, as Resolve would, without touching their entries.
func TestResolveMany(t *testing.T) {
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
	expired := ack(b1, fence.Accepted, "")
	expired.Verdict = fence.Expired
	acks := []*fence.Ack{
		ack(a1, fence.Accepted, ""),
		ack(b1, fence.Stale, "token 3 below 4"),
		ack(a1, fence.Duplicate, ""), // a1 again, in the same call
		ack(b2, fence.Accepted, ""),  // resolved before
		ack(entry("dev-a", "zz", 3, 9), fence.Accepted, ""),
		wrongDev,
		expired,
		nil,
	}
	errs, err := ob.ResolveMany(acks)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []error{nil, nil, offline.ErrResolved, offline.ErrResolved, offline.ErrNotFound, fence.ErrInvalid, fence.ErrInvalid, fence.ErrInvalid} {
		if (want == nil) != (errs[i] == nil) || (want != nil && !errors.Is(errs[i], want)) {
			t.Errorf("ack %d: %v, want %v", i, errs[i], want)
		}
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

	ro := open(t, path, &offline.Options{ReadOnly: true})
	if _, err := ro.ResolveMany([]*fence.Ack{ack(a2, fence.Accepted, "")}); !errors.Is(err, offline.ErrReadOnly) {
		t.Errorf("read-only: %v", err)
	}
}
