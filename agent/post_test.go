package agent

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/offline"
)

// posting makes a Sender a poster the way transport/mqtt's Commander is
// one: Post hands the command to the device and returns; the device's
// ack comes on a goroutine of its own (the device's, here) unless Drop
// came first, which also ends the device's wait (a gate's).
type posting struct {
	Sender
	failPosts atomic.Int32 // the next Posts that fail (not published)
	posts     atomic.Int64
	// holdFirst, if set, holds the first Post after it registered the
	// command, before the device has it (a PUBACK that is late), until
	// it is closed.
	holdFirst chan struct{}
	// holdDeaf: the held Post does not return when its context ends (a
	// publish that finishes its write first).
	holdDeaf bool
	inPost   atomic.Int32 // Posts under way
	overlap  atomic.Bool  // a Post began while another was under way
	drops    atomic.Int64 // Drops that found the command waiting

	mu      sync.Mutex
	waiting map[string]context.CancelFunc
	wg      sync.WaitGroup
}

var errNotPublished = errors.New("test: not published")

func (p *posting) Post(ctx context.Context, env *fence.Envelope, answer func(*fence.Ack)) error {
	if p.inPost.Add(1) > 1 {
		p.overlap.Store(true)
	}
	defer p.inPost.Add(-1)
	first := p.posts.Add(1) == 1
	if p.failPosts.Add(-1) >= 0 {
		return errNotPublished
	}
	dctx, cancel := context.WithCancel(context.Background())
	p.mu.Lock()
	if p.waiting == nil {
		p.waiting = make(map[string]context.CancelFunc)
	}
	if _, dup := p.waiting[env.ID]; dup {
		p.mu.Unlock()
		cancel()
		return fmt.Errorf("test: %s already in flight", env.ID)
	}
	p.waiting[env.ID] = cancel
	p.mu.Unlock()
	if first && p.holdFirst != nil {
		done := ctx.Done()
		if p.holdDeaf {
			done = nil
		}
		select {
		case <-p.holdFirst:
		case <-done:
			return ctx.Err()
		}
	}
	c := *env // the device's copy
	p.wg.Go(func() {
		defer cancel()
		ack, err := p.Send(dctx, &c)
		p.mu.Lock()
		_, mine := p.waiting[c.ID]
		delete(p.waiting, c.ID)
		p.mu.Unlock()
		if err == nil && mine {
			answer(ack)
		}
	})
	return nil
}

func (p *posting) Drop(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	cancel, ok := p.waiting[id]
	if ok {
		cancel()
		delete(p.waiting, id)
		p.drops.Add(1)
	}
	return ok
}

func (p *posting) awaited() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.waiting)
}

// workerGoroutines counts the goroutines running a device's worker.
func workerGoroutines() int {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Count(string(buf), "agent.(*delivery).work(")
}

func (q *delivery) parkedSends() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.parked)
}

// parkEverySend makes the agents the test starts park every send (the
// first postAbove of a burst would wait on their goroutines).
func parkEverySend(t *testing.T) {
	old := postAbove
	postAbove = 0
	t.Cleanup(func() { postAbove = old })
}

// startPostingAgent starts an agent holding the one device d1, its
// commands sent through p, with a fresh outbox.
func startPostingAgent(t *testing.T, p *posting) (*testAgent, *offline.Outbox) {
	t.Helper()
	ob := openOutbox(t, filepath.Join(t.TempDir(), offline.File), nil)
	a := startOutboxAgentTimeout(t, testEtcd, 2*time.Second, time.Minute, "gw-a", "/t/"+t.Name(), devCfgs("d1"), p, ob)
	waitFor(t, "a holds", holdingAll(a, []string{"d1"}))
	return a, ob
}

func gatedDevices(fp *fencePoint, n int) ([]string, chan struct{}) {
	ids := make([]string, n)
	gate := make(chan struct{})
	fp.gates = make(map[string]chan struct{}, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("d%03d", i)
		fp.gates[ids[i]] = gate
	}
	return ids, gate
}

