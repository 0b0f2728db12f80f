// Package history records what fence points and outboxes decide, as JSON
// lines, and checks a recorded history against the invariants
// (docs/ARCHITECTURE.md): I1 — per device, accepted tokens never decrease
// and nothing below an accepted token is accepted again — and I4 — every
// command created has exactly one terminal state.
//
// Each process appends to its own file (or several to one file opened with
// O_APPEND: every event is a single write(2), so lines never interleave). A
// process killed with SIGKILL leaves at most a torn last line, which Read
// skips.
package history

import (
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"
)

// Ops of an Event.
const (
	// OpCreated: an agent durably queued a command (outbox append).
	OpCreated = "created"
	// OpVerdict: a fence point decided on a command (device shim or
	// gateway fence table). Verdict is the fence point's verdict.
	OpVerdict = "verdict"
	// OpTerminal: the agent recorded the command's terminal state in its
	// outbox (Resolve or expiry). Verdict is the terminal state.
	OpTerminal = "terminal"
	// OpApplied: the device applied the command's effect (after a
	// gateway fence table: the serial device answered).
	OpApplied = "applied"
)

// Event is one line of a history.
type Event struct {
	Time    time.Time `json:"t"`
	Source  string    `json:"src"` // who wrote it, e.g. "shim", "table:gw1", "outbox:gw1"
	Op      string    `json:"op"`
	Device  string    `json:"dev"`
	ID      string    `json:"id"`
	Token   uint64    `json:"token"`
	Seq     uint64    `json:"seq"`
	Kind    string    `json:"kind,omitempty"`
	Verdict string    `json:"verdict,omitempty"` // accepted, duplicate, stale, invalid, expired
	Reason  string    `json:"reason,omitempty"`
}

// Writer appends events to a file. A nil *Writer records nothing, so
// callers need no checks. It is safe for concurrent use.
type Writer struct {
	mu     sync.Mutex
	f      *os.File
	source string
}

// Create opens path for appending (creating it) and returns a Writer whose
// events carry source when they have none.
func Create(path, source string) (*Writer, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("history: %w", err)
	}
	return &Writer{f: f, source: source}, nil
}

// Record appends e as one line; a zero Time becomes now.
func (w *Writer) Record(e Event) error {
	if w == nil {
		return nil
	}
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	if e.Source == "" {
		e.Source = w.source
	}
	b, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("history: %w", err)
	}
	b = append(b, '\n')
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, err := w.f.Write(b); err != nil {
		return fmt.Errorf("history: %w", err)
	}
	return nil
}

// Close closes the file.
func (w *Writer) Close() error {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.f.Close()
}
