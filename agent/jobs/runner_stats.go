package jobs

import (
	"maps"
	"sync"
)

// RunnerStats are the runner's counters since NewRunner.
type RunnerStats struct {
	// Ended counts the executions this gateway ended, by status.
	Ended map[Status]uint64 `json:"ended"`
	// Steps counts the firmware steps sent, by kind (fw.begin, …) and
	// the device's verdict (accepted, duplicate, stale, invalid, expired,
	// unknown; "none" when no ack came back).
	Steps map[string]map[string]uint64 `json:"steps"`
	// ImageBytes counts the image bytes of the chunks the devices accepted.
	ImageBytes uint64 `json:"image_bytes"`
	// InProgress is the executions this gateway drives now.
	InProgress int `json:"in_progress"`
	// BadReports counts firmware reports that did not parse.
	BadReports uint64 `json:"bad_reports"`
	// Changes counts the job and rollout changes the runner has passed
	// on to its workers.
	Changes uint64 `json:"changes"`
}

// runnerStats is the runner's counters; mu is a leaf lock.
type runnerStats struct {
	mu         sync.Mutex
	ended      map[Status]uint64
	steps      map[string]map[string]uint64
	bytes      uint64
	inProgress int
	bad        uint64
	changes    uint64
}

func (s *runnerStats) init() {
	s.ended = make(map[Status]uint64)
	s.steps = make(map[string]map[string]uint64)
}

func (s *runnerStats) step(kind, verdict string, bytes int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.steps[kind] == nil {
		s.steps[kind] = make(map[string]uint64)
	}
	s.steps[kind][verdict]++
	s.bytes += uint64(bytes)
}

func (s *runnerStats) end(st Status) {
	s.mu.Lock()
	s.ended[st]++
	s.mu.Unlock()
}

func (s *runnerStats) driving(d int) {
	s.mu.Lock()
	s.inProgress += d
	s.mu.Unlock()
}

func (s *runnerStats) changed() {
	s.mu.Lock()
	s.changes++
	s.mu.Unlock()
}

func (s *runnerStats) badReport() {
	s.mu.Lock()
	s.bad++
	s.mu.Unlock()
}

// Stats returns a snapshot of the runner's counters.
func (r *Runner) Stats() RunnerStats {
	s := &r.stats
	s.mu.Lock()
	defer s.mu.Unlock()
	out := RunnerStats{Ended: maps.Clone(s.ended), Steps: make(map[string]map[string]uint64, len(s.steps)),
		ImageBytes: s.bytes, InProgress: s.inProgress, BadReports: s.bad, Changes: s.changes}
	for k, v := range s.steps {
		out.Steps[k] = maps.Clone(v)
	}
	return out
}
