package fence

import (
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/fxamacker/cbor/v2"
)

// Version is the envelope format version this package writes and accepts.
const Version = 1

// Limits of the wire format. A fence point refuses anything larger before it
// decodes it.
const (
	MaxEnvelopeSize = 64 << 10 // encoded envelope, bytes
	MaxAckSize      = 4 << 10  // encoded ack, bytes
	MaxBodySize     = 32 << 10 // encoded body, bytes
	MaxDeviceIDLen  = 128
	MaxIDLen        = 64
	MaxKindLen      = 64
	MaxHolderLen    = 128
	MaxReasonLen    = 256
	MaxAuthSize     = 1 << 10
)

// Envelope is one fenced command on its way to a fence point.
//
// Encoded as a CBOR map with small integer keys (the numbers below), in core
// deterministic encoding. Key 15 is reserved for an authenticator (a COSE_Mac0
// or COSE_Sign1 over the deterministic encoding of the envelope with key 15
// absent); fence points of this version accept it only when empty, so that
// adding authentication later does not change any other field.
type Envelope struct {
	V        uint8           `cbor:"1,keyasint"`            // format version, Version
	Device   string          `cbor:"2,keyasint"`            // device id
	Token    Token           `cbor:"3,keyasint"`            // fencing token of the issuing holder
	Seq      uint64          `cbor:"4,keyasint"`            // per-token sequence, from 1
	ID       string          `cbor:"5,keyasint"`            // command id, unique per command
	Kind     string          `cbor:"6,keyasint"`            // what to do, e.g. "set"
	Body     cbor.RawMessage `cbor:"7,keyasint,omitempty"`  // kind-specific CBOR item
	IssuedAt int64           `cbor:"8,keyasint,omitempty"`  // unix milliseconds; information only, never used for safety
	Holder   string          `cbor:"9,keyasint,omitempty"`  // issuing gateway id
	Epoch    uint64          `cbor:"10,keyasint,omitempty"` // the epoch it was issued in (AdmitEpoch); 0 before the first
	Auth     []byte          `cbor:"15,keyasint,omitempty"` // reserved: authenticator (COSE), see above
}

// Issued returns IssuedAt as a time (zero when unset).
func (e *Envelope) Issued() time.Time {
	if e.IssuedAt == 0 {
		return time.Time{}
	}
	return time.UnixMilli(e.IssuedAt)
}

// Validate checks the envelope's fields against the format rules. It returns
// an error wrapping ErrInvalid naming the first bad field.
func (e *Envelope) Validate() error {
	switch {
	case e.V != Version:
		return invalidf("version %d, want %d", e.V, Version)
	case e.Token == 0:
		return invalidf("token is 0")
	case e.Seq == 0:
		return invalidf("seq is 0")
	case len(e.Body) > MaxBodySize:
		return invalidf("body is %d bytes, limit %d", len(e.Body), MaxBodySize)
	case len(e.Holder) > MaxHolderLen || !utf8.ValidString(e.Holder):
		return invalidf("holder: not valid UTF-8 of at most %d bytes", MaxHolderLen)
	case len(e.Auth) != 0:
		return invalidf("authenticator present, but this fence point does not verify authenticators")
	}
	if err := ValidateDeviceID(e.Device); err != nil {
		return err
	}
	if err := validateName("id", e.ID, MaxIDLen); err != nil {
		return err
	}
	if err := validateName("kind", e.Kind, MaxKindLen); err != nil {
		return err
	}
	return validateBody(e.Body)
}

// ValidateDeviceID checks that id can name a device: 1 to MaxDeviceIDLen
// characters from [A-Za-z0-9._-], not starting with '.', so that it is safe as
// an MQTT topic level, an etcd key segment and a file name.
func ValidateDeviceID(id string) error {
	if id == "" || len(id) > MaxDeviceIDLen {
		return invalidf("device id must be 1 to %d characters, got %d", MaxDeviceIDLen, len(id))
	}
	if id[0] == '.' {
		return invalidf("device id %q starts with '.'", id)
	}
	for i := 0; i < len(id); i++ {
		if !nameByte(id[i]) {
			return invalidf("device id %q: character %q not in [A-Za-z0-9._-]", id, id[i])
		}
	}
	return nil
}

