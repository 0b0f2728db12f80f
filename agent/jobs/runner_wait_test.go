package jobs_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgefence/edgefence/agent/jobs"
	"github.com/edgefence/edgefence/fence"
)

// countingStore counts the runner's Start requests (each an etcd
// transaction, or a read and a refusal) and how many the rollout refused
// as not yet.
type countingStore struct {
	*jobs.Store
	starts, notYet atomic.Int64
}

func (s *countingStore) Start(ctx context.Context, e jobs.Execution, h jobs.Holder) (jobs.Execution, error) {
	s.starts.Add(1)
	x, err := s.Store.Start(ctx, e, h)
	if errors.Is(err, jobs.ErrNotYet) {
		s.notYet.Add(1)
	}
	return x, err
}

// refusingHost holds every device (real lock keys in etcd, so the Store's
// fenced writes pass) and answers every firmware step, after delay, as a
// device that refuses it: each execution starts and ends (rejected) at
// once, a place in the rollout busy for about delay.
type refusingHost struct {
	holders map[string]jobs.Holder
	delay   time.Duration
}

func (h *refusingHost) Holding(dev string) (jobs.Holder, bool) {
	x, ok := h.holders[dev]
	return x, ok
}

func (h *refusingHost) IssueAll(_ context.Context, dev, kind string, bodies [][]byte) ([]jobs.Pending, error) {
	ps := make([]jobs.Pending, len(bodies))
	for i := range bodies {
		ps[i] = &refusal{dev: dev, kind: kind, delay: h.delay}
	}
	return ps, nil
}

// refusal is a refusingHost command: its ack, invalid, comes after delay.
type refusal struct {
	dev, kind string
	delay     time.Duration
}

func (p *refusal) Wait(ctx context.Context) (*fence.Ack, error) {
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(p.delay):
	}
	ack := &fence.Ack{Device: p.dev, Verdict: fence.Invalid, Reason: "test device refuses " + p.kind}
	return ack, ack.Err()
}

func (p *refusal) Close() {}

// TestRunnerWakesOnlyFreePlaces: with many devices waiting for a place in
// a rollout of max_concurrent 3, every finish (and every queueing) changes
// the rollout; the runner must not send every waiting worker to etcd for
// a start on each change (the thundering herd) but about one start per
// execution and one refusal per device that had to wait (117 here: 60 +
// 57). Without the fix (every waiting worker kicked on every change) this
// took 600-odd Start requests and four times as long.
func TestRunnerWakesOnlyFreePlaces(t *testing.T) {
	const n, conc = 60, 3
	st, cs, r, devs := newRefusingRig(t, n)
	ctx := runRunner(t, st, r)
	j := testJob("herd", devs...)
	j.Rollout.MaxConcurrent = conc
	if _, _, err := st.Create(ctx, j); err != nil {
		t.Fatal(err)
	}
	ro := awaitRollout(t, ctx, st, "herd", 2*time.Minute)
	if ro.Counts[jobs.Rejected] != n {
		t.Fatalf("rollout %s, counts %v: want all %d rejected", ro.Status, ro.Counts, n)
	}
	starts, notYet := cs.starts.Load(), cs.notYet.Load()
	t.Logf("%d executions: %d Start requests, %d refused not yet", n, starts, notYet)
	if starts > 3*n {
		t.Fatalf("%d Start requests for %d executions (%d not yet): the waiting workers are woken on every change", starts, n, notYet)
	}
}

