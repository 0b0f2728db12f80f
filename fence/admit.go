package fence

import (
	"encoding"
	"fmt"
	"strconv"
)

// Token is a fencing token: the etcd CreateRevision of the holder's lock key.
// Zero is never a valid token.
type Token uint64

// Mark is a fence point's high-water mark for one device: the highest token it
// has accepted and the last sequence number accepted under that token.
type Mark struct {
	Token Token  `json:"token" cbor:"1,keyasint"`
	Seq   uint64 `json:"seq" cbor:"2,keyasint"`
}

func (m Mark) String() string { return fmt.Sprintf("%d/%d", m.Token, m.Seq) }

// Verdict is the terminal state of a command at a fence point (and, for
// Expired, in the agent's outbox).
type Verdict uint8

// The verdicts. The zero value is not a verdict.
const (
	Accepted  Verdict = 1 // applied; the high-water mark moved
	Duplicate Verdict = 2 // already applied; acknowledged again, not re-applied
	Stale     Verdict = 3 // token below the high-water mark; refused
	Invalid   Verdict = 4 // malformed or failed validation; refused
	Expired   Verdict = 5 // never delivered within its time to live
	// Unknown: admitted and sent to a device that cannot check tokens,
	// which then gave no answer, and the command is not one that may be
	// sent again (not idempotent): it may or may not have been applied. A
	// gateway fence point's verdict (agent/bridge), terminal: the command
	// is never repeated; the operator checks the device.
	Unknown Verdict = 6
)

var verdictNames = [...]string{"", "accepted", "duplicate", "stale", "invalid", "expired", "unknown"}

func (v Verdict) String() string {
	if int(v) < len(verdictNames) && v != 0 {
		return verdictNames[v]
	}
	return "verdict(" + strconv.Itoa(int(v)) + ")"
}

// Valid reports whether v is one of the defined verdicts.
func (v Verdict) Valid() bool { return v >= Accepted && v <= Unknown }

// Err returns nil for Accepted and the matching sentinel error otherwise.
func (v Verdict) Err() error {
	switch v {
	case Accepted:
		return nil
	case Duplicate:
		return ErrDuplicate
	case Stale:
		return ErrStale
	case Expired:
		return ErrExpired
	case Unknown:
		return ErrUnknown
	default:
		return ErrInvalid
	}
}

var (
	_ encoding.TextMarshaler   = Verdict(0)
	_ encoding.TextUnmarshaler = (*Verdict)(nil)
)

// MarshalText encodes the verdict by name, for JSON logs.
func (v Verdict) MarshalText() ([]byte, error) {
	if !v.Valid() {
		return nil, fmt.Errorf("fence: marshal %v: unknown verdict", v)
	}
	return []byte(v.String()), nil
}

// UnmarshalText parses a verdict name.
func (v *Verdict) UnmarshalText(b []byte) error {
	for i, n := range verdictNames {
		if i > 0 && n == string(b) {
			*v = Verdict(i)
			return nil
		}
	}
	return fmt.Errorf("fence: unknown verdict %q", b)
}

// Admit is the admit rule, the single decision every fence point makes. Given
// the current high-water mark m and a command stamped with token t and
// sequence seq, it returns the verdict and the mark after the decision.
//
// Only an Accepted verdict moves the mark; the caller must persist the new
// mark durably before the command takes effect. Token 0 and seq 0 are
// Invalid: tokens are etcd revisions (≥ 1) and seqs start at 1 under each
// token.
func Admit(m Mark, t Token, seq uint64) (Verdict, Mark) {
	switch {
	case t == 0 || seq == 0:
		return Invalid, m
	case t > m.Token:
		return Accepted, Mark{Token: t, Seq: seq}
	case t < m.Token:
		return Stale, m
	case seq > m.Seq:
		return Accepted, Mark{Token: t, Seq: seq}
	default:
		return Duplicate, m
	}
}

// Epochs close the past. A device's fence state at a fence point has an
// epoch: a number that only goes up, and only by a statement signed by the
// operator's root (fence/auth: a fleet epoch statement, or a reset, which
// carries one). A command carries the epoch it was issued in (Envelope.Epoch),
// and the fence point compares it before the token: no command issued before
// an epoch began is admitted after, whatever its token, so a reset or a
// recovery after an etcd rebuild cannot re-open old signatures.

// State is one device's fence state at a fence point: the epoch it is at
// and its high-water mark accepted in that epoch (the zero Mark: none yet).
// A stored mark carries the epoch it was accepted in (MarkRecord.Epoch).
type State struct {
	Epoch uint64 `json:"epoch,omitempty"`
	Mark  Mark   `json:"mark"`
}

// At returns the state of a device whose stored state is s at a fence point
// whose own epoch for it is e (the fleet epoch it holds, for a device whose
// commands must be signed; the epoch of the device's last reset): the epoch
// is the higher of e and s.Epoch (a fence point that accepted a mark in an
// epoch was at that epoch), and a mark accepted in an epoch below it counts
// as no mark.
func (s State) At(e uint64) State {
	if e > s.Epoch {
		return State{Epoch: e}
	}
	return s
}

// AdmitEpoch is the admit rule with epochs, the decision every fence point
// makes: e is the fence point's own epoch for the device and cur its stored
// state (see State.At); the command carries epoch, token t and seq.
//
//	epoch <  E → Stale (its epoch is closed), error wrapping ErrEpochClosed
//	epoch >  E → Invalid (the fence point has no statement of that epoch;
//	             only the root raises an epoch), error wrapping ErrUnknownEpoch
//	epoch == E → Admit against the mark accepted in E
//
// where E is cur.At(e).Epoch. It returns the verdict, the device's state
// after the decision (epoch E; only Accepted moves the mark, which the
// caller stores with epoch E, durably, before the command takes effect),
// and for a refusal by epoch an *EpochError whose text is the ack's reason.
// Token 0 and seq 0 are Invalid (nil error) whatever the epoch.
func AdmitEpoch(e uint64, cur State, epoch uint64, t Token, seq uint64) (Verdict, State, error) {
	cur = cur.At(e)
	switch {
	case t == 0 || seq == 0:
		return Invalid, cur, nil
	case epoch < cur.Epoch:
		return Stale, cur, &EpochError{Command: epoch, FencePoint: cur.Epoch}
	case epoch > cur.Epoch:
		return Invalid, cur, &EpochError{Command: epoch, FencePoint: cur.Epoch}
	}
	v, m := Admit(cur.Mark, t, seq)
	return v, State{Epoch: cur.Epoch, Mark: m}, nil
}
