package jobs_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/edgefence/edgefence/agent/jobs"
)

// fleet is n devices dev-00.. of a job, each locked by one of two
// gateways (two sessions), each with its queued execution.
type fleet struct {
	st      *jobs.Store
	cli     *clientv3.Client
	devs    []string
	holders map[string]jobs.Holder
	execs   map[string]jobs.Execution
}

func newFleet(tb testing.TB, st *jobs.Store, cli *clientv3.Client, j jobs.Job, n int) *fleet {
	tb.Helper()
	ctx := ctxT(tb)
	f := &fleet{st: st, cli: cli, holders: map[string]jobs.Holder{}, execs: map[string]jobs.Execution{}}
	for i := range n {
		f.devs = append(f.devs, fmt.Sprintf("dev-%02d", i))
	}
	j.Targets.Devices = f.devs
	if _, _, err := st.Create(ctx, j); err != nil {
		tb.Fatal(err)
	}
	var sess [2]*concurrency.Session
	for i := range sess {
		s, err := concurrency.NewSession(cli, concurrency.WithTTL(10))
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { s.Close() })
		sess[i] = s
	}
	for i, d := range f.devs {
		h := lockOn(tb, sess[i%2], st, d, fmt.Sprintf("gw-%d", i%2)).Holder
		f.holders[d] = h
		e, err := st.Queue(ctx, d, j.ID, h)
		if err != nil {
			tb.Fatal(err)
		}
		f.execs[d] = e
	}
	return f
}

func (f *fleet) start(tb testing.TB, dev string) error {
	tb.Helper()
	e, err := f.st.Start(ctxT(tb), f.execs[dev], f.holders[dev])
	if err == nil {
		f.execs[dev] = e
	}
	return err
}

func (f *fleet) finish(tb testing.TB, dev string, to jobs.Status, reason string) jobs.Rollout {
	tb.Helper()
	e, r, err := f.st.Finish(ctxT(tb), f.execs[dev], to, reason, f.holders[dev])
	if err != nil {
		tb.Fatalf("finish %s: %v", dev, err)
	}
	f.execs[dev] = e
	return r
}

// TestStoreMaxConcurrent: two gateways start 50 executions against
// max_concurrent 5, every device in its own goroutine, each retrying on
// ErrNotYet and finishing once started: never more than 5 in progress.
func TestStoreMaxConcurrent(t *testing.T) {
	st, cli := newStore(t)
	j := testJob("fw-1")
	j.Rollout.MaxConcurrent = 5
	f := newFleet(t, st, cli, j, 50)
	var running, most atomic.Int64
	var notYet atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, len(f.devs))
	for _, d := range f.devs {
		wg.Add(1)
		go func(e jobs.Execution, h jobs.Holder) {
			defer wg.Done()
			ctx := ctxT(t)
			for {
				s, err := st.Start(ctx, e, h)
				if errors.Is(err, jobs.ErrNotYet) {
					notYet.Add(1)
					time.Sleep(time.Millisecond)
					continue
				}
				if err != nil {
					errs <- fmt.Errorf("start %s: %w", e.Device, err)
					return
				}
				n := running.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				time.Sleep(20 * time.Millisecond)
				running.Add(-1)
				if _, _, err := st.Finish(ctx, s, jobs.Succeeded, "", h); err != nil {
					errs <- fmt.Errorf("finish %s: %w", e.Device, err)
				}
				return
			}
		}(f.execs[d], f.holders[d])
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if most.Load() > 5 {
		t.Errorf("%d executions in progress at once, max_concurrent 5", most.Load())
	}
	r, err := st.Rollout(ctxT(t), "fw-1")
	if err != nil {
		t.Fatal(err)
	}
	inEtcd := maxInProgress(t, cli, st, "fw-1", r.Rev)
	if inEtcd > 5 {
		t.Errorf("a version of the rollout counts %d in progress, max_concurrent 5", inEtcd)
	}
	if r.Counts[jobs.Succeeded] != 50 || r.Counts[jobs.InProgress] != 0 || r.Counts[jobs.Queued] != 0 || r.Started != 50 || r.Status != jobs.RolloutCompleted {
		t.Errorf("rollout at the end: %+v", r)
	}
	t.Logf("most in progress at once: %d by the rollout's versions, %d seen by the goroutines; %d starts answered not yet", inEtcd, most.Load(), notYet.Load())
}

