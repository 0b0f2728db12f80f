package offline_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/offline"
)

// clock is an injectable clock for Options.Now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)} }

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }

func (c *clock) Advance(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

func dbPath(t testing.TB) string { return filepath.Join(t.TempDir(), offline.File) }

func open(t testing.TB, path string, o *offline.Options) *offline.Outbox {
	t.Helper()
	ob, err := offline.Open(path, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ob.Close() })
	return ob
}

func entry(dev, id string, tok fence.Token, seq uint64) *offline.Entry {
	return &offline.Entry{Envelope: fence.Envelope{V: fence.Version, Device: dev, Token: tok, Seq: seq, ID: id, Kind: "set"}}
}

func appendOK(t testing.TB, ob *offline.Outbox, e *offline.Entry) {
	t.Helper()
	if err := ob.Append(context.Background(), e); err != nil {
		t.Fatal(err)
	}
}

func ack(e *offline.Entry, v fence.Verdict, reason string) *fence.Ack {
	a := fence.NewAck(&e.Envelope, v, fence.Mark{Token: e.Envelope.Token, Seq: e.Envelope.Seq}, reason)
	return &a
}

func TestOrderPerDevice(t *testing.T) {
	ob := open(t, dbPath(t), nil)
	var want = map[string][]string{}
	for i := range 30 {
		dev := fmt.Sprintf("dev-%d", i%3)
		id := fmt.Sprintf("c-%02d", i)
		e := entry(dev, id, 7, uint64(i+1))
		appendOK(t, ob, e)
		if e.Pos != uint64(i/3+1) {
			t.Fatalf("%s pos %d", id, e.Pos)
		}
		want[dev] = append(want[dev], id)
	}
	if got := ob.Devices(); len(got) != 3 || got[0] != "dev-0" {
		t.Fatalf("devices %v", got)
	}
	for dev, ids := range want {
		for _, id := range ids {
			e, ok, err := ob.Next(dev)
			if err != nil || !ok || e.Envelope.ID != id {
				t.Fatalf("%s: next = %v %v %v, want %s", dev, e, ok, err, id)
			}
			if env, err := fence.UnmarshalEnvelope(e.Raw); err != nil || env.ID != id {
				t.Fatalf("raw envelope: %v %v", env, err)
			}
			if err := ob.Resolve(id, ack(e, fence.Accepted, "")); err != nil {
				t.Fatal(err)
			}
		}
		if _, ok, err := ob.Next(dev); ok || err != nil {
			t.Fatalf("%s: drained queue: %v %v", dev, ok, err)
		}
	}
	if d := ob.Devices(); len(d) != 0 {
		t.Fatalf("devices after draining: %v", d)
	}
	s, err := ob.Stats()
	if err != nil || s.Pending != 0 || s.Terminal[fence.Accepted] != 30 {
		t.Fatalf("stats %+v %v", s, err)
	}
}

