// Package history records what fence points and outboxes decide, as JSON
// lines, and checks a recorded history against the invariants
// (docs/ARCHITECTURE.md): I1 — per device, accepted tokens never decrease
// and nothing below an accepted token is accepted again — and I4 — every
// command created has exactly one terminal state; with firmware steps
// (fw.* kinds, Event.Job) also FW1 — at most one fw.activate of a job
// accepted per device (firmware.go); with signers and revocation lists
// recorded (Event.Signer, OpTrust) also T1 — nothing a revoked key signed
// is admitted after the fence point learned the revocation
// (revocation.go).
//
// Every event is a single write(2) to an O_APPEND file, so several
// processes may share a file and a SIGKILL leaves at most a torn last line,
// which Read skips; a Writer reopening the file seals it off (OpOpened).
//
// A fence point records each decision before the commit that makes it
// durable, so a logged accept may never have taken effect. When it opens
// its store again (and after a failed commit) it calls Writer.Recover,
// which records an OpOpened event {Source, Device, Token, Seq: the durable
// mark} per device. Check discards, first, every accept of source S for
// device D above the (token, seq) of S's next OpOpened for D
// (Report.Uncommitted counts them); a source must name one fence point
// across its restarts. Why before and not after: docs/ARCHITECTURE.md,
// "Fault injection".
//
// Fence points record with a Writer (devices/shim: Options.History;
// edgefence-devsim: --history). Read loads files; Check (or CheckWith)
// returns a Report whose Violations name the invariant, device and command.
// Package fence/history/linear checks the same events for linearizability
// against a fenced register model (porcupine).
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
	// OpOpened without a Device: Create found the file's last line torn
	// (its previous writer was killed mid-write) and sealed it off; Read
	// skips the torn line before it. Check ignores it.
	//
	// OpOpened with a Device: the fence point Source (re)read the device's
	// durable high-water mark, Token/Seq, from its store — when it opened
	// the store after a restart, or after a commit failed — and some of
	// its accepts of the device recorded since its previous OpOpened for
	// the device are above it: those were recorded before their commit
	// and never committed. Check discards them (Writer.Recover writes
	// these events).
	OpOpened = "opened"
	// OpTrust: the fence point Source committed a revocation list (it
	// learned it over the air, or was given it); from this event on, in
	// Source's order, it refuses the key ids in Revoked for every device
	// it serves. Device is the device the list came for, Reason names its
	// version. Recorded after the commit, so a crash in between loses the
	// line, never claims a list not in effect (revocation.go).
	OpTrust = "trust"
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
	// Job and Image say what a firmware step (fw.* kinds, devices/fwjob)
	// is about: the job id of its body, and for fw.begin the image's
	// SHA-256 in hex. Empty for other kinds and for a body that does not
	// decode (older files have neither).
	Job   string `json:"job,omitempty"`
	Image string `json:"image,omitempty"`
	// Signer is the key id that signed the command of an OpVerdict at a
	// fence point that verifies signatures (claimed, if it was refused
	// before its signature was checked); empty for a plain envelope.
	Signer string `json:"kid,omitempty"`
	// Revoked are the key ids an OpTrust event's revocation list names.
	Revoked []string `json:"revoked,omitempty"`
}

// Writer appends events to a file. A nil *Writer records nothing, so
// callers need no checks. It is safe for concurrent use.
type Writer struct {
	mu      sync.Mutex
	f       *os.File
	source  string
	pending map[string]mark // per device: highest accept of source since its last OpOpened
}

// Create opens path for appending (creating it) and returns a Writer whose
// events carry source when they have none.
//
// If the file's last line is torn (no final newline: a writer was killed
// mid-line), Create first appends a newline and an OpOpened event, so that
// the torn line stays a line of its own that Read knows to skip. Create
// reads the accepts source has already recorded in the file, for Recover.
func Create(path, source string) (*Writer, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("history: %w", err)
	}
	w := &Writer{f: f, source: source, pending: map[string]mark{}}
	if err := w.scan(); err != nil {
		f.Close()
		return nil, err
	}
	if err := w.seal(); err != nil {
		f.Close()
		return nil, err
	}
	return w, nil
}

// seal ends a torn last line with a newline and an OpOpened event. With
// other writers appending concurrently the worst case is an extra blank
// line, which Read skips.
func (w *Writer) seal() error {
	fi, err := w.f.Stat()
	if err != nil {
		return fmt.Errorf("history: %w", err)
	}
	if fi.Size() == 0 {
		return nil
	}
	last := make([]byte, 1)
	if _, err := w.f.ReadAt(last, fi.Size()-1); err != nil {
		return fmt.Errorf("history: %w", err)
	}
	if last[0] == '\n' {
		return nil
	}
	b, err := json.Marshal(Event{Time: time.Now(), Source: w.source, Op: OpOpened,
		Reason: "last line torn (writer killed mid-write); sealed off"})
	if err != nil {
		return fmt.Errorf("history: %w", err)
	}
	b = append(append([]byte{'\n'}, b...), '\n')
	if _, err := w.f.Write(b); err != nil {
		return fmt.Errorf("history: %w", err)
	}
	return nil
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
	w.note(e)
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
