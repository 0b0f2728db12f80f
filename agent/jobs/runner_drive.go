package jobs

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/edgefence/edgefence/devices/fwjob"
	"github.com/edgefence/edgefence/fence"
)

// Progress is written to the execution at most every progressEvery or
// progressShare of the image (and at every change of step).
const (
	progressEvery = 2 * time.Second
	progressShare = 10 // percent
)

// xrun is one drive of an in-progress execution by this holder.
type xrun struct {
	w    *worker
	h    Holder
	job  Job
	e    Execution
	img  Image // opened at the first chunk
	done bool  // the execution ended (or was found ended)

	lastUpdate time.Time
	lastBytes  uint64
	invalid    map[string]int // invalid verdicts per kind since the last accepted step
	deadline   time.Time      // the execution's Total; zero: none
}

// stopError: the rollout is canceled or aborted; the execution is canceled.
type stopError struct{ reason string }

func (e *stopError) Error() string { return e.reason }

// timeoutError: a step (or the wait after it), or the execution, took too
// long; the execution times out.
type timeoutError struct{ reason string }

func (e *timeoutError) Error() string { return e.reason }

func (w *worker) newRun(h Holder, job Job, e Execution) *xrun {
	x := &xrun{w: w, h: h, job: job, e: e, invalid: make(map[string]int)}
	if t := time.Duration(job.Timeout.Total); t > 0 && !e.Started.IsZero() {
		x.deadline = e.Started.Add(t)
	}
	return x
}

// drive takes an in-progress execution to its end, planning each step
// from the device's firmware report.
func (w *worker) drive(ctx context.Context, h Holder, job Job, e Execution) (time.Duration, error) {
	w.r.stats.driving(1)
	w.driving.Store(true)
	defer func() {
		w.driving.Store(false)
		w.r.stats.driving(-1)
	}()
	x := w.newRun(h, job, e)
	defer x.close()
	if e.Token != h.Token || e.Gateway != w.r.cfg.Gateway {
		// Written by another holder (a failover): take it over under our
		// own token, fenced, then resume from the device's report.
		w.log.Info("firmware job: resuming another holder's execution", "job", job.ID, "step", e.Step,
			"bytes", e.Bytes, "from_gateway", e.Gateway, "from_token", e.Token, "token", h.Token)
		if err := x.update(ctx, e.Step, e.Bytes, true); err != nil {
			return w.r.cfg.Retry, err
		}
	}
	for !x.done {
		err := x.checkTotal()
		if err == nil {
			err = x.plan(ctx)
		}
		if se, ok := errors.AsType[*stopError](err); ok {
			err = x.abort(ctx, Canceled, se.reason)
		} else if te, ok := errors.AsType[*timeoutError](err); ok {
			err = x.abort(ctx, TimedOut, te.reason)
		}
		if err != nil {
			return w.r.cfg.Retry, err
		}
	}
	return 0, nil
}

func (x *xrun) close() {
	if x.img != nil {
		if err := x.img.Close(); err != nil {
			x.w.log.Warn("firmware image close", "job", x.job.ID, "err", err)
		}
	}
}

func (x *xrun) checkTotal() error {
	if !x.deadline.IsZero() && !x.w.r.cfg.Now().Before(x.deadline) {
		return &timeoutError{fmt.Sprintf("execution beyond its total timeout %v (step %s)", time.Duration(x.job.Timeout.Total), x.e.Step)}
	}
	return nil
}

// checkStop reads the rollout if it changed since last read: stopping is
// a stopError.
func (x *xrun) checkStop(ctx context.Context) error {
	if !x.w.changed.Swap(false) {
		return nil
	}
	ro, err := x.w.r.store.Rollout(ctx, x.job.ID)
	if err != nil {
		x.w.changed.Store(true) // look again later
		return nil
	}
	if ro.Status.Stopping() {
		return &stopError{stopReason(ro)}
	}
	return nil
}

// plan takes one step from the device's report.
func (x *xrun) plan(ctx context.Context) error {
	if err := x.checkStop(ctx); err != nil {
		return err
	}
	rep, ok := x.w.r.report(x.w.dev)
	if !ok {
		return x.await(ctx, "the device's first firmware report", x.step(), func(fwReport) bool { return true })
	}
	id := x.job.ID
	switch {
	case rep.Job != id && rep.inProgress():
		return x.otherJob(ctx, rep)
	case rep.Job != id && rep.Image != "" && strings.EqualFold(rep.Image, x.job.Image.SHA256):
		return x.finish(ctx, Succeeded, "already running image "+short(rep.Image))
	case rep.Job != id:
		return x.begin(ctx)
	}
	if rep.State != fwjob.Downloading && string(rep.State) != x.e.Step {
		if err := x.update(ctx, string(rep.State), rep.Bytes, true); err != nil || x.done {
			return err
		}
	}
	switch rep.State {
	case fwjob.Downloading:
		return x.download(ctx, rep.Bytes)
	case fwjob.Downloaded:
		return x.install(ctx)
	case fwjob.Installing:
		return x.await(ctx, "the install's verdict", x.step(), x.reached(fwjob.Installed, fwjob.Failed))
	case fwjob.Installed:
		return x.activate(ctx)
	case fwjob.Rebooting:
		return x.await(ctx, "the trial boot's report", x.reboot(), x.reached(fwjob.Confirming, fwjob.RolledBack))
	case fwjob.Confirming:
		return x.commit(ctx)
	case fwjob.Committed:
		return x.finish(ctx, Succeeded, "")
	case fwjob.Failed:
		return x.finish(ctx, Failed, "failed: "+rep.Reason)
	case fwjob.RolledBack:
		return x.finish(ctx, Failed, "rolled back: "+rep.Reason)
	}
	return x.begin(ctx) // idle naming the job: not begun
}

