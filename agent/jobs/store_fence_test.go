package jobs_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/edgefence/edgefence/agent/jobs"
)

// TestStoreFencedWrites: a holder whose lock key was deleted, or deleted
// and taken again by another holder, writes nothing (I5).
func TestStoreFencedWrites(t *testing.T) {
	st, cli := newStore(t)
	ctx := ctxT(t)
	if _, _, err := st.Create(ctx, testJob("fw-1", "dev-1", "dev-2")); err != nil {
		t.Fatal(err)
	}
	old := lockDevice(t, cli, st, "dev-1", "gw-a")
	e, err := st.Queue(ctx, "dev-1", "fw-1", old.Holder)
	if err != nil {
		t.Fatal(err)
	}
	if e, err = st.Start(ctx, e, old.Holder); err != nil {
		t.Fatal(err)
	}
	// Deposed: the lock key is gone (lease expired, session closed).
	if _, err := cli.Delete(ctx, old.LockKey); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, cli, st)
	checkFenced := func(when string) {
		t.Helper()
		e2 := e
		e2.Bytes = 999
		if _, err := st.Update(ctx, e2, old.Holder); !errors.Is(err, jobs.ErrFenced) || !strings.Contains(err.Error(), old.LockKey) {
			t.Errorf("%s: Update: %v, want ErrFenced naming %s", when, err, old.LockKey)
		}
		if _, _, err := st.Finish(ctx, e, jobs.Succeeded, "", old.Holder); !errors.Is(err, jobs.ErrFenced) {
			t.Errorf("%s: Finish: %v, want ErrFenced", when, err)
		}
		if _, err := st.Queue(ctx, "dev-2", "fw-1", jobs.Holder{Gateway: "gw-a", LockKey: st.LockPrefix("dev-2") + "/x", Token: old.Token}); !errors.Is(err, jobs.ErrFenced) {
			t.Errorf("%s: Queue under a lock key that does not exist: %v, want ErrFenced", when, err)
		}
	}
	checkFenced("lock key deleted")
	if after := snapshot(t, cli, st); after != before {
		t.Fatalf("a fenced write changed etcd:\n%s\nwas\n%s", after, before)
	}
	// Recreated under the same key name by a new holder: a new CreateRevision.
	if _, err := cli.Put(ctx, old.LockKey, ""); err != nil {
		t.Fatal(err)
	}
	before = snapshot(t, cli, st)
	checkFenced("lock key recreated")
	if after := snapshot(t, cli, st); after != before {
		t.Fatalf("a fenced write changed etcd:\n%s\nwas\n%s", after, before)
	}
	// The new holder takes the execution over under its own token.
	cur, err := st.Execution(ctx, "dev-1", "fw-1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Delete(ctx, old.LockKey); err != nil {
		t.Fatal(err)
	}
	nh := lockDevice(t, cli, st, "dev-1", "gw-b").Holder
	cur.Bytes = 500
	if cur, err = st.Update(ctx, cur, nh); err != nil || cur.Gateway != "gw-b" || cur.Token != nh.Token {
		t.Fatalf("new holder's Update: %+v %v", cur, err)
	}
}

func TestStoreRefusesBadHolder(t *testing.T) {
	st, cli := newStore(t)
	ctx := ctxT(t)
	if _, _, err := st.Create(ctx, testJob("fw-1", "dev-1")); err != nil {
		t.Fatal(err)
	}
	h := lockDevice(t, cli, st, "dev-1", "gw-a").Holder
	other := lockDevice(t, cli, st, "dev-2", "gw-a").Holder
	for name, bad := range map[string]jobs.Holder{
		"token 0":           {Gateway: "gw-a", LockKey: h.LockKey},
		"another's lock":    other,
		"prefix itself":     {Gateway: "gw-a", LockKey: st.LockPrefix("dev-1"), Token: h.Token},
		"token past int64":  {Gateway: "gw-a", LockKey: h.LockKey, Token: 1 << 63},
		"lock of dev-10":    {Gateway: "gw-a", LockKey: st.LockPrefix("dev-10") + "/1", Token: h.Token},
		"outside the store": {Gateway: "gw-a", LockKey: "/elsewhere/devices/dev-1/lock/1", Token: h.Token},
	} {
		if _, err := st.Queue(ctx, "dev-1", "fw-1", bad); !errors.Is(err, jobs.ErrInvalidJob) {
			t.Errorf("%s: %v, want ErrInvalidJob", name, err)
		}
	}
	if _, err := st.Queue(ctx, "dev 1", "fw-1", h); !errors.Is(err, jobs.ErrInvalidJob) {
		t.Errorf("bad device id: %v", err)
	}
	if _, err := st.Queue(ctx, "dev-1", "nope", h); !errors.Is(err, jobs.ErrNoJob) {
		t.Errorf("unknown job: %v", err)
	}
	if e, err := st.Execution(ctx, "dev-1", "fw-1"); err != nil || e.Rev != 0 {
		t.Fatalf("a refused Queue wrote %+v (%v)", e, err)
	}
}

// TestStoreStartConflict: a Start or Finish from a stale read of the
// execution is ErrConflict and writes nothing.
func TestStoreStartConflict(t *testing.T) {
	st, cli := newStore(t)
	ctx := ctxT(t)
	if _, _, err := st.Create(ctx, testJob("fw-1", "dev-1")); err != nil {
		t.Fatal(err)
	}
	h := lockDevice(t, cli, st, "dev-1", "gw-a").Holder
	q, err := st.Queue(ctx, "dev-1", "fw-1", h)
	if err != nil {
		t.Fatal(err)
	}
	started, err := st.Start(ctx, q, h)
	if err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, cli, st)
	if _, err := st.Start(ctx, q, h); !errors.Is(err, jobs.ErrConflict) {
		t.Fatalf("second Start from the queued read: %v, want ErrConflict", err)
	}
	if after := snapshot(t, cli, st); after != before {
		t.Fatalf("a conflicting Start changed etcd:\n%s\nwas\n%s", after, before)
	}
	upd := started
	upd.Step = "downloading"
	if _, err := st.Update(ctx, upd, h); err != nil {
		t.Fatal(err)
	}
	before = snapshot(t, cli, st)
	if _, _, err := st.Finish(ctx, started, jobs.Failed, "x", h); !errors.Is(err, jobs.ErrConflict) {
		t.Fatalf("Finish from a stale read: %v, want ErrConflict", err)
	}
	if after := snapshot(t, cli, st); after != before {
		t.Fatalf("a conflicting Finish changed etcd:\n%s\nwas\n%s", after, before)
	}
	r, err := st.Rollout(ctx, "fw-1")
	if err != nil || r.Counts[jobs.InProgress] != 1 || r.Counts[jobs.Queued] != 0 || r.Started != 1 {
		t.Fatalf("rollout after the conflicts: %+v %v", r, err)
	}
}