// awaitRollout polls job's rollout until it completed (or stopped), at
// most limit.
func awaitRollout(t *testing.T, ctx context.Context, st *jobs.Store, job string, limit time.Duration) jobs.Rollout {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		ro, err := st.Rollout(ctx, job)
		if err == nil && (ro.Status == jobs.RolloutCompleted || ro.Status.Stopping()) {
			return ro
		}
		if time.Now().After(deadline) {
			t.Fatalf("rollout of %s not done after %v: %+v %v", job, limit, ro, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// newRefusingRig is a runner over a counting store on n devices this
// gateway holds behind a refusingHost, each with an idle report.
func newRefusingRig(t *testing.T, n int) (*jobs.Store, *countingStore, *jobs.Runner, []string) {
	t.Helper()
	st, cli := newStore(t)
	cs := &countingStore{Store: st}
	devs := make([]string, n)
	host := &refusingHost{holders: map[string]jobs.Holder{}, delay: 20 * time.Millisecond}
	for i := range devs {
		devs[i] = fmt.Sprintf("dev-%02d", i)
	}
	first := lockDevice(t, cli, st, devs[0], "gw-a")
	host.holders[devs[0]] = first.Holder
	for _, d := range devs[1:] {
		host.holders[d] = lockOn(t, first.sess, st, d, "gw-a").Holder
	}
	r := jobs.NewRunner(cs, jobs.ImagesFunc(func(context.Context, jobs.ImageRef) (jobs.Image, error) {
		return nil, errors.New("no images in this test")
	}), host, jobs.RunnerConfig{Gateway: "gw-a", Devices: devs})
	for _, d := range devs {
		r.Report(d, map[string]any{"state": "idle"})
	}
	return st, cs, r, devs
}

// runRunner runs r until the test ends and returns once its watch is up:
// a job of another device is listed, so that the test's jobs come as
// changes (as `edgefence job create` on a running agent), not in the
// listing as well as in the first round of every worker.
func runRunner(t *testing.T, st *jobs.Store, r *jobs.Runner) context.Context {
	t.Helper()
	ctx, cancel := context.WithCancel(ctxT(t))
	if _, _, err := st.Create(ctx, testJob("other", "dev-elsewhere")); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { _ = r.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	for deadline := time.Now().Add(time.Minute); r.Stats().Changes < 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the runner's watch listed nothing in a minute")
		}
	}
	return ctx
}

// TestRunnerResumeWakesWaiters: the workers of a paused rollout wait
// without a timer; its resume must offer them its places (and each finish
// the next), or the rollout never ends.
func TestRunnerResumeWakesWaiters(t *testing.T) {
	const n = 12
	st, cs, r, devs := newRefusingRig(t, n)
	ctx := runRunner(t, st, r)
	j := testJob("paused", devs...)
	j.Rollout.MaxConcurrent = 2
	if _, _, err := st.Create(ctx, j); err != nil {
		t.Fatal(err)
	}
	if _, err := st.SetRollout(ctx, "paused", jobs.RolloutPaused, "test"); err != nil && !errors.Is(err, jobs.ErrTransition) {
		t.Fatal(err)
	}
	// Every device queued (or, before the pause, ended), none waiting on
	// a timer: then resume.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		ro, err := st.Rollout(ctx, "paused")
		if err == nil && ro.Counts[jobs.InProgress] == 0 && ro.Counts[jobs.Queued]+ro.Counts[jobs.Rejected] == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not all queued in a minute: %+v %v", ro, err)
		}
	}
	if _, err := st.SetRollout(ctx, "paused", jobs.RolloutActive, "test"); err != nil {
		t.Fatal(err)
	}
	ro := awaitRollout(t, ctx, st, "paused", time.Minute)
	if ro.Status != jobs.RolloutCompleted || ro.Counts[jobs.Rejected] != n {
		t.Fatalf("rollout %s, counts %v: want completed, all %d rejected", ro.Status, ro.Counts, n)
	}
	t.Logf("%d Start requests", cs.starts.Load())
}

// TestRunnerIdleDevicesKeepNoWorkers: held devices that no job selects
// keep no worker (a goroutine each, parked until a kick, scanned by every
// GC cycle: 10,000 of them on a 10,000-device gateway); a job created
// later still starts them, through the watch's kick.
func TestRunnerIdleDevicesKeepNoWorkers(t *testing.T) {
	const n = 20
	st, _, r, devs := newRefusingRig(t, n)
	ctx := runRunner(t, st, r)
	for deadline := time.Now().Add(time.Minute); r.Workers() > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d workers for %d held devices no job selects, a minute after the runner started; want none", r.Workers(), n)
		}
	}
	if _, _, err := st.Create(ctx, testJob("later", devs...)); err != nil {
		t.Fatal(err)
	}
	if ro := awaitRollout(t, ctx, st, "later", 2*time.Minute); ro.Counts[jobs.Rejected] != n {
		t.Fatalf("rollout %s, counts %v: want all %d rejected (each device's worker started by the change)", ro.Status, ro.Counts, n)
	}
}
