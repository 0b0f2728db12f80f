package agent

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/offline"
)

// TestVerdictsRecordedInBatches: a deep queue (a replay after an outage)
// is delivered one command at a time, in order, each applied once, while
// its verdicts are recorded several to a commit (verdictBatch), not one
// fsync each; every command still ends with exactly its own verdict, and
// a lone command afterwards is recorded at once (its Send returns).
func TestVerdictsRecordedInBatches(t *testing.T) {
	prefix := "/t/" + t.Name()
	g := &gate{fp: newFencePoint()}
	ob := openOutbox(t, filepath.Join(t.TempDir(), offline.File), nil)
	a := startOutboxAgent(t, "gw-a", prefix, devCfgs("d1"), g, ob)
	waitFor(t, "a holds", holdingAll(a, []string{"d1"}))
	g.down.Store(true)
	const n = 64
	for i := range n {
		if _, err := a.Enqueue(context.Background(), "d1", "set", []byte{0x18, byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	var commits atomic.Int64
	ob.ObserveCommits(func(time.Duration) { commits.Add(1) })
	g.down.Store(false)
	waitFor(t, "outbox drained", pendingZero(ob))
	got := g.fp.appliedOf("d1")
	if len(got) != n {
		t.Fatalf("applied %d, want %d", len(got), n)
	}
	for i, e := range got {
		if e.Seq != uint64(i+1) || e.Body[1] != byte(i) { // CBOR uint8 i
			t.Fatalf("applied #%d is seq %d body %v", i, e.Seq, e.Body)
		}
	}
	c := commits.Load()
	t.Logf("%d verdicts recorded in %d commits", n, c)
	if c > n/4 { // one commit per verdict before batching: 64
		t.Errorf("%d commits for %d verdicts: not batched (want about %d)", c, n, n/verdictBatch)
	}
	recs, err := ob.List(offline.Filter{Device: "d1"})
	if err != nil || len(recs) != n {
		t.Fatalf("records %d %v", len(recs), err)
	}
	for _, r := range recs {
		if r.State != fence.Accepted || r.Ack == nil || r.Ack.ID != r.ID {
			t.Fatalf("seq %d: state %v ack %+v", r.Seq, r.State, r.Ack)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if ack, err := a.Send(ctx, "d1", "set", []byte{0x18, 0xff}); err != nil || ack.Verdict != fence.Accepted {
		t.Fatalf("a lone command: %v %v", ack, err)
	}
}

// TestFailedVerdictRecordKeepsEntriesFromExpiry: the device answered
// three commands and the outbox cannot record their verdicts (here: it
// is closed); the entries stay pending, and in the device's recording set
// — the batch that failed and the verdict dropped behind it — so that
// expiry never ends a command the device has decided as expired.
func TestFailedVerdictRecordKeepsEntriesFromExpiry(t *testing.T) {
	ob := openOutbox(t, filepath.Join(t.TempDir(), offline.File), nil)
	q, d, es := verdictRig(t, ob, 3)
	w := &worker{d: d}
	for _, e := range es[:2] {
		if !q.queueVerdict(w, e, ack(e)) {
			t.Fatal("queued verdict refused")
		}
	}
	if err := ob.Close(); err != nil {
		t.Fatal(err)
	}
	q.startRecord(w) // c0, c1: fails, the outbox is closed
	if !q.queueVerdict(w, es[2], ack(es[2])) {
		t.Fatal("queued verdict refused")
	}
	if q.flush(w) {
		t.Fatal("flush reported the verdicts recorded")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, e := range es {
		if _, ok := d.recording[e.Envelope.ID]; !ok {
			t.Errorf("%s: answered by the device, not recorded, and no longer kept from expiry", e.Envelope.ID)
		}
	}
	if len(w.unrecorded) != 0 || w.recording != nil {
		t.Errorf("worker still holds verdicts: %d unrecorded, recording %v", len(w.unrecorded), w.recording != nil)
	}
}

// verdictRig is a delivery for one device d1 over ob, without a Sender,
// and n entries appended for it (c0, c1, …; token 5).
func verdictRig(t *testing.T, ob *offline.Outbox, n int) (*delivery, *device, []*offline.Entry) {
	t.Helper()
	d := &device{id: "d1", sem: make(chan struct{}, 1)}
	q := &delivery{outbox: ob, log: slog.New(slog.DiscardHandler), devices: map[string]*device{"d1": d},
		waiters: map[string]waiter{}, now: time.Now}
	var es []*offline.Entry
	for i := range n {
		e := &offline.Entry{Envelope: fence.Envelope{V: fence.Version, Device: "d1", Token: 5, Seq: uint64(i + 1),
			ID: fmt.Sprintf("c%d", i), Kind: "set"}}
		if err := ob.Append(context.Background(), e); err != nil {
			t.Fatal(err)
		}
		es = append(es, e)
	}
	return q, d, es
}

// ack is the device's acceptance of e.
func ack(e *offline.Entry) *fence.Ack {
	a := fence.NewAck(&e.Envelope, fence.Accepted, fence.Mark{Token: 5, Seq: e.Envelope.Seq}, "")
	return &a
}

// holdGate holds every Send until release is closed, then hands it to
// the fence point: the devices' acks all come back at once.
type holdGate struct {
	fp      *fencePoint
	held    atomic.Int64
	release chan struct{}
}

func (g *holdGate) Send(ctx context.Context, env *fence.Envelope) (*fence.Ack, error) {
	g.held.Add(1)
	select {
	case <-g.release:
	case <-ctx.Done():
		return nil, fmt.Errorf("held: %w", ctx.Err())
	}
	return g.fp.Send(ctx, env)
}

// TestVerdictsOfDevicesShareCommits: one command each to 64 devices, their
// acks coming back together; the verdicts of different devices, recorded
// by their own workers, share commits (the outbox's group commit): far
// fewer commits than devices. Fails if a device's verdicts were committed
// by themselves (a db.Update per ResolveAll: 64 commits). (The outbox's
// old locking, a write lock taken after each resolve's commit, grouped
// these as well — 3 commits — its cost was the convoy behind appends.)
func TestVerdictsOfDevicesShareCommits(t *testing.T) {
	const n = 64
	g := &holdGate{fp: newFencePoint(), release: make(chan struct{})}
	ob, _ := enqueueOnEach(t, n, g, time.Minute)
	waitFor(t, "every command at the devices", func() bool { return g.held.Load() >= n })
	var commits atomic.Int64
	ob.ObserveCommits(func(time.Duration) { commits.Add(1) })
	close(g.release)
	waitFor(t, "outbox drained", pendingZero(ob))
	c := commits.Load()
	t.Logf("%d devices' verdicts recorded in %d commits", n, c)
	if c > n/4 {
		t.Errorf("%d commits for the verdicts of %d devices: not shared", c, n)
	}
}
