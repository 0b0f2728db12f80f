package agent

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgefence/edgefence/agent/jobs"
	"github.com/edgefence/edgefence/devices/fwjob"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/offline"
)

// The runner's window of chunks in flight (agent/jobs runner_window.go),
// end to end: a real agent, etcd, broker and fwjob device.

// applied is how many chunks of job the device applied.
func (d *fwDev) applied() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.chunks)
}

// checkOnce fails unless every offset of img (in chunks of chunk) was
// applied exactly once.
func (d *fwDev) checkOnce(job string, img jobs.ImageRef, chunk int) {
	d.t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.twice) != 0 {
		d.t.Fatalf("offsets written twice: %v", d.twice)
	}
	if want := (int(img.Size) + chunk - 1) / chunk; len(d.chunks) != want {
		d.t.Fatalf("%d chunks applied, want %d", len(d.chunks), want)
	}
}

// TestFirmwareJobWindow: while the device works on a chunk, the runner
// has the window's chunks issued behind it (stored in the outbox, in
// order), not one: with the second chunk frozen in its send, the device's
// queue holds jobs.window chunks. Released, the job commits.
func TestFirmwareJobWindow(t *testing.T) {
	w := newFWWorld(t)
	w.window = 3
	d := w.device("fw-win", fwjob.BootConfig{})
	var gate *chunkGate
	a, _ := w.agent("gw-1", []string{d.id}, func(s Sender) Sender { gate = newChunkGate(t, s, 2); return gate })
	img := w.image("window", 40<<10, 1)
	job := w.createJob("j-window", img, d.id)
	wait(t, "the second chunk held", gate.held)
	waitLong(t, "the window's chunks queued", func() bool { n, _ := a.delivery.outbox.Pending(d.id); return n == w.window })
	time.Sleep(200 * time.Millisecond) // and no more than the window
	if n, _ := a.delivery.outbox.Pending(d.id); n != w.window {
		t.Fatalf("%d commands queued, want the window's %d", n, w.window)
	}
	close(gate.release)
	if e := w.waitEnded(d.id, job.ID); e.Status != jobs.Succeeded {
		t.Fatalf("execution %+v", e)
	}
	d.runsImage(img)
	d.checkOnce(job.ID, img, w.chunk)
}

// TestFirmwareJobWindowBrokerRestart: the broker restarts in the middle
// of the download (sessions, subscriptions and retained reports lost, the
// window's chunks in flight): the workers resend, the device still gets
// every chunk at its offset once, and the job commits.
func TestFirmwareJobWindowBrokerRestart(t *testing.T) {
	w := newFWWorld(t)
	w.chunk = 1 << 10
	d := w.device("fw-brk", fwjob.BootConfig{})
	w.agent("gw-1", []string{d.id}, nil)
	img := w.image("broker-restart", 256<<10, 1)
	job := w.createJob("j-broker", img, d.id)
	waitLong(t, "ten chunks applied", func() bool { return d.applied() >= 10 })
	if err := w.broker.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := d.applied(); n >= int(img.Size)/w.chunk {
		t.Fatalf("the download ended (%d chunks) before the broker restarted", n)
	}
	if e := w.waitEnded(d.id, job.ID); e.Status != jobs.Succeeded {
		t.Fatalf("execution %+v", e)
	}
	d.runsImage(img)
	d.checkOnce(job.ID, img, w.chunk)
}

// stallSender delivers the fw.chunk sends after the first after ones to
// the device and then hangs without their ack until the send's context
// ends: an agent that dies with its window in flight.
type stallSender struct {
	Sender
	after   int32
	n       atomic.Int32
	stalled chan struct{} // closed at the first stalled send
}