// maxInProgress replays every version of job's rollout up to rev (a
// watch from its creation) and returns the most executions in progress
// any of them counts.
func maxInProgress(tb testing.TB, cli *clientv3.Client, st *jobs.Store, job string, rev int64) int {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cur, err := cli.Get(ctx, st.RolloutKey(job))
	if err != nil || len(cur.Kvs) != 1 {
		tb.Fatalf("rollout %s: %v %v", job, cur, err)
	}
	most := 0
	for wr := range cli.Watch(ctx, st.RolloutKey(job), clientv3.WithRev(cur.Kvs[0].CreateRevision)) {
		if err := wr.Err(); err != nil {
			tb.Fatal(err)
		}
		for _, ev := range wr.Events {
			var r jobs.Rollout
			if err := json.Unmarshal(ev.Kv.Value, &r); err != nil {
				tb.Fatal(err)
			}
			most = max(most, r.Counts[jobs.InProgress])
			if ev.Kv.ModRevision >= rev {
				return most
			}
		}
	}
	tb.Fatal("rollout history: watch ended early")
	return 0
}

// TestStoreNotYetReason: the sixth start against max_concurrent 5 says so.
func TestStoreNotYetReason(t *testing.T) {
	st, cli := newStore(t)
	j := testJob("fw-1")
	j.Rollout.MaxConcurrent = 5
	f := newFleet(t, st, cli, j, 6)
	for _, d := range f.devs[:5] {
		if err := f.start(t, d); err != nil {
			t.Fatal(err)
		}
	}
	err := f.start(t, f.devs[5])
	var ny *jobs.NotYetError
	if !errors.As(err, &ny) || !errors.Is(err, jobs.ErrNotYet) || ny.Reason != "max_concurrent 5 in progress" {
		t.Fatalf("sixth start: %v", err)
	}
	f.finish(t, f.devs[0], jobs.Succeeded, "")
	if err := f.start(t, f.devs[5]); err != nil {
		t.Fatalf("start after one ended: %v", err)
	}
}

// TestStorePerMinute: per_minute 2 on a fake clock.
func TestStorePerMinute(t *testing.T) {
	st, cli := newStore(t)
	var now atomic.Int64
	now.Store(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC).UnixNano())
	st.WithClock(func() time.Time { return time.Unix(0, now.Load()) })
	advance := func(d time.Duration) { now.Add(int64(d)) }
	j := testJob("fw-1")
	j.Rollout.PerMinute = 2
	f := newFleet(t, st, cli, j, 4)
	if err := f.start(t, f.devs[0]); err != nil {
		t.Fatal(err)
	}
	advance(20 * time.Second)
	if err := f.start(t, f.devs[1]); err != nil {
		t.Fatal(err)
	}
	advance(20 * time.Second)
	err := f.start(t, f.devs[2])
	var ny *jobs.NotYetError
	if !errors.As(err, &ny) || ny.Reason != "rate 2/min" || ny.RetryAfter != 20*time.Second {
		t.Fatalf("third start within the minute: %v (%+v)", err, ny)
	}
	advance(20 * time.Second) // the first start is a minute old
	if err := f.start(t, f.devs[2]); err != nil {
		t.Fatalf("start after the first left the minute: %v", err)
	}
	if err := f.start(t, f.devs[3]); !errors.Is(err, jobs.ErrNotYet) {
		t.Fatalf("fourth start: %v, want ErrNotYet", err)
	}
	r, err := st.Rollout(ctxT(t), "fw-1")
	if err != nil || len(r.Starts) != 2 {
		t.Fatalf("rollout keeps the starts of the last minute only: %+v %v", r, err)
	}
}

// TestStoreCanaries: the first starts are canaries; nothing else starts
// until they succeeded; a canary canceled frees its place.
func TestStoreCanaries(t *testing.T) {
	st, cli := newStore(t)
	j := testJob("fw-1")
	j.Rollout.Canary = 2
	f := newFleet(t, st, cli, j, 5)
	for _, d := range f.devs[:2] {
		if err := f.start(t, d); err != nil || !f.execs[d].Canary {
			t.Fatalf("start %s: %v canary=%v", d, err, f.execs[d].Canary)
		}
	}
	var ny *jobs.NotYetError
	if err := f.start(t, f.devs[2]); !errors.As(err, &ny) || ny.Reason != "canaries running (2 left)" {
		t.Fatalf("start while canaries run: %v", err)
	}
	f.finish(t, f.devs[0], jobs.Succeeded, "")
	if err := f.start(t, f.devs[2]); !errors.As(err, &ny) || ny.Reason != "canaries running (1 left)" {
		t.Fatalf("start with one canary running: %v", err)
	}
	f.finish(t, f.devs[1], jobs.Canceled, "operator")
	if err := f.start(t, f.devs[2]); err != nil || !f.execs[f.devs[2]].Canary {
		t.Fatalf("a canceled canary's place: %v canary=%v", err, f.execs[f.devs[2]].Canary)
	}
	r := f.finish(t, f.devs[2], jobs.Succeeded, "")
	if r.CanaryLeft != 0 || r.CanaryRunning != 0 {
		t.Fatalf("canaries done: %+v", r)
	}
	if err := f.start(t, f.devs[3]); err != nil || f.execs[f.devs[3]].Canary {
		t.Fatalf("start after the canaries: %v canary=%v", err, f.execs[f.devs[3]].Canary)
	}
}

