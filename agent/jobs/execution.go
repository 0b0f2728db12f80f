package jobs

import (
	"time"

	"github.com/edgefence/edgefence/fence"
)

// Status is an execution's status, AWS IoT Jobs' vocabulary.
type Status string

// Execution statuses. Queued and InProgress are the live ones; the rest
// are terminal: an execution in one of them is never written again.
const (
	Queued     Status = "queued"
	InProgress Status = "in_progress"
	Succeeded  Status = "succeeded"
	Failed     Status = "failed"
	TimedOut   Status = "timed_out"
	Rejected   Status = "rejected" // the device refused the job (anti-rollback, another job in progress, bad manifest)
	Canceled   Status = "canceled"
)

// Statuses lists every execution status, live ones first.
var Statuses = []Status{Queued, InProgress, Succeeded, Failed, TimedOut, Rejected, Canceled}

// Terminal reports whether s is an end.
func (s Status) Terminal() bool {
	switch s {
	case Succeeded, Failed, TimedOut, Rejected, Canceled:
		return true
	}
	return false
}

// Valid reports whether s is an execution status.
func (s Status) Valid() bool {
	for _, v := range Statuses {
		if s == v {
			return true
		}
	}
	return false
}

// Execution is one device's execution of a job,
// P/devices/<device>/jobs/<job> (and its copy P/executions/<job>/<device>).
type Execution struct {
	Job    string `json:"job"`
	Device string `json:"device"`
	Status Status `json:"status"`
	// Step is the device's firmware state (devices/fwjob State) as last
	// known: downloading, installed, confirming, …
	Step   string `json:"step,omitempty"`
	Bytes  uint64 `json:"bytes,omitempty"`
	Size   uint64 `json:"size,omitempty"`
	Reason string `json:"reason,omitempty"`
	// Canary: the execution started as one of the rollout's canaries.
	Canary bool `json:"canary,omitempty"`
	// Gateway and Token are the writer's: the holder that last wrote it.
	Gateway string      `json:"gateway,omitempty"`
	Token   fence.Token `json:"token,omitempty"`
	// Version counts the execution's writes (1 for the first), as AWS IoT
	// Jobs' versionNumber.
	Version  int64     `json:"version"`
	Queued   time.Time `json:"queued_at,omitzero"`
	Started  time.Time `json:"started_at,omitzero"`
	Updated  time.Time `json:"updated_at,omitzero"`
	Finished time.Time `json:"finished_at,omitzero"`

	// Rev is the etcd ModRevision the execution was read at (0: absent);
	// not stored.
	Rev int64 `json:"-"`
}

// Holder is who writes a device's execution: the device's current lease
// holder, by its lock key and token (I5).
type Holder struct {
	Gateway string
	LockKey string
	Token   fence.Token
}