func TestExactlyOneTerminalState(t *testing.T) {
	ob := open(t, dbPath(t), nil)
	e := entry("dev", "c1", 5, 1)
	appendOK(t, ob, e)
	if err := ob.Resolve("c1", ack(e, fence.Stale, "token 5 < 6")); err != nil {
		t.Fatal(err)
	}
	for _, v := range []fence.Verdict{fence.Accepted, fence.Stale, fence.Duplicate, fence.Invalid} {
		if err := ob.Resolve("c1", ack(e, v, "")); !errors.Is(err, offline.ErrResolved) {
			t.Fatalf("second resolve %v: %v", v, err)
		}
	}
	r, err := ob.Get("c1")
	if err != nil || r.State != fence.Stale || r.Reason() != "token 5 < 6" || r.Token != 5 || r.Kind != "set" {
		t.Fatalf("get: %+v %v", r, err)
	}
	for _, tc := range []struct {
		name string
		id   string
		ack  *fence.Ack
		want error
	}{
		{"unknown id", "nope", ack(entry("dev", "nope", 1, 1), fence.Accepted, ""), offline.ErrNotFound},
		{"nil ack", "c1", nil, fence.ErrInvalid},
		{"other id", "c1", ack(entry("dev", "c2", 1, 1), fence.Accepted, ""), fence.ErrInvalid},
		{"expired by ack", "c1", ack(e, fence.Expired, ""), fence.ErrInvalid},
		{"other device", "c1", ack(entry("dev2", "c1", 5, 1), fence.Accepted, ""), fence.ErrInvalid},
	} {
		if err := ob.Resolve(tc.id, tc.ack); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	if err := ob.Append(context.Background(), entry("dev", "c1", 5, 2)); !errors.Is(err, offline.ErrExists) {
		t.Fatalf("duplicate id: %v", err)
	}
}

func TestLimits(t *testing.T) {
	size := func() int64 {
		b, err := fence.MarshalEnvelope(&entry("d-0", "c-000", 1, 1).Envelope)
		if err != nil {
			t.Fatal(err)
		}
		return int64(len(b))
	}()
	for _, tc := range []struct {
		name string
		opts offline.Options
		n    int // appends that fit, round-robin over devices d-0, d-1
	}{
		{"per device count", offline.Options{MaxPerDevice: 3}, 6},
		{"per device bytes", offline.Options{MaxBytesPerDevice: 2*size + 1}, 4},
		{"total count", offline.Options{MaxTotal: 5}, 5},
		{"total bytes", offline.Options{MaxTotalBytes: 3 * size}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := dbPath(t)
			var logs bytes.Buffer
			tc.opts.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			ob := open(t, path, &tc.opts)
			i := 0
			for ; ; i++ {
				e := entry(fmt.Sprintf("d-%d", i%2), fmt.Sprintf("c-%03d", i), 1, uint64(i+1))
				err := ob.Append(context.Background(), e)
				if errors.Is(err, offline.ErrFull) {
					break
				}
				if err != nil || i > 100 {
					t.Fatal(i, err)
				}
			}
			if i != tc.n {
				t.Fatalf("%d appends fit, want %d", i, tc.n)
			}
			id := fmt.Sprintf("c-%03d", i)
			if _, err := ob.Get(id); !errors.Is(err, offline.ErrNotFound) {
				t.Fatalf("refused entry stored: %v", err)
			}
			s, _ := ob.Stats()
			if s.Pending != tc.n || s.Refused != 1 {
				t.Fatalf("stats %+v", s)
			}
			if !strings.Contains(logs.String(), "outbox full") || !strings.Contains(logs.String(), id) {
				t.Fatalf("refusal not logged: %q", logs.String())
			}
			// Limits hold across a reopen, and resolving frees room.
			ob.Close()
			ob = open(t, path, &tc.opts)
			e := entry(fmt.Sprintf("d-%d", i%2), id, 1, uint64(i+1))
			if err := ob.Append(context.Background(), e); !errors.Is(err, offline.ErrFull) {
				t.Fatalf("after reopen: %v", err)
			}
			first, ok, err := ob.Next(e.Envelope.Device)
			if !ok || err != nil {
				t.Fatal(ok, err)
			}
			if err := ob.Resolve(first.Envelope.ID, ack(first, fence.Accepted, "")); err != nil {
				t.Fatal(err)
			}
			appendOK(t, ob, e)
		})
	}
}

