package fence

import (
	"errors"
	"path/filepath"
	"testing"

	"go.etcd.io/bbolt"

	"github.com/edgefence/edgefence/internal/groupcommit"
)

// An admit's transaction function may run more than once: after a
// rollback, in a fresh transaction (a failed group is rerun one call at a
// time), which is replayed here step by step; and, should bbolt ever
// do it, twice in the same transaction. Each caller must get the verdict of
// the run that committed, and the table must hold exactly that.
func TestAdmitCallIdempotent(t *testing.T) {
	tab, err := OpenTable(filepath.Join(t.TempDir(), TableFile), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tab.Close()
	env := func(tok Token, seq uint64) *Envelope {
		return &Envelope{V: Version, Device: "dev-1", Token: tok, Seq: seq, ID: "c", Kind: "set"}
	}
	a := newAdmitCall(env(5, 1), 0, 1000)
	b := newAdmitCall(env(5, 1), 0, 2000) // the same command, redelivered into the same group
	c := newAdmitCall(env(4, 9), 0, 3000) // an older holder

	// First attempt: the group is rolled back (another member failed).
	tx, err := tab.db.Begin(true)
	if err != nil {
		t.Fatal(err)
	}
	for _, call := range []*admitCall{a, b, c} {
		if err := call.run(tx); err != nil {
			t.Fatal(err)
		}
	}
	if a.v != Accepted || b.v != Duplicate || c.v != Stale {
		t.Fatalf("first attempt: %v %v %v", a.v, b.v, c.v)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}

	// A rerun in another order (calls rerun alone may commit in any
	// order relative to each other): b now runs first.
	if err := tab.db.Update(func(tx *bbolt.Tx) error {
		for _, call := range []*admitCall{b, a, c, a, b} { // a and b twice in one tx
			if err := call.run(tx); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if b.v != Accepted || a.v != Duplicate || c.v != Stale {
		t.Fatalf("committed run: a %v, b %v, c %v; want b accepted, a duplicate, c stale", a.v, b.v, c.v)
	}
	r, found, err := tab.Get("dev-1")
	if err != nil || !found || r.Mark != (Mark{Token: 5, Seq: 1}) || r.At.UnixMilli() != 2000 {
		t.Fatalf("stored %+v %v %v; want 5/1 written by b (at 2000)", r, found, err)
	}
}

// A group whose transaction fails (here: a member's record is corrupt) is
// rolled back and every call rerun alone: only the bad call fails, and the
// others get the verdicts that were committed, decided in enqueue order.
func TestCommitGroupRerunsAlone(t *testing.T) {
	tab, err := OpenTable(filepath.Join(t.TempDir(), TableFile), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tab.Close()
	if err := tab.db.Update(func(tx *bbolt.Tx) error {
		return tx.Bucket(tableBucket).Put([]byte("dev-bad"), []byte("corrupt"))
	}); err != nil {
		t.Fatal(err)
	}
	env := func(dev string, tok Token, seq uint64) *Envelope {
		return &Envelope{V: Version, Device: dev, Token: tok, Seq: seq, ID: "c", Kind: "set"}
	}
	calls := []*admitCall{
		newAdmitCall(env("dev-1", 5, 1), 0, 1),
		newAdmitCall(env("dev-1", 5, 1), 0, 2), // the same command: duplicate of the first
		newAdmitCall(env("dev-bad", 5, 1), 0, 3),
		newAdmitCall(env("dev-1", 4, 9), 0, 4), // an older holder
		newAdmitCall(env("dev-2", 1, 1), 0, 5),
	}
	errs := groupcommit.CommitAll(tab.update, asGroup(calls))
	want := []Verdict{Accepted, Duplicate, 0, Stale, Accepted}
	for i, c := range calls {
		if bad := i == 2; bad != errors.Is(errs[i], ErrTableCorrupt) || !bad && (errs[i] != nil || c.v != want[i]) {
			t.Errorf("call %d: %v %v, want %v", i, c.v, errs[i], want[i])
		}
	}
	for dev, m := range map[string]Mark{"dev-1": {Token: 5, Seq: 1}, "dev-2": {Token: 1, Seq: 1}} {
		if r, found, err := tab.Get(dev); err != nil || !found || r.Mark != m {
			t.Errorf("%s: stored %+v %v %v, want %v", dev, r, found, err, m)
		}
	}

	// A group that commits: same-device calls decide in enqueue order.
	calls = []*admitCall{
		newAdmitCall(env("dev-3", 2, 1), 0, 1),
		newAdmitCall(env("dev-3", 2, 2), 0, 2),
		newAdmitCall(env("dev-3", 2, 1), 0, 3),
		newAdmitCall(env("dev-3", 3, 1), 0, 4),
		newAdmitCall(env("dev-3", 2, 3), 0, 5),
	}
	errs = groupcommit.CommitAll(tab.update, asGroup(calls))
	want = []Verdict{Accepted, Accepted, Duplicate, Accepted, Stale}
	for i, c := range calls {
		if errs[i] != nil || c.v != want[i] {
			t.Errorf("dev-3 call %d: %v %v, want %v", i, c.v, errs[i], want[i])
		}
	}
}

func asGroup(calls []*admitCall) []groupcommit.Call {
	g := make([]groupcommit.Call, len(calls))
	for i, c := range calls {
		g[i] = c.run
	}
	return g
}
