package jobs

import (
	"fmt"
	"slices"
	"time"
)

// The rollout decisions, pure functions of the job, the rollout as read
// and the time: Store.Start and Store.Finish apply them in the same etcd
// transaction that writes the execution, so every gateway decides
// against the same rollout state.

// rateWindow is the window of Policy.PerMinute.
const rateWindow = time.Minute

// busyRetry is the RetryAfter hint when executions in progress (the
// concurrency bound or the canaries) hold a start back: it is their end,
// seen on Store.Watch, that allows one.
const busyRetry = 5 * time.Second

// decideStart says whether the rollout allows one more start at now and
// whether it is a canary. Errors: ErrStopped, *NotYetError.
func decideStart(j *Job, r *Rollout, now time.Time) (canary bool, err error) {
	if r.Status != RolloutActive {
		if r.Reason != "" {
			return false, fmt.Errorf("%w: %s (%s)", ErrStopped, r.Status, r.Reason)
		}
		return false, fmt.Errorf("%w: %s", ErrStopped, r.Status)
	}
	limit := j.Rollout.MaxConcurrent
	if limit <= 0 {
		limit = DefaultMaxConcurrent
	}
	if n := r.Counts[InProgress]; n >= limit {
		return false, &NotYetError{Reason: fmt.Sprintf("max_concurrent %d in progress", n), RetryAfter: busyRetry}
	}
	if r.CanaryLeft > 0 && r.CanaryRunning >= r.CanaryLeft {
		return false, &NotYetError{Reason: fmt.Sprintf("canaries running (%d left)", r.CanaryLeft), RetryAfter: busyRetry}
	}
	if pm := j.Rollout.PerMinute; pm > 0 {
		recent := recentStarts(r.Starts, now)
		if len(recent) >= pm {
			return false, &NotYetError{Reason: fmt.Sprintf("rate %d/min", pm), RetryAfter: recent[0].Add(rateWindow).Sub(now)}
		}
	}
	return r.CanaryLeft > 0, nil
}

// recentStarts returns the starts within the rate window before now,
// oldest first.
func recentStarts(starts []time.Time, now time.Time) []time.Time {
	var out []time.Time
	for _, t := range starts {
		if now.Sub(t) < rateWindow {
			out = append(out, t)
		}
	}
	slices.SortFunc(out, func(a, b time.Time) int { return a.Compare(b) })
	return out
}

// applyStart records a start decided by decideStart.
func applyStart(j *Job, r *Rollout, canary bool, now time.Time) {
	move(r, Queued, InProgress)
	r.Started++
	if canary {
		r.CanaryRunning++
	}
	if j.Rollout.PerMinute > 0 {
		r.Starts = append(recentStarts(r.Starts, now), now)
	} else {
		r.Starts = nil
	}
	r.Updated = now
}

// failure reports whether an execution that ended in s counts against
// the rollout: failed, timed_out and rejected do; succeeded and canceled
// (the operator's or the rollout's doing, not the image's) do not.
func failure(s Status) bool { return s == Failed || s == TimedOut || s == Rejected }

// applyFinish records the end of e (queued or in progress as read) in
// to, and decides whether the rollout aborts or completes.
func applyFinish(j *Job, r *Rollout, e *Execution, to Status, reason string, now time.Time) {
	move(r, e.Status, to)
	r.Updated = now
	if e.Canary && e.Status == InProgress {
		r.CanaryRunning = max(0, r.CanaryRunning-1)
		switch {
		case to == Succeeded:
			r.CanaryLeft = max(0, r.CanaryLeft-1)
		case failure(to) && (r.Status == RolloutActive || r.Status == RolloutPaused):
			r.Status = RolloutAborted
			r.Reason = fmt.Sprintf("canary %s %s: %s", e.Device, to, orNone(reason))
			return
		}
	}
	if r.Status != RolloutActive && r.Status != RolloutPaused {
		return
	}
	if why, ok := abortRatio(j, r); ok {
		r.Status, r.Reason = RolloutAborted, why
		return
	}
	if done(j, r) {
		r.Status, r.Reason = RolloutCompleted, ""
	}
}

// abortRatio decides the abort policy: after MinExecutions (at least 1)
// executions ended succeeded or failing, the share of failing ones
// reaching FailureRatio aborts. Canceled executions count neither way.
func abortRatio(j *Job, r *Rollout) (string, bool) {
	ratio := j.Rollout.Abort.FailureRatio
	if ratio <= 0 {
		return "", false
	}
	failed := r.Counts[Failed] + r.Counts[TimedOut] + r.Counts[Rejected]
	decided := failed + r.Counts[Succeeded]
	if decided < max(1, j.Rollout.Abort.MinExecutions) || float64(failed) < ratio*float64(decided) {
		return "", false
	}
	return fmt.Sprintf("failures %d of %d ended executions (%.0f%%) reached the abort ratio %.0f%% (min %d)",
		failed, decided, 100*float64(failed)/float64(decided), 100*ratio, j.Rollout.Abort.MinExecutions), true
}

// done reports whether every target of a job that lists its devices (and
// no patterns) has an ended execution.
func done(j *Job, r *Rollout) bool {
	if len(j.Targets.Match) > 0 || len(j.Targets.Devices) == 0 {
		return false
	}
	ended := 0
	for _, s := range Statuses {
		if s.Terminal() {
			ended += r.Counts[s]
		}
	}
	return ended >= len(uniq(j.Targets.Devices))
}

func uniq(ids []string) []string {
	out := slices.Clone(ids)
	slices.Sort(out)
	return slices.Compact(out)
}

// move moves one execution from one status's count to another's.
func move(r *Rollout, from, to Status) {
	if r.Counts == nil {
		r.Counts = make(map[Status]int)
	}
	if from != "" && r.Counts[from] > 0 {
		r.Counts[from]--
	}
	r.Counts[to]++
}

// rolloutTransition checks an operator's change of a rollout's status:
// pause (active → paused), resume (paused → active), cancel (active or
// paused → canceled). Aborted, completed and canceled are ends.
func rolloutTransition(from, to RolloutStatus) error {
	ok := false
	switch to {
	case RolloutPaused:
		ok = from == RolloutActive
	case RolloutActive:
		ok = from == RolloutPaused
	case RolloutCanceled:
		ok = from == RolloutActive || from == RolloutPaused
	}
	if !ok {
		return fmt.Errorf("%w: rollout %s → %s", ErrTransition, from, to)
	}
	return nil
}

func orNone(s string) string {
	if s == "" {
		return "no reason given"
	}
	return s
}
