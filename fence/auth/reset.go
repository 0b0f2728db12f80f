package auth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/veraison/go-cose"

	"github.com/edgefence/edgefence/fence"
)

// An authorised fence reset is the operator's signed statement that a
// device's mark is to be set to a given value: the way back for a device
// whose mark a forgery raised (bricked), or that etcd's token regression
// left above every token etcd grants, on any etcd version. It is a
// COSE_Sign1 by the operator's root key (ES256, the root's kid and the
// content type ContentReset protected), payload deterministic CBOR:
//
//	1 device id (text)   2 token (uint ≥ 1)   3 seq (uint ≥ 1)
//	4 reset counter (uint ≥ 1)   5 reset id (text, "reset:…")
//	6 issued, unix milliseconds (information only)   7 epoch (uint ≥ 1)
//
// The fence point keeps the counter and the epoch of the last reset it
// applied per device (fence.ResetRecord) and refuses a reset whose counter
// is not above the last one's, or whose epoch is not above the device's
// (the fleet epoch it holds, for a device whose commands must be signed;
// the last reset's; the stored mark's): ErrReplayedReset. The same reset,
// or an older one, replayed later cannot set the mark back again. Applied,
// the reset puts the device in its epoch with its mark (fence.State), so
// that no command issued before it — in an earlier epoch — is admitted
// after it, whatever its token (fence.AdmitEpoch). The reset travels on the device's
// command topic like a command; the fence point answers with a fence.Ack
// whose id is the reset id: accepted with the new mark, or invalid with
// the reason.

// ContentReset is the content type of a reset statement.
const ContentReset = "application/edgefence-reset+cbor"

// ResetIDPrefix starts every reset id, so that an ack is told to be a
// reset's (it names no command) by its id.
const ResetIDPrefix = "reset:"

// MaxResetSize bounds a reset statement on the wire (a real one is under
// 400 bytes).
const MaxResetSize = 1 << 10

// Errors of resets; each refusal wraps fence.ErrInvalid too.
var (
	// ErrReplayedReset: the reset's counter is not above the last one
	// the fence point applied for the device, or its epoch not above the
	// device's (fence.ErrReplayedReset).
	ErrReplayedReset = fence.ErrReplayedReset
	// ErrResetDevice: the reset names another device than the one it was
	// addressed to.
	ErrResetDevice = errors.New("auth: reset for another device")
	// ErrNoRoot: the fence point has no operator root provisioned, so it
	// cannot check a reset and refuses every one.
	ErrNoRoot = errors.New("auth: no operator root provisioned for resets")
)

// Reset is the payload of a reset statement.
type Reset struct {
	Device  string      `cbor:"1,keyasint"`
	Token   fence.Token `cbor:"2,keyasint"`
	Seq     uint64      `cbor:"3,keyasint"`
	Counter uint64      `cbor:"4,keyasint"`
	ID      string      `cbor:"5,keyasint"`
	Issued  int64       `cbor:"6,keyasint"` // unix milliseconds, information only
	Epoch   uint64      `cbor:"7,keyasint"` // the epoch the device is put in
}

// Mark is the mark the reset sets.
func (r *Reset) Mark() fence.Mark { return fence.Mark{Token: r.Token, Seq: r.Seq} }

// State is the device's state the reset sets: its mark in its epoch.
func (r *Reset) State() fence.State { return fence.State{Epoch: r.Epoch, Mark: r.Mark()} }

// Record is what the fence point stores of the reset (the time is its own).
func (r *Reset) Record() fence.ResetRecord {
	return fence.ResetRecord{Counter: r.Counter, Epoch: r.Epoch, ID: r.ID}
}

// Validate checks the reset's fields; an error wraps fence.ErrInvalid and
// ErrMalformed.
func (r *Reset) Validate() error {
	if err := fence.ValidateDeviceID(r.Device); err != nil {
		return refuse(ErrMalformed, "reset: %v", err)
	}
	if r.Token == 0 || r.Seq == 0 || r.Counter == 0 || r.Epoch == 0 {
		return refuse(ErrMalformed, "reset of %s to %d/%d, counter %d, epoch %d: each must be at least 1", r.Device, r.Token, r.Seq, r.Counter, r.Epoch)
	}
	if !ValidResetID(r.ID) {
		return refuse(ErrMalformed, "reset id %q: want %q and up to %d characters of [A-Za-z0-9._-]", r.ID, ResetIDPrefix, fence.MaxIDLen)
	}
	return nil
}

// ValidResetID reports whether id is a reset id.
func ValidResetID(id string) bool {
	if len(id) <= len(ResetIDPrefix) || len(id) > fence.MaxIDLen || !strings.HasPrefix(id, ResetIDPrefix) {
		return false
	}
	for _, c := range []byte(id[len(ResetIDPrefix):]) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// NewResetID returns a fresh random reset id.
func NewResetID() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // never fails on Linux (go1.24+)
	return ResetIDPrefix + hex.EncodeToString(b[:])
}

// Reset returns the signed reset statement r (validated first). The root
// key signs it: keep it offline; nothing here needs a network.
func (root *Root) Reset(r Reset) ([]byte, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return root.sign(ContentReset, r)
}