func TestExpireAndCompact(t *testing.T) {
	clk := newClock()
	ob := open(t, dbPath(t), &offline.Options{Now: clk.Now, TTL: time.Minute, Retention: time.Hour})
	a, b := entry("dev", "a", 1, 1), entry("dev", "b", 1, 2)
	b.TTL = 10 * time.Minute
	appendOK(t, ob, a)
	appendOK(t, ob, b)
	clk.Advance(59 * time.Second)
	if n, err := ob.ExpireDue(); n != 0 || err != nil {
		t.Fatal(n, err)
	}
	clk.Advance(time.Second)
	if n, err := ob.ExpireDue(); n != 1 || err != nil {
		t.Fatal(n, err)
	}
	r, err := ob.Get("a")
	if err != nil || r.State != fence.Expired || r.Ack != nil || r.Age != time.Minute || !r.Resolved.Equal(clk.Now()) {
		t.Fatalf("a: %+v %v", r, err)
	}
	if err := ob.Resolve("a", ack(a, fence.Accepted, "")); !errors.Is(err, offline.ErrResolved) {
		t.Fatalf("resolve expired: %v", err)
	}
	if e, ok, _ := ob.Next("dev"); !ok || e.Envelope.ID != "b" {
		t.Fatalf("next after expiry: %v", e)
	}
	clk.Advance(time.Hour - time.Second)
	if n, err := ob.Compact(); n != 0 || err != nil {
		t.Fatal(n, err)
	}
	if _, err := ob.Get("a"); err != nil {
		t.Fatal("compacted before retention:", err)
	}
	clk.Advance(time.Second)
	if n, err := ob.Compact(); n != 1 || err != nil {
		t.Fatal(n, err)
	}
	if _, err := ob.Get("a"); !errors.Is(err, offline.ErrNotFound) {
		t.Fatal(err)
	}
	// b expired long ago too, but pending entries are never compacted.
	if r, err := ob.Get("b"); err != nil || !r.Pending() {
		t.Fatalf("b: %+v %v", r, err)
	}
	if n, err := ob.ExpireDue(); n != 1 || err != nil {
		t.Fatal(n, err)
	}
	s, _ := ob.Stats()
	if s.Pending != 0 || s.Terminal[fence.Expired] != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestReopenKeepsEverything(t *testing.T) {
	clk := newClock()
	path := dbPath(t)
	opts := &offline.Options{Now: clk.Now}
	ob := open(t, path, opts)
	var es []*offline.Entry
	for i := range 10 {
		e := entry("dev", fmt.Sprintf("c%d", i), 9, uint64(i+1))
		e.Envelope.Body, _ = fence.EncodeBody(map[string]int{"v": i})
		appendOK(t, ob, e)
		es = append(es, e)
	}
	if err := ob.Resolve("c0", ack(es[0], fence.Duplicate, "seen")); err != nil {
		t.Fatal(err)
	}
	before, err := ob.List(offline.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	ob.Close()
	ob = open(t, path, opts)
	after, err := ob.List(offline.Filter{})
	if err != nil || !reflect.DeepEqual(before, after) {
		t.Fatalf("after reopen:\n%v\nbefore:\n%v %v", after, before, err)
	}
	if n, _ := ob.Pending("dev"); n != 9 {
		t.Fatalf("pending %d", n)
	}
	e, ok, err := ob.Next("dev")
	if err != nil || !ok || e.Envelope.ID != "c1" || string(e.Raw) != string(es[1].Raw) {
		t.Fatalf("next %v %v %v", e, ok, err)
	}
	// Positions continue after the last one, never reused.
	e = entry("dev", "c10", 9, 11)
	appendOK(t, ob, e)
	if e.Pos != 11 {
		t.Fatalf("pos %d", e.Pos)
	}
	pend, _ := ob.List(offline.Filter{Device: "dev", PendingOnly: true})
	if len(pend) != 10 || pend[0].ID != "c1" || pend[9].ID != "c10" {
		t.Fatalf("pending list %v", pend)
	}
}

func TestLocked(t *testing.T) {
	path := dbPath(t)
	open(t, path, nil)
	start := time.Now()
	_, err := offline.Open(path, &offline.Options{Timeout: 50 * time.Millisecond})
	if !errors.Is(err, offline.ErrLocked) {
		t.Fatalf("second open: %v", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatal("second open did not time out promptly")
	}
}

func TestClosed(t *testing.T) {
	ob := open(t, dbPath(t), nil)
	ob.Close()
	if err := ob.Append(context.Background(), entry("d", "c", 1, 1)); !errors.Is(err, offline.ErrClosed) {
		t.Fatal(err)
	}
	if _, _, err := ob.Next("d"); !errors.Is(err, offline.ErrClosed) {
		t.Fatal(err)
	}
	if err := ob.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestInvalidEnvelopeRefused(t *testing.T) {
	ob := open(t, dbPath(t), nil)
	if err := ob.Append(context.Background(), entry("d", "c", 0, 1)); !errors.Is(err, fence.ErrInvalid) {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := ob.Append(ctx, entry("d", "c", 1, 1)); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}

// TestCorruptRecord flips bits in stored records: every read reports
// ErrCorrupt, nothing panics, the damaged device's queue stops (fail
// closed) and other devices are served.
func TestCorruptRecord(t *testing.T) {
	path := dbPath(t)
	ob := open(t, path, nil)
	appendOK(t, ob, entry("bad", "b1", 1, 1))
	appendOK(t, ob, entry("bad", "b2", 1, 2))
	appendOK(t, ob, entry("good", "g1", 1, 1))
	ob.Close()

	for off := range 200 {
		db, err := bbolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		var done bool
		err = db.Update(func(tx *bbolt.Tx) error {
			b := tx.Bucket([]byte("outbox.entries"))
			v := append([]byte(nil), b.Get([]byte("b1"))...)
			if off >= len(v) {
				done = true
				return nil
			}
			v[off] ^= 0x40
			return b.Put([]byte("b1"), v)
		})
		db.Close()
		if err != nil {
			t.Fatal(err)
		}
		if done {
			break
		}
		ob := open(t, path, nil)
		if _, err := ob.Get("b1"); !errors.Is(err, offline.ErrCorrupt) {
			t.Fatalf("offset %d: get: %v", off, err)
		}
		if _, _, err := ob.Next("bad"); !errors.Is(err, offline.ErrCorrupt) {
			t.Fatalf("offset %d: next: %v", off, err)
		}
		if err := ob.Resolve("b1", ack(entry("bad", "b1", 1, 1), fence.Accepted, "")); !errors.Is(err, offline.ErrCorrupt) {
			t.Fatalf("offset %d: resolve: %v", off, err)
		}
		if e, ok, err := ob.Next("good"); err != nil || !ok || e.Envelope.ID != "g1" {
			t.Fatalf("offset %d: good device: %v %v", off, ok, err)
		}
		if recs, err := ob.List(offline.Filter{}); !errors.Is(err, offline.ErrCorrupt) || len(recs) != 2 {
			t.Fatalf("offset %d: list: %d %v", off, len(recs), err)
		}
		if s, err := ob.Stats(); err != nil || s.Corrupt != 1 || s.Pending != 3 {
			t.Fatalf("offset %d: stats %+v %v", off, s, err)
		}
		if _, err := ob.ExpireDue(); err != nil && !errors.Is(err, offline.ErrCorrupt) {
			t.Fatalf("offset %d: expire: %v", off, err)
		}
		ob.Close()
		// restore the byte for the next offset
		db, _ = bbolt.Open(path, 0o600, nil)
		db.Update(func(tx *bbolt.Tx) error {
			b := tx.Bucket([]byte("outbox.entries"))
			v := append([]byte(nil), b.Get([]byte("b1"))...)
			v[off] ^= 0x40
			return b.Put([]byte("b1"), v)
		})
		db.Close()
	}
}

// TestConcurrentAppends appends from several goroutines to the same
// devices: positions per device are 1..n without gap, and Next order
// follows them.
func TestConcurrentAppends(t *testing.T) {
	ob := open(t, dbPath(t), nil)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 24 {
				e := entry(fmt.Sprintf("dev-%d", i%2), fmt.Sprintf("g%d-%d", g, i), 1, uint64(i+1))
				if err := ob.Append(context.Background(), e); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	for _, dev := range []string{"dev-0", "dev-1"} {
		recs, err := ob.List(offline.Filter{Device: dev, PendingOnly: true})
		if err != nil || len(recs) != 48 {
			t.Fatalf("%s: %d %v", dev, len(recs), err)
		}
		for i, r := range recs {
			if r.Pos != uint64(i+1) {
				t.Fatalf("%s: position %d at %d", dev, r.Pos, i)
			}
		}
		if e, _, _ := ob.Next(dev); e.Envelope.ID != recs[0].ID {
			t.Fatalf("%s: next %s, want %s", dev, e.Envelope.ID, recs[0].ID)
		}
	}
}

// TestExpireFloor: an expiry pass before the earliest pending deadline the
// outbox knows of reads nothing, and that floor never passes a pending
// entry's deadline: an entry appended already due (an old Created), an
// entry kept past its deadline and let go, and the entries found pending
// when the file is opened again all expire on the next pass.
func TestExpireFloor(t *testing.T) {
	clk := newClock()
	path := dbPath(t)
	opts := &offline.Options{Now: clk.Now, TTL: time.Minute}
	ob := open(t, path, opts)
	a := entry("dev", "a", 1, 1)
	appendOK(t, ob, a)
	clk.Advance(30 * time.Second)
	if n, err := ob.ExpireDue(); n != 0 || err != nil { // floor: a's deadline, 30 s away
		t.Fatal(n, err)
	}
	old := entry("dev2", "old", 1, 1)
	old.Created = clk.Now().Add(-2 * time.Minute) // due 1 min ago
	appendOK(t, ob, old)
	if ended, err := ob.ExpireEntries(nil); len(ended) != 1 || ended[0].ID != "old" || err != nil {
		t.Fatalf("an entry appended already due: ended %v, %v", ended, err)
	}
	clk.Advance(30 * time.Second)
	keepA := func(_, id string) bool { return id == "a" }
	if ended, err := ob.ExpireEntries(keepA); len(ended) != 0 || err != nil {
		t.Fatal(ended, err)
	}
	if ended, err := ob.ExpireEntries(nil); len(ended) != 1 || ended[0].ID != "a" || err != nil {
		t.Fatalf("an entry kept past its deadline, then let go: ended %v, %v", ended, err)
	}
	appendOK(t, ob, entry("dev", "c", 1, 2))
	if err := ob.Close(); err != nil {
		t.Fatal(err)
	}
	ob = open(t, path, opts)
	clk.Advance(time.Minute)
	if ended, err := ob.ExpireEntries(nil); len(ended) != 1 || ended[0].ID != "c" || err != nil {
		t.Fatalf("an entry pending when the file was opened: ended %v, %v", ended, err)
	}
	if n, err := ob.ExpireDue(); n != 0 || err != nil {
		t.Fatal(n, err)
	}
}

// TestExpireNothingDueNoCommit: an expiry pass that finds nothing due (or
// only entries keep keeps) commits nothing — no fdatasync a second while
// the agent idles — and one that finds a due entry commits once.
func TestExpireNothingDueNoCommit(t *testing.T) {
	clk := newClock()
	ob := open(t, dbPath(t), &offline.Options{Now: clk.Now, TTL: time.Minute})
	var commits atomic.Int64
	ob.ObserveCommits(func(time.Duration) { commits.Add(1) })
	a, b := entry("dev", "a", 1, 1), entry("dev", "b", 1, 2)
	appendOK(t, ob, a)
	appendOK(t, ob, b)
	base := commits.Load()
	for range 3 {
		if n, err := ob.ExpireDue(); n != 0 || err != nil {
			t.Fatal(n, err)
		}
	}
	clk.Advance(time.Minute)
	keepAll := func(string, string) bool { return true }
	if ended, err := ob.ExpireEntries(keepAll); len(ended) != 0 || err != nil {
		t.Fatal(ended, err)
	}
	if c := commits.Load() - base; c != 0 {
		t.Fatalf("%d commits by expiry passes with nothing to expire, want 0", c)
	}
	keepA := func(_, id string) bool { return id == "a" }
	if ended, err := ob.ExpireEntries(keepA); len(ended) != 1 || ended[0].ID != "b" || err != nil {
		t.Fatal(ended, err)
	}
	if c := commits.Load() - base; c != 1 {
		t.Fatalf("%d commits after expiring one entry, want 1", c)
	}
	if r, err := ob.Get("a"); err != nil || !r.Pending() {
		t.Fatalf("a (kept): %+v %v", r, err)
	}
}

// TestCompactMaxEnded: over MaxEnded terminal entries, Compact deletes the
// oldest before their retention (a batch a transaction), never a pending
// entry; the count is exact again after a reopen, and retention still
// applies under the cap.
func TestCompactMaxEnded(t *testing.T) {
	clk := newClock()
	path := dbPath(t)
	o := &offline.Options{Now: clk.Now, Retention: time.Hour, MaxEnded: 10}
	ob := open(t, path, o)
	offline.SetCompactBatch(ob, 8)
	pending := entry("dev", "pending", 1, 1)
	appendOK(t, ob, pending)
	var ids []string
	for i := range 25 {
		e := entry("dev", fmt.Sprintf("c%02d", i), 1, uint64(i+2))
		appendOK(t, ob, e)
		if err := ob.Resolve(e.Envelope.ID, ack(e, fence.Accepted, "")); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, e.Envelope.ID)
		clk.Advance(time.Second) // each resolved a second after the one before
	}
	if got := ob.Ended(); got != 25 || !ob.EndedOver() {
		t.Fatalf("Ended() = %d, over %v; want 25, true", got, ob.EndedOver())
	}
	var commits atomic.Int32
	ob.ObserveCommits(func(time.Duration) { commits.Add(1) })
	deleted, err := ob.Compact() // in batches of 8: two transactions
	if err != nil || commits.Load() != 2 {
		t.Fatalf("Compact: %v, %d commits; want 2 (batches of 8)", err, commits.Load())
	}
	ob.ObserveCommits(nil)
	if deleted != 15 || ob.Ended() != 10 {
		t.Fatalf("deleted %d, Ended() %d; want 15 and 10", deleted, ob.Ended())
	}
	for i, id := range ids {
		_, err := ob.Get(id)
		if gone := errors.Is(err, offline.ErrNotFound); gone != (i < 15) {
			t.Errorf("%s (ended %d of 25): gone %v (%v)", id, i+1, gone, err)
		}
	}
	if r, err := ob.Get("pending"); err != nil || !r.Pending() {
		t.Fatalf("the pending entry: %+v %v", r, err)
	}
	// Exact again after a reopen: one more end puts it over.
	if err := ob.Close(); err != nil {
		t.Fatal(err)
	}
	ob = open(t, path, o)
	if ob.Ended() != 10 || ob.EndedOver() {
		t.Fatalf("after reopen: Ended() = %d, over %v", ob.Ended(), ob.EndedOver())
	}
	if err := ob.Resolve("pending", ack(pending, fence.Accepted, "")); err != nil {
		t.Fatal(err)
	}
	if !ob.EndedOver() {
		t.Fatal("11 ended, cap 10: not over")
	}
	if n, err := ob.Compact(); n != 1 || err != nil {
		t.Fatalf("Compact = %d, %v; want 1", n, err)
	}
	// Under the cap, retention: the 10 left are c16..c24 and "pending",
	// the clock 25 s after c00 ended.
	clk.Advance(time.Hour - 9*time.Second)
	if n, err := ob.Compact(); n != 1 || err != nil { // c16 ended an hour ago
		t.Fatalf("Compact by retention = %d, %v; want 1", n, err)
	}
	if ob.Ended() != 9 {
		t.Fatalf("Ended() = %d, want 9", ob.Ended())
	}
}
