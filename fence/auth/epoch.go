package auth

import (
	"errors"
	"strings"
	"time"

	"github.com/edgefence/edgefence/fence"
)

// An epoch statement is the operator's statement that the fleet is at an
// epoch (fence.AdmitEpoch): a number that only goes up. A fence point whose
// commands must be signed holds the highest one it has received (a trust
// update brings it; its ledger keeps it) and is at least at that epoch for
// every such device, so a command issued in an earlier epoch — before an
// etcd rebuild, say — is refused stale whatever its token, and recovering a
// fleet is one statement instead of a reset per device. It is a COSE_Sign1
// by the operator's root key (ES256, the root's kid and the content type
// ContentEpoch protected), at most MaxEpochSize bytes, payload
// deterministic CBOR:
//
//	1 epoch (uint ≥ 1)   2 issued, unix milliseconds (information only)
//
// Only the root raises an epoch: a gateway stamps the epoch it knows on its
// commands, and a fence point that does not hold that epoch refuses them
// invalid (fence.ErrUnknownEpoch) until a trust update brings the statement.

// ContentEpoch is the content type of an epoch statement.
const ContentEpoch = "application/edgefence-epoch+cbor"

// MaxEpochSize bounds an epoch statement on the wire (a real one is under
// 150 bytes).
const MaxEpochSize = 1 << 10

// Epoch is the payload of an epoch statement.
type Epoch struct {
	Number uint64 `cbor:"1,keyasint"`
	Issued int64  `cbor:"2,keyasint"` // unix milliseconds, information only
}

// Validate checks the statement's fields; an error wraps fence.ErrInvalid
// and ErrMalformed.
func (e *Epoch) Validate() error {
	if e.Number == 0 {
		return refuse(ErrMalformed, "epoch statement of epoch 0: epochs start at 1")
	}
	return nil
}

// Epoch returns the signed statement that the fleet is at epoch n. The root
// key signs it: keep it offline.
func (root *Root) Epoch(n uint64, issued time.Time) ([]byte, error) {
	e := Epoch{Number: n, Issued: issued.UnixMilli()}
	if err := e.Validate(); err != nil {
		return nil, err
	}
	return root.sign(ContentEpoch, e)
}

// decodeEpoch decodes and checks a verified epoch statement's payload; raw
// is the whole statement (its size is checked).
func decodeEpoch(raw, payload []byte) (*Epoch, error) {
	if len(raw) > MaxEpochSize {
		return nil, refuse(ErrMalformed, "epoch statement of %d bytes, limit %d", len(raw), MaxEpochSize)
	}
	var e Epoch
	if err := trustDec.Unmarshal(payload, &e); err != nil {
		return nil, refuse(ErrMalformed, "epoch statement payload: %v", err)
	}
	if err := e.Validate(); err != nil {
		return nil, err
	}
	return &e, nil
}

// PeekEpoch returns the epoch statement raw claims to be, without checking
// its signature: for display. Never act on it.
func PeekEpoch(raw []byte) (*Epoch, error) {
	var e Epoch
	if _, _, err := openStatement(raw, MaxEpochSize, "epoch statement", ContentEpoch, &e); err != nil {
		return nil, err
	}
	if err := e.Validate(); err != nil {
		return nil, err
	}
	return &e, nil
}

// RootKeyID returns the key id of the root t is anchored at.
func (t *Trust) RootKeyID() []byte { return append([]byte(nil), t.rootKid...) }

// Epoch is the epoch of the newest epoch statement t holds (0: none): the
// lowest epoch a fence point with this trust is at for a device whose
// commands must be signed.
func (t *Trust) Epoch() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.epoch
}

// EpochStatement returns the epoch statement held, as received, and its
// epoch (nil, 0: none).
func (t *Trust) EpochStatement() ([]byte, uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.epochRaw, t.epoch
}

// ReasonUnknownKey is the reason of an ack refusing a command signed by a
// key the fence point has no certificate for, worded alike by every fence
// point (the C library byte for byte).
const ReasonUnknownKey = "unknown signer key"

// Reason is the reason a fence point gives in the ack of a command that
// Verify (or the admit rule) refused with err: err's text, except for a
// refusal a trust update can cure, which is worded alike by every fence
// point (NeedsTrust): ReasonUnknownKey for a key with no certificate; an
// unknown epoch's text is fence.EpochError's already.
func Reason(err error) string {
	if errors.Is(err, ErrUnknownKey) {
		return ReasonUnknownKey
	}
	return err.Error()
}

// NeedsTrust reports whether a is a fence point's refusal of a command
// that a trust update can cure: invalid because the command's signer has
// no certificate there (ReasonUnknownKey) or because the command's epoch
// is one the fence point holds no statement of (fence.ReasonUnknownEpoch).
// It reads the reason, as both implementations word it (Reason), so it
// holds for the C library's acks too. A reset's ack is never one: a reset
// is signed by the root, which every fence point holds.
func NeedsTrust(a *fence.Ack) bool {
	if a == nil || a.Verdict != fence.Invalid || ValidResetID(a.ID) {
		return false
	}
	r := a.Reason
	return r == ReasonUnknownKey || strings.HasPrefix(r, ReasonUnknownKey+":") || strings.HasPrefix(r, fence.ReasonUnknownEpoch)
}
