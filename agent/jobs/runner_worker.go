package jobs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync/atomic"
	"time"

	"github.com/edgefence/edgefence/fence"
)

// errDeposed: this gateway no longer holds the device (a stale ack, or
// etcd refused a write as ErrFenced); the worker stops, the new holder
// resumes.
var errDeposed = errors.New("jobs: deposed: another gateway holds the device")

// forever is a wait that only a kick ends.
const forever = time.Duration(math.MaxInt64)

// worker drives one held device's jobs, one at a time.
type worker struct {
	r     *Runner
	dev   string
	kicks chan struct{} // capacity 1: a report, a change, an acquisition
	log   *slog.Logger
	// changed: the jobs or rollouts changed since the worker last read
	// them (a Watch change, an acquisition).
	changed atomic.Bool
	// driving: the worker drives an execution and waits on the device's
	// reports; otherwise a report does not wake it (no etcd reads per
	// report of an idle device).
	driving atomic.Bool
	// deposedAt is the token under which the worker was last deposed: it
	// does not drive under it again (the agent may not have noticed yet).
	deposedAt fence.Token
	// waitFor is the job whose rollout has no place for the worker's
	// execution yet, as its last round found ("": none); only the
	// worker's goroutine uses it. waitingOn is the job queue it waits in
	// and woken the job whose place woke it (runner_wait.go); r.mu
	// guards both.
	waitFor          string
	waitingOn, woken string
}

// poke wakes the worker; changed says the jobs or rollouts changed.
func (w *worker) poke(changed bool) {
	if changed {
		w.changed.Store(true)
	}
	select {
	case w.kicks <- struct{}{}:
	default:
	}
}

// run plans and drives the device's jobs while this gateway holds it and
// ctx lasts.
func (w *worker) run(ctx context.Context) {
	defer func() {
		w.r.mu.Lock()
		if w.r.workers[w.dev] == w {
			delete(w.r.workers, w.dev)
		}
		w.r.mu.Unlock()
	}()
	for ctx.Err() == nil {
		h, held := w.r.host.Holding(w.dev)
		held = held && h.Token > w.deposedAt
		wait := forever
		w.waitFor = ""
		if held {
			var err error
			wait, err = w.round(ctx, h)
			switch {
			case errors.Is(err, errDeposed):
				w.log.Info("firmware jobs: deposed; the new holder resumes", "token", h.Token, "err", err)
				held, w.deposedAt = false, h.Token
			case err != nil && ctx.Err() == nil:
				w.log.Warn("firmware job: retrying", "err", err, "in", wait)
			}
		}
		w.r.settle(w)
		// Not held, or held with no job for it (nothing waited for): the
		// worker ends rather than park, and the next kick (a change that
		// selects the device, an acquisition) starts one again. A gateway
		// of 10,000 devices and no job keeps no 10,000 parked goroutines
		// (their stacks, scanned by every GC cycle).
		if !held || (wait == forever && w.waitFor == "") {
			if w.r.exit(w) {
				return
			}
			continue
		}
		w.sleep(ctx, wait)
	}
}

// sleep waits for a kick, d or the end of ctx.
func (w *worker) sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	var timer <-chan time.Time
	if d != forever {
		t := time.NewTimer(d)
		defer t.Stop()
		timer = t.C
	}
	select {
	case <-ctx.Done():
	case <-w.kicks:
	case <-timer:
	}
}

// round takes the device's current job as far as it can and returns how
// long to wait before the next round (forever: until a kick).
func (w *worker) round(ctx context.Context, h Holder) (time.Duration, error) {
	retry := w.r.cfg.Retry
	job, e, err := w.pick(ctx, h)
	switch {
	case err != nil:
		return retry, err
	case job == nil:
		return forever, nil
	case e.Status == Queued:
		return w.start(ctx, h, *job, e)
	default:
		return w.drive(ctx, h, *job, e)
	}
}

// pick returns the first job selecting the device, in creation order,
// whose execution is live, queueing the execution if it has none (unless
// the rollout is stopping or completed). nil: nothing to do.
func (w *worker) pick(ctx context.Context, h Holder) (*Job, Execution, error) {
	w.changed.Store(false)
	st := w.r.store
	jobs, err := w.r.lister.list(ctx, st.Jobs)
	if err != nil {
		return nil, Execution{}, fmt.Errorf("jobs: list: %w", err)
	}
	slices.SortStableFunc(jobs, func(a, b Job) int {
		return cmp.Or(a.Created.Compare(b.Created), cmp.Compare(a.ID, b.ID))
	})
	for i := range jobs {
		j := &jobs[i]
		if !j.Selects(w.dev) {
			continue
		}
		e, err := st.Execution(ctx, w.dev, j.ID)
		if err != nil {
			return nil, e, fmt.Errorf("jobs: execution of %s: %w", j.ID, err)
		}
		if e.Status.Terminal() {
			continue
		}
		if e.Rev == 0 {
			ro, err := st.Rollout(ctx, j.ID)
			if err != nil {
				return nil, e, fmt.Errorf("jobs: rollout of %s: %w", j.ID, err)
			}
			if ro.Status.Stopping() || ro.Status == RolloutCompleted {
				continue
			}
			if e, err = st.Queue(ctx, w.dev, j.ID, h); err != nil {
				return nil, e, asDeposed(fmt.Errorf("jobs: queue %s: %w", j.ID, err))
			}
			if e.Status.Terminal() {
				continue
			}
		}
		j.ApplyDefaults()
		return j, e, nil
	}
	return nil, Execution{}, nil
}

// asDeposed turns ErrFenced into errDeposed (keeping the cause).
func asDeposed(err error) error {
	if errors.Is(err, ErrFenced) {
		return fmt.Errorf("%w: %w", errDeposed, err)
	}
	return err
}

// start asks the rollout to start a queued execution and drives it if it
// may; a stopping rollout cancels it.
func (w *worker) start(ctx context.Context, h Holder, job Job, e Execution) (time.Duration, error) {
	retry := w.r.cfg.Retry
	ro, err := w.r.store.Rollout(ctx, job.ID)
	if err != nil {
		return retry, fmt.Errorf("jobs: rollout of %s: %w", job.ID, err)
	}
	if ro.Status.Stopping() {
		x := w.newRun(h, job, e)
		return 0, x.finish(ctx, Canceled, stopReason(ro))
	}
	s, err := w.r.store.Start(ctx, e, h)
	w.r.unwake(w) // decided: its place taken, or not there
	if ny, ok := errors.AsType[*NotYetError](err); ok {
		return w.awaitPlace(job.ID, cmp.Or(ny.RetryAfter, retry)), nil
	}
	switch {
	case err == nil:
		w.log.Info("firmware job started", "job", job.ID, "token", h.Token)
		return w.drive(ctx, h, job, s)
	case errors.Is(err, ErrNotYet):
		return retry, nil
	case errors.Is(err, ErrStopped):
		w.waitFor = job.ID // paused: the change that resumes it offers places
		return forever, nil
	case errors.Is(err, ErrConflict):
		return 0, nil
	}
	return retry, asDeposed(fmt.Errorf("jobs: start %s: %w", job.ID, err))
}

// stopReason says why a stopping rollout cancels an execution.
func stopReason(ro Rollout) string {
	if ro.Reason == "" {
		return "rollout " + string(ro.Status)
	}
	return "rollout " + string(ro.Status) + ": " + ro.Reason
}