func (x *xrun) step() time.Duration   { return time.Duration(x.job.Timeout.Step) }
func (x *xrun) reboot() time.Duration { return time.Duration(x.job.Timeout.Reboot) }

// reached is a report predicate: the device reports the job in one of
// states, or in any end (failed, rolled back, committed).
func (x *xrun) reached(states ...fwjob.State) func(fwReport) bool {
	return func(p fwReport) bool {
		if p.Job != x.job.ID {
			return false
		}
		for _, s := range states {
			if p.State == s {
				return true
			}
		}
		return !p.inProgress()
	}
}

// newer is a report predicate: a report that arrived after seq.
func newer(seq uint64) func(fwReport) bool { return func(p fwReport) bool { return p.seq > seq } }

// otherJob: the device runs another job. If that job's execution ended
// (or etcd does not know it), it is cleared with fw.cancel; otherwise this
// execution is rejected.
func (x *xrun) otherJob(ctx context.Context, rep fwReport) error {
	oe, err := x.w.r.store.Execution(ctx, x.w.dev, rep.Job)
	if err != nil {
		return fmt.Errorf("jobs: execution of %s: %w", rep.Job, err)
	}
	if oe.Rev != 0 && !oe.Status.Terminal() {
		return x.finish(ctx, Rejected, fmt.Sprintf("job %s in progress (state %s)", rep.Job, rep.State))
	}
	x.w.log.Info("firmware job: clearing a job that ended in etcd", "other", rep.Job, "state", rep.State, "status", oe.Status)
	ack, seq, err := x.send(ctx, fwjob.KindCancel, fwjob.JobBody{Job: rep.Job}, 0)
	switch {
	case err != nil:
		return x.noAck(ctx, fwjob.KindCancel, seq, err)
	case ack.Verdict == fence.Invalid:
		return x.refused(ctx, fwjob.KindCancel, seq, ack.Reason)
	}
	other := rep.Job
	return x.await(ctx, "fw.cancel of job "+other, x.step(), func(p fwReport) bool { return p.Job != other || !p.inProgress() })
}

// finish ends the execution.
func (x *xrun) finish(ctx context.Context, to Status, reason string) error {
	for range 3 {
		_, _, err := x.w.r.store.Finish(ctx, x.e, to, reason, x.h)
		switch {
		case err == nil:
			x.done = true
			x.w.r.stats.end(to)
			x.w.log.Info("firmware job ended", "job", x.job.ID, "status", to, "reason", reason, "token", x.h.Token)
			return nil
		case errors.Is(err, ErrTransition):
			x.done = true // ended already
			return nil
		case errors.Is(err, ErrConflict):
			if err := x.reread(ctx); err != nil || x.done {
				return err
			}
			continue
		}
		return asDeposed(fmt.Errorf("jobs: finish %s %s: %w", x.job.ID, to, err))
	}
	return fmt.Errorf("jobs: finish %s: %w", x.job.ID, ErrConflict)
}

// reread reads the execution again after a conflict; an ended one ends
// the drive.
func (x *xrun) reread(ctx context.Context) error {
	e, err := x.w.r.store.Execution(ctx, x.w.dev, x.job.ID)
	if err != nil {
		return fmt.Errorf("jobs: execution of %s: %w", x.job.ID, err)
	}
	x.e = e
	x.done = e.Status.Terminal() || e.Rev == 0
	return nil
}

// abort sends fw.cancel for the job (the device rolls back if it runs the
// trial) and ends the execution as to.
func (x *xrun) abort(ctx context.Context, to Status, reason string) error {
	x.w.log.Warn("firmware job: aborting", "job", x.job.ID, "status", to, "reason", reason)
	if _, _, err := x.send(ctx, fwjob.KindCancel, fwjob.JobBody{Job: x.job.ID}, 0); errors.Is(err, errDeposed) {
		return err
	}
	return x.finish(ctx, to, reason)
}

// update writes the execution's progress: always when force or the step
// changed, else at most every progressEvery or progressShare of the image.
func (x *xrun) update(ctx context.Context, step string, bytes uint64, force bool) error {
	now := x.w.r.cfg.Now()
	if !force && step == x.e.Step && now.Sub(x.lastUpdate) < progressEvery &&
		(bytes-x.lastBytes)*100 < x.job.Image.Size*progressShare {
		return nil
	}
	e := x.e
	e.Step, e.Bytes, e.Size = step, bytes, x.job.Image.Size
	for range 2 {
		n, err := x.w.r.store.Update(ctx, e, x.h)
		switch {
		case err == nil:
			x.e, x.lastUpdate, x.lastBytes = n, now, bytes
			return nil
		case errors.Is(err, ErrFenced):
			return asDeposed(err)
		case errors.Is(err, ErrConflict):
			if err := x.reread(ctx); err != nil || x.done {
				return err
			}
			e = x.e
			e.Step, e.Bytes = step, bytes
			continue
		case errors.Is(err, ErrTransition):
			x.done = true
			return nil
		}
		// Progress only: the next update carries it.
		x.w.log.Warn("firmware job: progress not written", "job", x.job.ID, "err", err)
		return nil
	}
	return nil
}

func short(hexSum string) string {
	if len(hexSum) > 12 {
		return hexSum[:12]
	}
	return hexSum
}
