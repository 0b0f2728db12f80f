package shim_test

import (
	"path/filepath"
	"testing"

	"go.etcd.io/bbolt"

	"github.com/edgefence/edgefence/devices/shim"
	"github.com/edgefence/edgefence/fence"
)

// txID is the id of the shim database's last committed write transaction.
func txID(tb testing.TB, s *shim.Shim) int {
	tb.Helper()
	var id int
	if err := s.View(func(tx *bbolt.Tx) error { id = tx.ID(); return nil }); err != nil {
		tb.Fatal(err)
	}
	return id
}

// TestProcessBatchSharesOneCommit: a batch's commands are decided in
// order as Process would (a device named twice sees its first mark; stale,
// duplicate and invalid as usual) and every accept of the batch is
// committed in one transaction, durable across a reopen. Without the
// batch each accept would take a commit of its own.
func TestProcessBatchSharesOneCommit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "marks.db")
	s := open(t, path, nil)
	if r := s.Process("dev-c", envelope(t, "dev-c", 9, 1, "ok"), counter{}); r.Ack.Verdict != fence.Accepted {
		t.Fatalf("setup: %+v", r.Ack)
	}
	reqs := []shim.Request{
		{"dev-a", envelope(t, "dev-a", 5, 1, "ok")},
		{"dev-b", envelope(t, "dev-b", 5, 1, "ok")},
		{"dev-a", envelope(t, "dev-a", 5, 2, "ok")},
		{"dev-c", envelope(t, "dev-c", 3, 1, "ok")},   // below dev-c's token 9
		{"dev-b", envelope(t, "dev-b", 5, 1, "ok")},   // the second of the same command
		{"dev-d", envelope(t, "dev-x", 5, 1, "ok")},   // names another device
		{"dev-e", envelope(t, "dev-e", 6, 1, "nope")}, // the device's check refuses it
	}
	want := []fence.Verdict{fence.Accepted, fence.Accepted, fence.Accepted, fence.Stale, fence.Duplicate, fence.Invalid, fence.Invalid}
	before := txID(t, s)
	res := s.ProcessBatch(reqs, counter{})
	if got := txID(t, s) - before; got != 1 {
		t.Errorf("%d commits for the batch, want 1", got)
	}
	for i, r := range res {
		if r.Ack.Verdict != want[i] || r.Applied != (want[i] == fence.Accepted) {
			t.Errorf("command %d (%s): %v applied=%v (%s), want %v", i, reqs[i].Device, r.Ack.Verdict, r.Applied, r.Ack.Reason, want[i])
		}
	}
	if m := res[2].Ack.Mark(); m != (fence.Mark{Token: 5, Seq: 2}) {
		t.Errorf("dev-a's second ack carries %s, want 5/2", m)
	}
	if st := s.Stats(); st.Accepted != 4 || st.Stale != 1 || st.Duplicate != 1 || st.Invalid != 2 {
		t.Errorf("stats %+v", st)
	}
	s.Close()
	s = open(t, path, nil)
	for dev, m := range map[string]fence.Mark{"dev-a": {Token: 5, Seq: 2}, "dev-b": {Token: 5, Seq: 1}, "dev-c": {Token: 9, Seq: 1}} {
		if got := mark(t, s, dev); got != m {
			t.Errorf("%s: mark %s after reopen, want %s", dev, got, m)
		}
	}
	if st := counterOf(t, s, "dev-a"); st.n != 2 || st.last != (fence.Mark{Token: 5, Seq: 2}) {
		t.Errorf("dev-a's effects %+v, want 2 ending at 5/2", st)
	}
}

// TestProcessBatchEffectFails: a command whose effect fails rolls the
// batch's transaction back; the commands are then decided one by one, so
// only that one is refused and every other takes effect once.
func TestProcessBatchEffectFails(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "marks.db"), nil)
	reqs := []shim.Request{
		{"dev-a", envelope(t, "dev-a", 5, 1, "ok")},
		{"dev-b", envelope(t, "dev-b", 5, 1, "fail")},
		{"dev-c", envelope(t, "dev-c", 5, 1, "ok")},
	}
	res := s.ProcessBatch(reqs, counter{})
	for i, want := range []fence.Verdict{fence.Accepted, fence.Invalid, fence.Accepted} {
		if res[i].Ack.Verdict != want {
			t.Errorf("command %d: %v (%s), want %v", i, res[i].Ack.Verdict, res[i].Ack.Reason, want)
		}
	}
	for dev, n := range map[string]uint64{"dev-a": 1, "dev-b": 0, "dev-c": 1} {
		if st := counterOf(t, s, dev); st.n != n {
			t.Errorf("%s: %d effects, want %d", dev, st.n, n)
		}
	}
	if m := mark(t, s, "dev-b"); m != (fence.Mark{}) {
		t.Errorf("dev-b: mark %s after a failed effect, want none", m)
	}
}
