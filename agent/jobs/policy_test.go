package jobs

import (
	"errors"
	"testing"
	"time"
)

func TestDecideStart(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	job := func(p Policy) *Job { return &Job{Rollout: p} }
	for _, c := range []struct {
		name   string
		j      *Job
		r      Rollout
		canary bool
		err    error
		reason string
		retry  time.Duration
	}{
		{"free", job(Policy{MaxConcurrent: 2}), Rollout{Status: RolloutActive}, false, nil, "", 0},
		{"default limit", job(Policy{}), Rollout{Status: RolloutActive, Counts: map[Status]int{InProgress: DefaultMaxConcurrent}}, false, ErrNotYet, "max_concurrent 10 in progress", busyRetry},
		{"full", job(Policy{MaxConcurrent: 2}), Rollout{Status: RolloutActive, Counts: map[Status]int{InProgress: 2}}, false, ErrNotYet, "max_concurrent 2 in progress", busyRetry},
		{"paused", job(Policy{}), Rollout{Status: RolloutPaused}, false, ErrStopped, "", 0},
		{"completed", job(Policy{}), Rollout{Status: RolloutCompleted}, false, ErrStopped, "", 0},
		{"canary", job(Policy{Canary: 2}), Rollout{Status: RolloutActive, CanaryLeft: 2, CanaryRunning: 1}, true, nil, "", 0},
		{"canaries running", job(Policy{Canary: 2}), Rollout{Status: RolloutActive, CanaryLeft: 1, CanaryRunning: 1}, false, ErrNotYet, "canaries running (1 left)", busyRetry},
		{"rate", job(Policy{PerMinute: 2}), Rollout{Status: RolloutActive, Starts: []time.Time{now.Add(-10 * time.Second), now.Add(-50 * time.Second)}}, false, ErrNotYet, "rate 2/min", 10 * time.Second},
		{"rate, old starts", job(Policy{PerMinute: 2}), Rollout{Status: RolloutActive, Starts: []time.Time{now.Add(-10 * time.Second), now.Add(-60 * time.Second)}}, false, nil, "", 0},
	} {
		canary, err := decideStart(c.j, &c.r, now)
		var ny *NotYetError
		switch {
		case canary != c.canary || !errors.Is(err, c.err) || (c.err == nil) != (err == nil):
			t.Errorf("%s: canary %v, %v; want %v, %v", c.name, canary, err, c.canary, c.err)
		case errors.As(err, &ny) && (ny.Reason != c.reason || ny.RetryAfter != c.retry):
			t.Errorf("%s: %q retry %v; want %q retry %v", c.name, ny.Reason, ny.RetryAfter, c.reason, c.retry)
		}
	}
}

func TestApplyFinishAbortRatio(t *testing.T) {
	j := &Job{Targets: Targets{Match: []string{"*"}}, Rollout: Policy{Abort: AbortPolicy{FailureRatio: 0.25}}}
	r := &Rollout{Status: RolloutActive, Counts: map[Status]int{InProgress: 5}}
	e := &Execution{Device: "d", Status: InProgress}
	// MinExecutions 0 is 1: the first failure is 100%.
	applyFinish(j, r, e, Failed, "x", time.Time{})
	if r.Status != RolloutAborted {
		t.Fatalf("%+v", r)
	}
	j.Rollout.Abort.MinExecutions = 4
	r = &Rollout{Status: RolloutActive, Counts: map[Status]int{InProgress: 5}}
	for i, to := range []Status{Succeeded, Canceled, Canceled, Succeeded, Rejected} {
		applyFinish(j, r, e, to, "", time.Time{})
		if r.Status != RolloutActive {
			t.Fatalf("after %d (%s): %+v", i, to, r)
		}
	}
	// The fourth decided one (canceled ones count neither way): 1 failing of 4 reaches 0.25.
	applyFinish(j, r, e, Succeeded, "", time.Time{})
	if r.Status != RolloutAborted {
		t.Fatalf("1 failing of 4 decided at ratio 0.25: %+v", r)
	}
}

func TestRolloutTransition(t *testing.T) {
	all := []RolloutStatus{RolloutActive, RolloutPaused, RolloutCanceled, RolloutAborted, RolloutCompleted}
	ok := map[[2]RolloutStatus]bool{
		{RolloutActive, RolloutPaused}: true, {RolloutPaused, RolloutActive}: true,
		{RolloutActive, RolloutCanceled}: true, {RolloutPaused, RolloutCanceled}: true,
	}
	for _, from := range all {
		for _, to := range all {
			err := rolloutTransition(from, to)
			if (err == nil) != ok[[2]RolloutStatus{from, to}] || err != nil && !errors.Is(err, ErrTransition) {
				t.Errorf("%s → %s: %v", from, to, err)
			}
		}
	}
}