// ResetVerifier checks a reset statement addressed to device against the
// operator's root: *Trust (a fence point with the whole chain) and
// *RootKey (one with only the root) implement it.
type ResetVerifier interface {
	VerifyReset(raw []byte, device string) (*Reset, error)
}

// RootKey is the operator's root public key on a fence point that has
// nothing else of the trust chain (a device of the unsigned era
// provisioned only for resets).
type RootKey struct {
	kid []byte
	v   cose.Verifier
}

// NewRootKey returns the root key named kid.
func NewRootKey(kid []byte, pub *ecdsa.PublicKey) (*RootKey, error) {
	if len(kid) == 0 || len(kid) > MaxKeyID || pub == nil || pub.Curve != elliptic.P256() {
		return nil, errors.New("auth: root key: want a kid and an ECDSA P-256 key")
	}
	v, err := cose.NewVerifier(cose.AlgorithmES256, pub)
	if err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	return &RootKey{kid: append([]byte(nil), kid...), v: v}, nil
}

// VerifyReset implements ResetVerifier.
func (k *RootKey) VerifyReset(raw []byte, device string) (*Reset, error) {
	return verifyReset(raw, device, k.kid, k.v)
}

// VerifyReset implements ResetVerifier with the Trust's root.
func (t *Trust) VerifyReset(raw []byte, device string) (*Reset, error) {
	return verifyReset(raw, device, t.rootKid, t.root)
}

var (
	_ ResetVerifier = (*RootKey)(nil)
	_ ResetVerifier = (*Trust)(nil)
)

// verifyReset checks raw: size, structure, content type, the root's kid,
// the signature, the payload, the device. Every refusal wraps
// fence.ErrInvalid and a sentinel.
func verifyReset(raw []byte, device string, rootKid []byte, root cose.Verifier) (*Reset, error) {
	var r Reset
	msg, kid, err := openStatement(raw, MaxResetSize, "reset", ContentReset, &r)
	if err != nil {
		return nil, err
	}
	if err := rootSigned(msg, kid, rootKid, root, "reset "+r.ID+" of "+r.Device); err != nil {
		return nil, err
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	if r.Device != device {
		return nil, refuse(ErrResetDevice, "reset %s names %q, addressed to %q", r.ID, r.Device, device)
	}
	return &r, nil
}

// openStatement decodes a root statement of content type ctype, at most
// limit bytes, its payload into v, without checking its signature; what
// names it in a refusal.
func openStatement(raw []byte, limit int, what, ctype string, v any) (*cose.Sign1Message, []byte, error) {
	if len(raw) > limit {
		return nil, nil, refuse(ErrMalformed, "%s of %d bytes, limit %d", what, len(raw), limit)
	}
	msg, kid, got, err := decodeSign1(raw)
	if err != nil {
		return nil, nil, err
	}
	if got != ctype {
		return nil, nil, refuse(ErrMalformed, "statement of content type %q, want %q", got, ctype)
	}
	if err := trustDec.Unmarshal(msg.Payload, v); err != nil {
		return nil, nil, refuse(ErrMalformed, "%s payload: %v", what, err)
	}
	return msg, kid, nil
}

// rootSigned checks that msg, whose protected kid is kid, is signed by the
// operator's root; what names it in a refusal.
func rootSigned(msg *cose.Sign1Message, kid, rootKid []byte, root cose.Verifier, what string) error {
	if string(kid) != string(rootKid) {
		return refuse(ErrUnknownKey, "%s signed by %x, not the operator root %x", what, kid, rootKid)
	}
	if err := msg.Verify(nil, root); err != nil {
		return refuse(ErrBadSignature, "%s", what)
	}
	return nil
}

// PeekReset returns the reset raw claims to be, without checking its
// signature: for display, and to address the refusal of one that failed
// VerifyReset (its ack names the reset id). Never act on it.
func PeekReset(raw []byte) (*Reset, error) {
	var r Reset
	if _, _, err := openStatement(raw, MaxResetSize, "reset", ContentReset, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// IsReset reports whether raw, a payload on a device's command topic, is
// a reset statement (a COSE_Sign1 whose protected content type is
// ContentReset) rather than a command. It decodes only the protected
// header; VerifyReset checks the rest.
func IsReset(raw []byte) bool {
	if len(raw) < 3 || raw[0] != 0xd2 || raw[1] != 0x84 {
		return false
	}
	var prot []byte
	if _, err := strict.UnmarshalFirst(raw[2:], &prot); err != nil {
		return false
	}
	var hdr map[int64]any
	if err := strict.Unmarshal(prot, &hdr); err != nil {
		return false
	}
	ct, ok := hdr[cose.HeaderLabelContentType].(string)
	return ok && ct == ContentReset
}

// ResetAck is the fence point's answer to a reset: accepted with the
// device's state st after it, or, with err, invalid with err as the
// reason. r may be nil (undecodable); device is the device the reset was
// addressed to.
func ResetAck(device string, r *Reset, st fence.State, err error) fence.Ack {
	env := &fence.Envelope{Device: device}
	if r != nil && ValidResetID(r.ID) {
		env.ID, env.Token, env.Seq = r.ID, r.Token, r.Seq
	}
	if err != nil {
		return fence.NewEpochAck(env, fence.Invalid, st, err.Error())
	}
	return fence.NewEpochAck(env, fence.Accepted, st, "fence reset to "+st.Mark.String())
}