func TestStoreCanaryFailureAborts(t *testing.T) {
	st, cli := newStore(t)
	j := testJob("fw-1")
	j.Rollout.Canary = 1
	f := newFleet(t, st, cli, j, 3)
	if err := f.start(t, f.devs[0]); err != nil {
		t.Fatal(err)
	}
	r := f.finish(t, f.devs[0], jobs.Failed, "rolled back: health check failed")
	if r.Status != jobs.RolloutAborted || !strings.Contains(r.Reason, "dev-00") || !strings.Contains(r.Reason, "health check failed") {
		t.Fatalf("rollout after a canary failed: %+v", r)
	}
	if err := f.start(t, f.devs[1]); !errors.Is(err, jobs.ErrStopped) {
		t.Fatalf("start after the abort: %v, want ErrStopped", err)
	}
	// Queued executions of an aborted rollout end canceled.
	if r = f.finish(t, f.devs[1], jobs.Canceled, "rollout aborted"); r.Counts[jobs.Queued] != 1 || r.Counts[jobs.Canceled] != 1 {
		t.Fatalf("counts: %+v", r.Counts)
	}
}

// TestStoreAbortRatio: 20 devices, every fifth fails, abort at 20% after
// 5 ended: the fifth end aborts; then no start.
func TestStoreAbortRatio(t *testing.T) {
	st, cli := newStore(t)
	j := testJob("fw-1")
	j.Rollout.MaxConcurrent = 20
	j.Rollout.Abort = jobs.AbortPolicy{FailureRatio: 0.2, MinExecutions: 5}
	f := newFleet(t, st, cli, j, 20)
	for _, d := range f.devs[:10] {
		if err := f.start(t, d); err != nil {
			t.Fatal(err)
		}
	}
	// A failure before MinExecutions does not abort; canceled counts neither way.
	r := f.finish(t, f.devs[0], jobs.Rejected, "anti-rollback")
	r = f.finish(t, f.devs[1], jobs.Canceled, "")
	for _, d := range f.devs[2:5] {
		r = f.finish(t, d, jobs.Succeeded, "")
	}
	if r.Status != jobs.RolloutActive {
		t.Fatalf("1 failure in 4 decided: %+v", r)
	}
	r = f.finish(t, f.devs[5], jobs.TimedOut, "step install")
	if r.Status != jobs.RolloutAborted || !strings.Contains(r.Reason, "failures 2 of 5") {
		t.Fatalf("2 failures in 5: %+v", r)
	}
	if err := f.start(t, f.devs[10]); !errors.Is(err, jobs.ErrStopped) || !strings.Contains(err.Error(), "aborted") {
		t.Fatalf("start after the abort: %v", err)
	}
	// In progress ones still end (canceled by their runners); the status stays.
	if r = f.finish(t, f.devs[6], jobs.Succeeded, ""); r.Status != jobs.RolloutAborted {
		t.Fatalf("%+v", r)
	}
}

func TestStorePauseResumeCancel(t *testing.T) {
	st, cli := newStore(t)
	ctx := ctxT(t)
	f := newFleet(t, st, cli, testJob("fw-1"), 3)
	if _, err := st.SetRollout(ctx, "fw-1", jobs.RolloutActive, ""); !errors.Is(err, jobs.ErrTransition) {
		t.Fatalf("resume of an active rollout: %v", err)
	}
	r, err := st.SetRollout(ctx, "fw-1", jobs.RolloutPaused, "night")
	if err != nil || r.Status != jobs.RolloutPaused || r.Reason != "night" {
		t.Fatalf("pause: %+v %v", r, err)
	}
	if err := f.start(t, f.devs[0]); !errors.Is(err, jobs.ErrStopped) || !strings.Contains(err.Error(), "night") {
		t.Fatalf("start while paused: %v", err)
	}
	if _, err := st.SetRollout(ctx, "fw-1", jobs.RolloutActive, ""); err != nil {
		t.Fatal(err)
	}
	if err := f.start(t, f.devs[0]); err != nil {
		t.Fatalf("start after resume: %v", err)
	}
	if r, err = st.SetRollout(ctx, "fw-1", jobs.RolloutCanceled, "wrong image"); err != nil || !r.Status.Stopping() {
		t.Fatalf("cancel: %+v %v", r, err)
	}
	if err := f.start(t, f.devs[1]); !errors.Is(err, jobs.ErrStopped) {
		t.Fatalf("start after cancel: %v", err)
	}
	for _, to := range []jobs.RolloutStatus{jobs.RolloutActive, jobs.RolloutPaused, jobs.RolloutCanceled, jobs.RolloutCompleted} {
		if _, err := st.SetRollout(ctx, "fw-1", to, ""); !errors.Is(err, jobs.ErrTransition) {
			t.Errorf("canceled → %s: %v", to, err)
		}
	}
	if _, err := st.SetRollout(ctx, "nope", jobs.RolloutPaused, ""); !errors.Is(err, jobs.ErrNoJob) {
		t.Errorf("pause of no job: %v", err)
	}
	// The in-progress execution ends canceled; counts stay right.
	if r = f.finish(t, f.devs[0], jobs.Canceled, "rollout canceled"); r.Status != jobs.RolloutCanceled || r.Counts[jobs.Canceled] != 1 || r.Counts[jobs.InProgress] != 0 {
		t.Fatalf("%+v", r)
	}
}