func (s *stallSender) Send(ctx context.Context, env *fence.Envelope) (*fence.Ack, error) {
	if env.Kind != fwjob.KindChunk || s.n.Add(1) <= s.after {
		return s.Sender.Send(ctx, env)
	}
	if _, err := s.Sender.Send(ctx, env); err != nil {
		return nil, err
	}
	if s.n.Load() == s.after+1 {
		close(s.stalled)
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestFirmwareJobWindowAgentRestart: the agent stops with its window in
// flight (the head chunk applied at the device, its ack never seen, the
// rest queued) and starts again on the same outbox: the outbox replays
// its chunks (a duplicate at the device, then the rest at their offsets),
// the new runner's chunks planned from an older report are refused at
// the wrong offset (invalid) and it plans again from the device's report.
// The job commits, every offset applied once, and the slot verifies.
func TestFirmwareJobWindowAgentRestart(t *testing.T) {
	w := newFWWorld(t)
	d := w.device("fw-rst", fwjob.BootConfig{})
	devs := []string{d.id}
	path := filepath.Join(t.TempDir(), offline.File)
	ob1, err := offline.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	stall := &stallSender{after: 3, stalled: make(chan struct{})}
	a1, c1 := w.agentWith("gw-1", devs, func(s Sender) Sender { stall.Sender = s; return stall }, Options{Outbox: ob1})
	img := w.image("agent-restart", 40<<10, 1)
	job := w.createJob("j-restart", img, d.id)
	wait(t, "the fourth chunk sent, its ack stalled", stall.stalled)
	// fw.begin and the three chunks before it recorded (their verdicts
	// wait for a batch, then for the stalled send's first timeout), the
	// next batch queued behind the stalled one.
	waitLong(t, "the window queued", func() bool {
		st, err := ob1.Stats()
		return err == nil && st.Terminal[fence.Accepted] >= 4 && st.Pending >= 2
	})
	a1.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c1.Close(ctx)
	queued, _ := ob1.Pending(d.id)
	if err := ob1.Close(); err != nil {
		t.Fatal(err)
	}
	before := d.applied()

	ob2, err := offline.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ob2.Close() })
	if n, _ := ob2.Pending(d.id); n != queued || n < 2 {
		t.Fatalf("%d chunks queued after the restart, %d before it", n, queued)
	}
	a2, _ := w.agentWith("gw-1", devs, nil, Options{Outbox: ob2})
	if e := w.waitEnded(d.id, job.ID); e.Status != jobs.Succeeded {
		t.Fatalf("execution %+v", e)
	}
	d.runsImage(img)
	d.checkOnce(job.ID, img, w.chunk)
	c := a2.Status().Counters
	t.Logf("applied before the restart %d; after it: %d duplicate, %d invalid, %d accepted", before, c.Duplicate, c.Invalid, c.Accepted)
	if c.Duplicate == 0 {
		t.Fatalf("the replayed head chunk was not a duplicate: %+v", c)
	}
}

// TestFirmwareJobChunksShareCommits: a download's chunks share the
// outbox's commits end to end (real etcd, broker and fwjob device): half
// a window of chunks per AppendAll, up to eight verdicts per ResolveAll.
// A job of 64 chunks takes fewer outbox commits than it has chunks; one
// commit per append and one per verdict, as before, took two per chunk.
// Every offset is applied once and the image runs.
func TestFirmwareJobChunksShareCommits(t *testing.T) {
	w := newFWWorld(t)
	d := w.device("fw-commits", fwjob.BootConfig{})
	ob, err := offline.Open(filepath.Join(t.TempDir(), offline.File), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ob.Close() })
	w.agentWith("gw-1", []string{d.id}, nil, Options{Outbox: ob})
	var commits atomic.Int64
	ob.ObserveCommits(func(time.Duration) { commits.Add(1) }) // in place of the agent's latency tails
	const chunks = 64
	img := w.image("commits", chunks*w.chunk, 1)
	job := w.createJob("j-commits", img, d.id)
	if e := w.waitEnded(d.id, job.ID); e.Status != jobs.Succeeded {
		t.Fatalf("execution %+v", e)
	}
	d.runsImage(img)
	d.checkOnce(job.ID, img, w.chunk)
	n := commits.Load()
	t.Logf("%d chunks and the job's other steps in %d outbox commits", chunks, n)
	if n >= chunks {
		t.Errorf("%d outbox commits for %d chunks: the chunks' appends or verdicts are not batched", n, chunks)
	}
}
