package jobs

import (
	"errors"
	"fmt"
	"time"
)

// Errors callers test with errors.Is.
var (
	// ErrInvalidJob: a job document (or a request about one) is malformed.
	ErrInvalidJob = errors.New("jobs: invalid job")
	// ErrNoJob: no job document with that id.
	ErrNoJob = errors.New("jobs: no such job")
	// ErrExists: a job with that id exists already.
	ErrExists = errors.New("jobs: job exists")
	// ErrFenced: the writer's lock key no longer exists with its token; it
	// is not the device's holder any more and wrote nothing.
	ErrFenced = errors.New("jobs: fenced: not the holder")
	// ErrConflict: the execution (or the rollout) changed since it was
	// read; read it again.
	ErrConflict = errors.New("jobs: changed since read")
	// ErrNotYet: the rollout does not allow this start now (concurrency,
	// rate, canaries still running); try again later.
	ErrNotYet = errors.New("jobs: not yet")
	// ErrStopped: the rollout is paused, canceled, aborted or completed.
	ErrStopped = errors.New("jobs: rollout not active")
	// ErrTransition: an execution or rollout status change that is not
	// allowed (from a terminal status, or pause of a canceled rollout).
	ErrTransition = errors.New("jobs: status change not allowed")
)

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidJob, fmt.Sprintf(format, args...))
}

// NotYetError is Store.Start's answer when the rollout does not allow a
// start now; errors.Is(err, ErrNotYet).
type NotYetError struct {
	// Reason says which limit: "max_concurrent 10 in progress",
	// "canaries running (2 left)", "rate 5/min".
	Reason string
	// RetryAfter is a hint: when the limit may allow a start again (the
	// rate's oldest start leaving the minute); a change of the rollout
	// (Store.Watch) may allow one sooner.
	RetryAfter time.Duration
}

func (e *NotYetError) Error() string { return ErrNotYet.Error() + ": " + e.Reason }

// Unwrap makes errors.Is(err, ErrNotYet) hold.
func (e *NotYetError) Unwrap() error { return ErrNotYet }