// TestStoreWatch: Watch lists what is there, then sees a create, a pause
// and an abort, and closes when its context ends.
func TestStoreWatch(t *testing.T) {
	st, cli := newStore(t)
	if _, _, err := st.Create(ctxT(t), testJob("fw-0", "dev-9")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ch := st.Watch(ctx)
	next := func(what string, ok func(jobs.Change) bool) {
		t.Helper()
		deadline := time.After(30 * time.Second)
		for {
			select {
			case c, open := <-ch:
				if !open {
					t.Fatalf("%s: watch closed", what)
				}
				if c.Err != nil {
					t.Fatalf("%s: %v", what, c.Err)
				}
				if ok(c) {
					return
				}
			case <-deadline:
				t.Fatalf("%s: not seen", what)
			}
		}
	}
	next("listing", func(c jobs.Change) bool { return c.Resync && c.ID == "fw-0" && c.Job != nil })
	j := testJob("fw-1")
	j.Rollout.Canary = 1
	f := newFleet(t, st, cli, j, 2)
	next("create", func(c jobs.Change) bool { return c.ID == "fw-1" && c.Job != nil && !c.Resync })
	if _, err := st.SetRollout(ctxT(t), "fw-1", jobs.RolloutPaused, "lunch"); err != nil {
		t.Fatal(err)
	}
	next("pause", func(c jobs.Change) bool { return c.Rollout != nil && c.Rollout.Status == jobs.RolloutPaused })
	if _, err := st.SetRollout(ctxT(t), "fw-1", jobs.RolloutActive, ""); err != nil {
		t.Fatal(err)
	}
	if err := f.start(t, f.devs[0]); err != nil {
		t.Fatal(err)
	}
	f.finish(t, f.devs[0], jobs.Failed, "bricked")
	next("abort", func(c jobs.Change) bool {
		return c.Rollout != nil && c.Rollout.Status == jobs.RolloutAborted && strings.Contains(c.Rollout.Reason, "bricked")
	})
	if _, err := cli.Delete(ctxT(t), st.JobKey("fw-0")); err != nil {
		t.Fatal(err)
	}
	next("delete", func(c jobs.Change) bool { return c.ID == "fw-0" && c.Deleted && c.Doc == jobs.DocJob })
	cancel()
	for range ch {
	}
}

// TestStoreTwoGateways: each gateway's Store decides on the rollout it
// last wrote; a refusal is still decided on the rollout as it is, and a
// start on a rollout another Store changed is decided again.
func TestStoreTwoGateways(t *testing.T) {
	a, cli := newStore(t)
	prefix := strings.TrimSuffix(a.JobKey(""), "/jobs/")
	b, op := jobs.NewStore(newClient(t), prefix), jobs.NewStore(newClient(t), prefix)
	j := testJob("fw-1")
	j.Rollout.MaxConcurrent = 1
	f := newFleet(t, a, cli, j, 3)
	if err := f.start(t, f.devs[0]); err != nil {
		t.Fatal(err)
	}
	fb := *f
	fb.st = b
	if err := fb.start(t, f.devs[1]); !errors.Is(err, jobs.ErrNotYet) {
		t.Fatalf("gateway b's start while a runs one: %v", err)
	}
	f.finish(t, f.devs[0], jobs.Succeeded, "") // b's Store last saw 1 in progress
	if err := fb.start(t, f.devs[1]); err != nil {
		t.Fatalf("gateway b's start after a's finish: %v", err)
	}
	fb.finish(t, f.devs[1], jobs.Succeeded, "") // a's Store last saw 1 in progress, active
	if _, err := op.SetRollout(ctxT(t), "fw-1", jobs.RolloutPaused, "op"); err != nil {
		t.Fatal(err)
	}
	if err := f.start(t, f.devs[2]); !errors.Is(err, jobs.ErrStopped) {
		t.Fatalf("gateway a's start after the operator's pause: %v", err)
	}
}
