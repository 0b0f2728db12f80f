package jobs

import "time"

// RolloutStatus is a rollout's status.
type RolloutStatus string

// Rollout statuses. Active starts executions; Paused starts none (those in
// progress go on); Canceled and Aborted start none and cancel those in
// progress (the device rolls back where it can); Completed: every target
// execution ended.
const (
	RolloutActive    RolloutStatus = "active"
	RolloutPaused    RolloutStatus = "paused"
	RolloutCanceled  RolloutStatus = "canceled"
	RolloutAborted   RolloutStatus = "aborted"
	RolloutCompleted RolloutStatus = "completed"
)

// Stopping reports whether executions in progress are to be canceled.
func (s RolloutStatus) Stopping() bool { return s == RolloutCanceled || s == RolloutAborted }

// Rollout is a job's shared rollout state, P/rollouts/<job>: every
// gateway's start and finish of an execution updates it in the same etcd
// transaction as the execution, so they all decide against one state.
type Rollout struct {
	Job    string        `json:"job"`
	Status RolloutStatus `json:"status"`
	Reason string        `json:"reason,omitempty"` // why paused, canceled or aborted
	// Counts is the number of executions per status.
	Counts map[Status]int `json:"counts"`
	// Started counts the executions ever started; CanaryLeft the canaries
	// not yet succeeded; CanaryRunning the canaries in progress (a canary
	// canceled while the rollout goes on frees its place for another).
	Started       int `json:"started"`
	CanaryLeft    int `json:"canary_left,omitempty"`
	CanaryRunning int `json:"canary_running,omitempty"`
	// Starts holds the start times within the last minute (Policy.PerMinute).
	Starts  []time.Time `json:"starts,omitempty"`
	Updated time.Time   `json:"updated_at"`

	// Rev is the etcd ModRevision it was read at; not stored.
	Rev int64 `json:"-"`
}
