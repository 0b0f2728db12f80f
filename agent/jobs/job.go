package jobs

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path"
	"time"

	"github.com/edgefence/edgefence/devices/fwjob"
	"github.com/edgefence/edgefence/fence"
)

// Defaults of a job document's optional fields.
const (
	DefaultChunk         = 16 << 10
	DefaultMaxConcurrent = 10
	DefaultStepTimeout   = 5 * time.Minute
	DefaultRebootTimeout = 10 * time.Minute
	MaxJobIDLen          = fwjob.MaxJobLen
	MaxTargets           = 10000
)

// Job is a job document, P/jobs/<id>. It does not change after it is
// created; what changes (pause, resume, cancel, abort, counts) is the
// Rollout.
type Job struct {
	ID      string    `json:"id"`
	Image   ImageRef  `json:"image"`
	Chunk   int       `json:"chunk,omitempty"` // bytes per fw.chunk; 0: DefaultChunk
	Targets Targets   `json:"targets"`
	Rollout Policy    `json:"rollout"`
	Timeout Timeouts  `json:"timeouts"`
	Created time.Time `json:"created"`
	By      string    `json:"by,omitempty"` // who created it (information)
}

// ImageRef names the image a job installs. The gateways fetch it by URL
// (file:///… or http(s)://… on the site network) into their content
// addressed cache and check it against SHA256 and Size.
type ImageRef struct {
	SHA256  string `json:"sha256"`  // hex, 64 characters
	Size    uint64 `json:"size"`    // bytes
	Version uint64 `json:"version"` // the image's security version (anti-rollback)
	URL     string `json:"url"`
	Name    string `json:"name,omitempty"`
	// Manifest is the operator's signed manifest of the image (COSE_Sign1,
	// fence/auth), sent to the device in fw.begin; empty: none.
	Manifest []byte `json:"manifest,omitempty"`
}

// Targets selects the devices of a job: those listed, and those whose id
// matches one of the patterns (path.Match), among the devices the
// gateways are configured with.
type Targets struct {
	Devices []string `json:"devices,omitempty"`
	Match   []string `json:"match,omitempty"`
}

// Policy is a job's rollout configuration.
type Policy struct {
	// MaxConcurrent bounds the executions in progress at once over every
	// gateway; 0: DefaultMaxConcurrent.
	MaxConcurrent int `json:"max_concurrent,omitempty"`
	// PerMinute bounds the executions started in any minute; 0: no bound.
	PerMinute int `json:"per_minute,omitempty"`
	// Canary executions go first: no other starts until they all
	// succeeded; a failed canary aborts the rollout.
	Canary int `json:"canary,omitempty"`
	// Abort stops the rollout when, once MinExecutions (at least 1) ended
	// succeeded or failing, the share of failing ones (failed, timed_out,
	// rejected) reaches FailureRatio; canceled executions count neither
	// way. Zero FailureRatio: never.
	Abort AbortPolicy `json:"abort,omitempty"`
}

// AbortPolicy is when a rollout aborts.
type AbortPolicy struct {
	FailureRatio  float64 `json:"failure_ratio,omitempty"`
	MinExecutions int     `json:"min_executions,omitempty"`
}

// Timeouts bound a job's steps at each device.
type Timeouts struct {
	// Step bounds any one step (a chunk, an install, a commit) and the
	// wait for the device's report after it; 0: DefaultStepTimeout.
	Step Duration `json:"step,omitempty"`
	// Reboot bounds the wait from fw.activate to the device's report of
	// its trial boot (confirming or rolled_back); 0: DefaultRebootTimeout.
	Reboot Duration `json:"reboot,omitempty"`
	// Total bounds the execution from its start; 0: none.
	Total Duration `json:"total,omitempty"`
}

// Duration is a time.Duration written as Go's duration text ("5m").
type Duration time.Duration

