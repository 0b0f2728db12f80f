package auth

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
)

// A trust update carries root-signed statements to a fence point over the
// air, on the device's command topic, in order with its commands: a CBOR
// array of definite length, 1 to MaxUpdateStatements, of byte strings,
// each one root-signed statement (a certificate, a revocation list, an
// epoch statement). Its
// first byte is 0x81–0x88, which no envelope (a map, 0xa0–0xbf) and no
// COSE message (tag 18, 0xd2) starts with, so a fence point dispatches on
// it. A fence point verifies each statement against the root it was
// provisioned with (Trust.Check) and takes in only the newer: versions
// and serials only go up. A trust update is not a command: it moves no
// mark and gets no ack.
const (
	// MaxUpdateStatements is the most statements one update carries.
	MaxUpdateStatements = 8
	// MaxUpdateSize bounds a trust update: one revocation list of
	// MaxTrustSize and certificates (a few hundred bytes each), under the
	// MQTT clients' default maximum packet size (128 KiB).
	MaxUpdateSize = MaxTrustSize + 8<<10
)

// Errors of trust updates; each wraps fence.ErrInvalid, as Verify's.
var (
	// ErrUnknownContent: a statement of a content type a trust update
	// does not carry (a command, a reset, an ack, something new).
	ErrUnknownContent = errors.New("auth: statement of a content type a trust update does not carry")
	// ErrHeld: the statement is the one held already (same version or
	// serial): nothing to do. It also wraps ErrStaleTrust.
	ErrHeld = errors.New("auth: statement already held")
)

// IsUpdate reports whether raw is shaped as a trust update (its first
// byte): the dispatch a fence point does on its command payloads.
func IsUpdate(raw []byte) bool { return len(raw) > 0 && raw[0] >= 0x81 && raw[0] <= 0x88 }

// MarshalUpdate returns the trust update carrying stmts (1 to
// MaxUpdateStatements statements, none empty or over MaxTrustSize, the
// whole at most MaxUpdateSize). It does not verify them.
func MarshalUpdate(stmts [][]byte) ([]byte, error) {
	if len(stmts) == 0 || len(stmts) > MaxUpdateStatements {
		return nil, fmt.Errorf("auth: trust update of %d statements: want 1 to %d", len(stmts), MaxUpdateStatements)
	}
	out := []byte{0x80 | byte(len(stmts))}
	for i, s := range stmts {
		if len(s) == 0 || len(s) > MaxTrustSize {
			return nil, fmt.Errorf("auth: trust update statement %d of %d bytes: want 1 to %d", i, len(s), MaxTrustSize)
		}
		out = appendBytesHead(out, len(s))
		out = append(out, s...)
	}
	if len(out) > MaxUpdateSize {
		return nil, fmt.Errorf("auth: trust update of %d bytes, limit %d", len(out), MaxUpdateSize)
	}
	return out, nil
}

// appendBytesHead appends the shortest CBOR head of a byte string of n
// bytes (n ≤ MaxTrustSize < 2^32).
func appendBytesHead(b []byte, n int) []byte {
	switch {
	case n < 24:
		return append(b, 0x40|byte(n))
	case n <= 0xff:
		return append(b, 0x58, byte(n))
	case n <= 0xffff:
		return binary.BigEndian.AppendUint16(append(b, 0x59), uint16(n))
	default:
		return binary.BigEndian.AppendUint32(append(b, 0x5a), uint32(n))
	}
}

// ParseUpdate returns the statements of a trust update, checked strictly
// (and cheaply, as a C fence point would): at most MaxUpdateSize bytes; a
// definite array of 1 to MaxUpdateStatements byte strings with shortest
// length heads, each 1 to MaxTrustSize bytes; nothing after. It verifies
// no signature (Trust.Check does). The statements alias raw.
func ParseUpdate(raw []byte) ([][]byte, error) {
	if len(raw) > MaxUpdateSize {
		return nil, refuse(ErrMalformed, "trust update of %d bytes, limit %d", len(raw), MaxUpdateSize)
	}
	if !IsUpdate(raw) {
		return nil, refuse(ErrMalformed, "trust update: want an array of 1 to %d statements (0x81–0x88)", MaxUpdateStatements)
	}
	n := int(raw[0] & 0x1f)
	stmts := make([][]byte, 0, n)
	rest := raw[1:]
	for i := range n {
		s, r, err := nextBytes(rest)
		if err != nil {
			return nil, refuse(ErrMalformed, "trust update statement %d: %v", i, err)
		}
		stmts, rest = append(stmts, s), r
	}
	if len(rest) != 0 {
		return nil, refuse(ErrMalformed, "trust update: %d bytes after the statements", len(rest))
	}
	return stmts, nil
}

// nextBytes reads one definite byte string, shortest head, 1 to
// MaxTrustSize bytes.
func nextBytes(b []byte) (s, rest []byte, err error) {
	if len(b) == 0 {
		return nil, nil, errors.New("missing")
	}
	if b[0]>>5 != 2 {
		return nil, nil, fmt.Errorf("want a byte string, got initial byte %#x", b[0])
	}
	var n, head uint64
	switch info := b[0] & 0x1f; {
	case info < 24:
		n, head = uint64(info), 1
	case info == 24 && len(b) >= 2:
		n, head = uint64(b[1]), 2
	case info == 25 && len(b) >= 3:
		n, head = uint64(binary.BigEndian.Uint16(b[1:])), 3
	case info == 26 && len(b) >= 5:
		n, head = uint64(binary.BigEndian.Uint32(b[1:])), 5
	default:
		return nil, nil, fmt.Errorf("length head %#x: want a definite length under 2^32, complete", b[0])
	}
	switch {
	case n == 0 || n > MaxTrustSize:
		return nil, nil, fmt.Errorf("%d bytes: want 1 to %d", n, MaxTrustSize)
	case len(appendBytesHead(nil, int(n))) != int(head):
		return nil, nil, errors.New("length not in its shortest form")
	case uint64(len(b))-head < n:
		return nil, nil, fmt.Errorf("%d bytes announced, %d there", n, uint64(len(b))-head)
	}
	return b[head : head+n], b[head+n:], nil
}