// TestParkedSendsKeepNoGoroutine: with 200 commands at their devices
// (each device holds its ack back), no goroutine runs a device's worker —
// the sends are parked — and when the devices answer, every command ends
// accepted, applied once. Without parked sends each worker waits in Send.
func TestParkedSendsKeepNoGoroutine(t *testing.T) {
	parkEverySend(t)
	const n = 200
	fp := newFencePoint()
	ids, gate := gatedDevices(fp, n)
	p := &posting{Sender: fp}
	ob := openOutbox(t, filepath.Join(t.TempDir(), offline.File), nil)
	a := startOutboxAgentTimeout(t, testEtcd, 2*time.Second, time.Minute, "gw-a", "/t/"+t.Name(), devCfgs(ids...), p, ob)
	waitFor(t, "a holds", holdingAll(a, ids))
	for _, id := range ids {
		if _, err := a.Enqueue(t.Context(), id, "set", []byte{1}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "every command parked at its device, no worker goroutine", func() bool {
		return a.delivery.parkedSends() == n && workerGoroutines() == 0
	})
	close(gate)
	waitFor(t, "outbox drained", pendingZero(ob))
	for _, id := range ids {
		if got := fp.appliedOf(id); len(got) != 1 {
			t.Fatalf("%s applied %d times", id, len(got))
		}
	}
	waitFor(t, "no send parked or awaited", func() bool { return a.delivery.parkedSends() == 0 && p.awaited() == 0 })
	a.stop()
	p.wg.Wait()
}

// TestParkedSendLostAckResent: a parked command whose ack never comes is
// dropped at its ack deadline and sent again; the device answers the
// resend duplicate (it applied the first), and that ends it.
func TestParkedSendLostAckResent(t *testing.T) {
	parkEverySend(t)
	g := &gate{fp: newFencePoint()}
	g.dropAcks.Store(1)
	p := &posting{Sender: g}
	a, ob := startPostingAgent(t, p)
	if _, err := a.Enqueue(t.Context(), "d1", "set", nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "resolved", pendingZero(ob))
	recs, _ := ob.List(offline.Filter{})
	if len(recs) != 1 || recs[0].State != fence.Duplicate || len(g.fp.appliedOf("d1")) != 1 || p.posts.Load() != 2 {
		t.Fatalf("records %+v, applied %d, posts %d", recs, len(g.fp.appliedOf("d1")), p.posts.Load())
	}
	if p.awaited() != 0 {
		t.Fatalf("%d acks still awaited", p.awaited())
	}
	a.stop()
	p.wg.Wait()
}

// TestParkedSendSlowPostNotOverlapped: a Post still under way when the
// ack deadline passes, and slow to return even once its context ended, is
// dropped, and the resend waits until that Post returned — a worker's
// command is in one Post at a time, so the first Post's cleanup cannot
// drop the resend's wait for its ack. The command ends once, applied once.
func TestParkedSendSlowPostNotOverlapped(t *testing.T) {
	parkEverySend(t)
	fp := newFencePoint()
	p := &posting{Sender: fp, holdFirst: make(chan struct{}), holdDeaf: true}
	a, ob := startPostingAgent(t, p)
	if _, err := a.Enqueue(t.Context(), "d1", "set", nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the ack deadline dropped the held Post's wait", func() bool { return p.drops.Load() >= 1 })
	// Without the wait for the Post, the resend would start now; give it
	// the time to show (a slow machine only hides it, never fails here).
	for end := time.Now().Add(500 * time.Millisecond); time.Now().Before(end) && p.posts.Load() < 2; {
		time.Sleep(10 * time.Millisecond)
	}
	close(p.holdFirst)
	waitFor(t, "resolved", pendingZero(ob))
	recs, _ := ob.List(offline.Filter{})
	if p.overlap.Load() {
		t.Error("the resend was posted while the first Post was still under way")
	}
	if len(recs) != 1 || (recs[0].State != fence.Accepted && recs[0].State != fence.Duplicate) || len(fp.appliedOf("d1")) != 1 || p.posts.Load() != 2 {
		t.Fatalf("records %+v, applied %d, posts %d", recs, len(fp.appliedOf("d1")), p.posts.Load())
	}
	waitFor(t, "no ack awaited", func() bool { return p.awaited() == 0 })
	a.stop()
	p.wg.Wait()
}

// TestParkedSendHeldPostEndsAtDeadline: a Post whose PUBACK never comes
// (the broker keeps the connection and never acks) is ended by the ack
// deadline, as a waiting Send's publish is: the worker resends, and the
// command ends accepted, applied once.
func TestParkedSendHeldPostEndsAtDeadline(t *testing.T) {
	parkEverySend(t)
	fp := newFencePoint()
	p := &posting{Sender: fp, holdFirst: make(chan struct{})}
	t.Cleanup(func() { close(p.holdFirst) })
	a, ob := startPostingAgent(t, p)
	if _, err := a.Enqueue(t.Context(), "d1", "set", nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "resolved by the resend", pendingZero(ob))
	recs, _ := ob.List(offline.Filter{})
	if len(recs) != 1 || recs[0].State != fence.Accepted || len(fp.appliedOf("d1")) != 1 || p.posts.Load() != 2 || p.overlap.Load() {
		t.Fatalf("records %+v, applied %d, posts %d, overlapped %v", recs, len(fp.appliedOf("d1")), p.posts.Load(), p.overlap.Load())
	}
	waitFor(t, "no ack awaited", func() bool { return p.awaited() == 0 })
	a.stop()
	p.wg.Wait()
}

// TestParkedSendPostFails: a post that fails (not published) is sent
// again after the worker's backoff, and the command ends accepted once.
func TestParkedSendPostFails(t *testing.T) {
	parkEverySend(t)
	fp := newFencePoint()
	p := &posting{Sender: fp}
	p.failPosts.Store(3)
	a, _ := startPostingAgent(t, p)
	ack, err := a.Send(t.Context(), "d1", "set", nil)
	if err != nil || ack.Verdict != fence.Accepted || p.posts.Load() != 4 || len(fp.appliedOf("d1")) != 1 {
		t.Fatalf("ack %+v, err %v, posts %d, applied %d", ack, err, p.posts.Load(), len(fp.appliedOf("d1")))
	}
	a.stop()
	p.wg.Wait()
}

// TestParkedSendsEndWithRun: an agent stopped while its commands are
// parked at their devices returns (no send keeps its run), awaits no ack
// any more, and leaves the commands pending in the outbox; the next run
// delivers each once.
func TestParkedSendsEndWithRun(t *testing.T) {
	parkEverySend(t)
	const n = 20
	prefix := "/t/" + t.Name()
	path := filepath.Join(t.TempDir(), offline.File)
	fp := newFencePoint()
	ids, gate := gatedDevices(fp, n)
	p := &posting{Sender: fp}
	ob1, err := offline.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	a1 := startOutboxAgentTimeout(t, testEtcd, 2*time.Second, time.Minute, "gw-a", prefix, devCfgs(ids...), p, ob1)
	waitFor(t, "a1 holds", holdingAll(a1, ids))
	for _, id := range ids {
		if _, err := a1.Enqueue(t.Context(), id, "set", nil); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "every command parked", func() bool { return a1.delivery.parkedSends() == n })
	a1.stop()
	p.wg.Wait() // every device's wait ended: dropped
	if a1.delivery.parkedSends() != 0 || p.awaited() != 0 {
		t.Fatalf("after the run: %d parked, %d awaited", a1.delivery.parkedSends(), p.awaited())
	}
	if s, err := ob1.Stats(); err != nil || s.Pending != n {
		t.Fatalf("pending after the run: %+v %v", s, err)
	}
	ob1.Close()

	close(gate)
	ob2 := openOutbox(t, path, nil)
	a2 := startOutboxAgentTimeout(t, testEtcd, 2*time.Second, time.Minute, "gw-a", prefix, devCfgs(ids...), p, ob2)
	waitFor(t, "delivered by the next run", pendingZero(ob2))
	for _, id := range ids {
		if got := fp.appliedOf(id); len(got) != 1 {
			t.Fatalf("%s applied %d times", id, len(got))
		}
	}
	a2.stop()
	p.wg.Wait()
}

// TestBurstParksAbovePostAbove: in a burst of 200 commands held at their
// devices, the first postAbove sends wait on their workers' goroutines
// (as a command sent alone does) and the rest are parked.
func TestBurstParksAbovePostAbove(t *testing.T) {
	const n = 200
	fp := newFencePoint()
	ids, gate := gatedDevices(fp, n)
	p := &posting{Sender: fp}
	ob := openOutbox(t, filepath.Join(t.TempDir(), offline.File), nil)
	a := startOutboxAgentTimeout(t, testEtcd, 2*time.Second, time.Minute, "gw-a", "/t/"+t.Name(), devCfgs(ids...), p, ob)
	waitFor(t, "a holds", holdingAll(a, ids))
	for _, id := range ids {
		if _, err := a.Enqueue(t.Context(), id, "set", []byte{1}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, fmt.Sprintf("%d sends waiting, %d parked", postAbove, n-postAbove), func() bool {
		return a.delivery.parkedSends() == n-int(postAbove) && workerGoroutines() == int(postAbove)
	})
	close(gate)
	waitFor(t, "outbox drained", pendingZero(ob))
	for _, id := range ids {
		if got := fp.appliedOf(id); len(got) != 1 {
			t.Fatalf("%s applied %d times", id, len(got))
		}
	}
	a.stop()
	p.wg.Wait()
}