func validateName(field, s string, max int) error {
	if s == "" || len(s) > max {
		return invalidf("%s must be 1 to %d characters, got %d", field, max, len(s))
	}
	for i := 0; i < len(s); i++ {
		if !nameByte(s[i]) && s[i] != ':' && s[i] != '/' {
			return invalidf("%s %q: character %q not allowed", field, s, s[i])
		}
	}
	return nil
}

func nameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
}

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// Ack is a fence point's answer to one envelope.
type Ack struct {
	V        uint8   `cbor:"1,keyasint"`           // format version
	Device   string  `cbor:"2,keyasint"`           // device id (may be empty if the envelope was unreadable)
	ID       string  `cbor:"3,keyasint,omitempty"` // command id acked (empty if unreadable)
	Verdict  Verdict `cbor:"4,keyasint"`           // what happened
	Token    Token   `cbor:"5,keyasint,omitempty"` // the command's token
	Seq      uint64  `cbor:"6,keyasint,omitempty"` // the command's seq
	MaxToken Token   `cbor:"7,keyasint,omitempty"` // fence point's high-water mark after the decision
	LastSeq  uint64  `cbor:"8,keyasint,omitempty"`
	Reason   string  `cbor:"9,keyasint,omitempty"`  // human-readable, for invalid and stale
	Epoch    uint64  `cbor:"10,keyasint,omitempty"` // fence point's epoch for the device after the decision
}

// Mark returns the fence point's high-water mark carried by the ack.
func (a *Ack) Mark() Mark { return Mark{Token: a.MaxToken, Seq: a.LastSeq} }

// State returns the fence point's epoch and mark carried by the ack.
func (a *Ack) State() State { return State{Epoch: a.Epoch, Mark: a.Mark()} }

// Err returns nil if the command was accepted, and otherwise an error wrapping
// the verdict's sentinel (ErrStale, ErrDuplicate, ErrInvalid, ErrExpired).
func (a *Ack) Err() error {
	err := a.Verdict.Err()
	if err == nil {
		return nil
	}
	if a.Reason != "" {
		return fmt.Errorf("%w: %s", err, a.Reason)
	}
	return err
}

// Validate checks the ack's fields.
func (a *Ack) Validate() error {
	switch {
	case a.V != Version:
		return invalidf("ack version %d, want %d", a.V, Version)
	case !a.Verdict.Valid():
		return invalidf("ack verdict %d", a.Verdict)
	case len(a.Reason) > MaxReasonLen || !utf8.ValidString(a.Reason):
		return invalidf("ack reason: not valid UTF-8 of at most %d bytes", MaxReasonLen)
	}
	if a.Device != "" {
		if err := ValidateDeviceID(a.Device); err != nil {
			return err
		}
	}
	if a.ID != "" {
		return validateName("id", a.ID, MaxIDLen)
	}
	return nil
}

// NewAck returns the ack for env after a decision that left mark m.
func NewAck(env *Envelope, v Verdict, m Mark, reason string) Ack {
	if len(reason) > MaxReasonLen {
		reason = truncateUTF8(reason, MaxReasonLen)
	}
	return Ack{V: Version, Device: env.Device, ID: env.ID, Verdict: v,
		Token: env.Token, Seq: env.Seq, MaxToken: m.Token, LastSeq: m.Seq, Reason: reason}
}

// NewEpochAck returns the ack for env after a decision that left the
// device in state s: NewAck with the epoch.
func NewEpochAck(env *Envelope, v Verdict, s State, reason string) Ack {
	a := NewAck(env, v, s.Mark, reason)
	a.Epoch = s.Epoch
	return a
}

func truncateUTF8(s string, n int) string {
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