// Statement is one root-signed statement, verified (Trust.Check): what it
// is (Content) and, by content type, what it says.
type Statement struct {
	Raw     []byte // as received, signature and all: what a fence point keeps and relays
	Content string // ContentCertificate, ContentRevocations or ContentEpoch
	// One of these, by Content.
	Certificate *Certificate
	Revocations *Revocations
	Epoch       *Epoch
}

// Slot names where a fence point keeps the statement: one slot per
// certificate key id, one for the revocation list, one for the epoch. A
// newer statement (Rank) replaces the one in its slot.
func (s *Statement) Slot() string {
	switch {
	case s.Certificate != nil:
		return "cert/" + hex.EncodeToString(s.Certificate.KeyID)
	case s.Epoch != nil:
		return "epoch"
	}
	return "revocations"
}

// Rank orders the statements of one slot: a certificate's serial, a
// revocation list's version, an epoch statement's epoch.
func (s *Statement) Rank() uint64 {
	switch {
	case s.Certificate != nil:
		return s.Certificate.Serial
	case s.Epoch != nil:
		return s.Epoch.Number
	}
	return s.Revocations.Version
}

// Check verifies a root-signed statement and says whether it is news,
// without taking it in: nil error if it is newer than what t holds in its
// slot (then Adopt it), ErrHeld if it is the one held, ErrStaleTrust if
// older, anything else wrapping fence.ErrInvalid if it is not a statement
// of the root. The dispatch on the content type is here: another kind of
// statement a trust update may carry is one more case.
func (t *Trust) Check(raw []byte) (*Statement, error) {
	ctype, payload, err := t.verifyStatement(raw)
	if err != nil {
		return nil, err
	}
	st := &Statement{Raw: raw, Content: ctype}
	switch ctype {
	case ContentCertificate:
		if st.Certificate, err = decodeCertificate(payload); err != nil {
			return nil, err
		}
		st.Certificate.raw = raw
	case ContentRevocations:
		var r Revocations
		if err := trustDec.Unmarshal(payload, &r); err != nil {
			return nil, refuse(ErrMalformed, "revocation list payload: %v", err)
		}
		st.Revocations = &r
	case ContentEpoch:
		if st.Epoch, err = decodeEpoch(raw, payload); err != nil {
			return nil, err
		}
	default:
		return nil, refuse(ErrUnknownContent, "%q", ctype)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return st, t.news(st)
}

// news says whether st is newer than what t holds in its slot. Call with
// t.mu held.
func (t *Trust) news(st *Statement) error {
	var held uint64
	var have bool
	switch {
	case st.Certificate != nil:
		if c := t.certs[string(st.Certificate.KeyID)]; c != nil {
			held, have = c.Serial, true
		}
	case st.Epoch != nil:
		held, have = t.epoch, true // 0: none (epochs start at 1)
	default:
		held, have = t.version, true // version 0: none (Root.Revoke's lists start at 1)
	}
	switch r := st.Rank(); {
	case !have || r > held:
		return nil
	case r == held:
		return refuse(fmt.Errorf("%w: %w", ErrStaleTrust, ErrHeld), "%s %d", st.Slot(), r)
	default:
		return refuse(ErrStaleTrust, "%s %d, holding %d", st.Slot(), r, held)
	}
}

// Adopt takes in a statement Check found newer, unless something newer
// came in meanwhile (then the error Check would give now).
func (t *Trust) Adopt(st *Statement) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.news(st); err != nil {
		return err
	}
	if c := st.Certificate; c != nil {
		t.certs[string(c.KeyID)] = c
		return nil
	}
	if e := st.Epoch; e != nil {
		t.epoch, t.epochRaw = e.Number, st.Raw
		return nil
	}
	r := st.Revocations
	t.version, t.revRaw = r.Version, st.Raw
	t.revoked = make(map[string]bool, len(r.KeyIDs))
	for _, k := range r.KeyIDs {
		t.revoked[string(k)] = true
	}
	return nil
}

// Apply checks a root-signed statement and takes it in if it is newer
// than the one held in its slot (Check, then Adopt).
func (t *Trust) Apply(raw []byte) (*Statement, error) {
	st, err := t.Check(raw)
	if err != nil {
		return nil, err
	}
	return st, t.Adopt(st)
}

// Statements returns the statements t holds, as received: the
// certificates (by key id), then the revocation list and the epoch
// statement, if any. A fence point relays them; the ones it learned over
// the air it keeps itself.
func (t *Trust) Statements() [][]byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	kids := slices.Sorted(maps.Keys(t.certs))
	out := make([][]byte, 0, len(kids)+2)
	for _, k := range kids {
		out = append(out, t.certs[k].raw)
	}
	if t.revRaw != nil {
		out = append(out, t.revRaw)
	}
	if t.epochRaw != nil {
		out = append(out, t.epochRaw)
	}
	return out
}

// RevocationList returns the revocation list held, as received, and its
// version (nil, 0: none).
func (t *Trust) RevocationList() ([]byte, uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.revRaw, t.version
}