// MarshalJSON writes d as text.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads text ("90s") or a number of nanoseconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		var n int64
		if err := json.Unmarshal(b, &n); err != nil {
			return fmt.Errorf("duration: want text such as \"5m\": %s", b)
		}
		*d = Duration(n)
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration %q: %w", s, err)
	}
	*d = Duration(v)
	return nil
}

// ApplyDefaults fills in the optional fields left zero.
func (j *Job) ApplyDefaults() {
	if j.Chunk == 0 {
		j.Chunk = DefaultChunk
	}
	if j.Rollout.MaxConcurrent == 0 {
		j.Rollout.MaxConcurrent = DefaultMaxConcurrent
	}
	if j.Timeout.Step == 0 {
		j.Timeout.Step = Duration(DefaultStepTimeout)
	}
	if j.Timeout.Reboot == 0 {
		j.Timeout.Reboot = Duration(DefaultRebootTimeout)
	}
}

// Validate checks a job document; errors wrap ErrInvalidJob.
func (j *Job) Validate() error {
	if err := ValidateID(j.ID); err != nil {
		return err
	}
	if _, err := j.Image.Hash(); err != nil {
		return err
	}
	switch {
	case j.Image.Size == 0:
		return invalidf("image size 0")
	case j.Image.URL == "":
		return invalidf("image url missing")
	case j.Chunk < 0 || j.Chunk > fwjob.MaxChunk:
		return invalidf("chunk %d: want 1 to %d bytes", j.Chunk, fwjob.MaxChunk)
	case len(j.Targets.Devices) == 0 && len(j.Targets.Match) == 0:
		return invalidf("no targets: list devices or match patterns")
	case len(j.Targets.Devices)+len(j.Targets.Match) > MaxTargets:
		return invalidf("%d targets: at most %d", len(j.Targets.Devices)+len(j.Targets.Match), MaxTargets)
	case j.Rollout.MaxConcurrent < 0 || j.Rollout.PerMinute < 0 || j.Rollout.Canary < 0 || j.Rollout.Abort.MinExecutions < 0:
		return invalidf("rollout: negative limit")
	case j.Rollout.Abort.FailureRatio < 0 || j.Rollout.Abort.FailureRatio > 1:
		return invalidf("rollout: abort failure_ratio %v: want 0 to 1", j.Rollout.Abort.FailureRatio)
	case j.Timeout.Step < 0 || j.Timeout.Reboot < 0 || j.Timeout.Total < 0:
		return invalidf("timeouts: negative")
	}
	for _, d := range j.Targets.Devices {
		if err := fence.ValidateDeviceID(d); err != nil {
			return invalidf("target %q: %v", d, err)
		}
	}
	for _, p := range j.Targets.Match {
		if _, err := path.Match(p, ""); err != nil {
			return invalidf("target pattern %q: %v", p, err)
		}
	}
	return nil
}

// Hash returns the image's SHA-256.
func (r ImageRef) Hash() ([]byte, error) {
	h, err := hex.DecodeString(r.SHA256)
	if err != nil || len(h) != 32 {
		return nil, invalidf("image sha256 %q: want 64 hex characters", r.SHA256)
	}
	return h, nil
}

// Selects reports whether the job targets device id.
func (j *Job) Selects(id string) bool {
	for _, d := range j.Targets.Devices {
		if d == id {
			return true
		}
	}
	for _, p := range j.Targets.Match {
		if ok, _ := path.Match(p, id); ok {
			return true
		}
	}
	return false
}

// ValidateID checks a job id: 1 to MaxJobIDLen characters of
// [A-Za-z0-9._-], not starting with '.' (a key segment and the fw.* job).
func ValidateID(id string) error {
	if err := fence.ValidateDeviceID(id); err != nil || len(id) > MaxJobIDLen {
		return invalidf("job id %q: want 1 to %d characters of [A-Za-z0-9._-], not starting with '.'", id, MaxJobIDLen)
	}
	return nil
}
