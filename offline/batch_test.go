package offline_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/offline"
)

// countCommits counts the outbox's write transactions.
func countCommits(ob *offline.Outbox) *atomic.Int64 {
	var n atomic.Int64
	ob.ObserveCommits(func(time.Duration) { n.Add(1) })
	return &n
}

// AppendAll: one commit for the batch, consecutive positions in order;
// all or none — a duplicate id (in the batch or already stored) or a
// limit refuses the whole batch and leaves the queue and its counts as
// they were.
func TestAppendAll(t *testing.T) {
	ob := open(t, dbPath(t), &offline.Options{MaxPerDevice: 6})
	commits := countCommits(ob)
	batch := func(ids ...string) []*offline.Entry {
		es := make([]*offline.Entry, len(ids))
		for i, id := range ids {
			es[i] = entry("d1", id, 5, uint64(i+1))
		}
		return es
	}
	es := batch("a", "b", "c")
	if err := ob.AppendAll(context.Background(), es); err != nil {
		t.Fatal(err)
	}
	for i, e := range es {
		if e.Pos != uint64(i+1) || len(e.Raw) == 0 || e.Deadline.IsZero() {
			t.Errorf("entry %d: pos %d raw %d deadline %v", i, e.Pos, len(e.Raw), e.Deadline)
		}
	}
	if n := commits.Load(); n != 1 {
		t.Errorf("%d commits for a batch of 3, want 1", n)
	}
	for name, tc := range map[string]struct {
		ids  []string
		want error
	}{
		"duplicate in the batch": {[]string{"x", "x"}, offline.ErrExists},
		"already stored":         {[]string{"y", "b"}, offline.ErrExists},
		"over the device limit":  {[]string{"p", "q", "r", "s"}, offline.ErrFull},
	} {
		if err := ob.AppendAll(context.Background(), batch(tc.ids...)); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
	if n, _ := ob.Pending("d1"); n != 3 {
		t.Errorf("%d pending after refused batches, want 3", n)
	}
	if err := ob.AppendAll(context.Background(), batch("d", "e", "f")); err != nil {
		t.Fatalf("a batch that fits after refusals: %v", err)
	}
	for i, want := range []string{"a", "b", "c", "d", "e", "f"} {
		e, ok, err := ob.NextAfter("d1", uint64(i))
		if err != nil || !ok || e.Envelope.ID != want || e.Pos != uint64(i+1) {
			t.Fatalf("position %d: %v %v %v, want %s", i+1, e, ok, err, want)
		}
	}
}

// ResolveAll: one commit for the acks; each gets its own error (an
// unknown id, one already terminal, an expired verdict), the others are
// recorded.
func TestResolveAll(t *testing.T) {
	ob := open(t, dbPath(t), nil)
	var es []*offline.Entry
	for i := range 4 {
		e := entry("d1", fmt.Sprintf("c%d", i), 5, uint64(i+1))
		appendOK(t, ob, e)
		es = append(es, e)
	}
	if err := ob.Resolve("c3", ack(es[3], fence.Accepted, "")); err != nil {
		t.Fatal(err)
	}
	commits := countCommits(ob)
	unknown := ack(es[0], fence.Accepted, "")
	unknown.ID = "nope"
	expired := ack(es[2], fence.Expired, "")
	acks := []*fence.Ack{ack(es[0], fence.Accepted, ""), unknown, ack(es[1], fence.Duplicate, ""), expired,
		ack(es[3], fence.Accepted, "")}
	errs := ob.ResolveAll(acks)
	want := []error{nil, offline.ErrNotFound, nil, fence.ErrInvalid, offline.ErrResolved}
	for i := range acks {
		if (want[i] == nil) != (errs[i] == nil) || want[i] != nil && !errors.Is(errs[i], want[i]) {
			t.Errorf("ack %d: %v, want %v", i, errs[i], want[i])
		}
	}
	if n := commits.Load(); n != 1 {
		t.Errorf("%d commits, want 1", n)
	}
	if n, _ := ob.Pending("d1"); n != 1 {
		t.Errorf("%d pending, want 1 (c2)", n)
	}
	for id, v := range map[string]fence.Verdict{"c0": fence.Accepted, "c1": fence.Duplicate, "c2": 0} {
		if r, err := ob.Get(id); err != nil || r.State != v {
			t.Errorf("%s: %v %v, want %v", id, r.State, err, v)
		}
	}
}
