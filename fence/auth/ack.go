package auth

import (
	"errors"
	"fmt"

	"github.com/veraison/go-cose"

	"github.com/edgefence/edgefence/fence"
)

// A signed ack is a COSE_Sign1 (ES256, the device key's kid protected)
// with the protected content type ContentAck and, as payload, the ack's
// deterministic CBOR (fence.MarshalAck). It is signed by the device's key
// (RoleDevice), or, for a device behind its home gateway's fence table,
// by that gateway's key (GatewayAcks). The verifier checks the bytes it
// received, then decodes them with fence's strict limits; the ack must
// name its device, and a key that may speak for it must have signed it.
// BoundTo then checks it answers the command waiting for it.

// ContentAck is the protected content type of a signed ack.
const ContentAck = "application/edgefence-ack+cbor"

// MaxSignedAckSize bounds a signed ack: fence.MaxAckSize plus the COSE
// overhead and the content type.
const MaxSignedAckSize = fence.MaxAckSize + Overhead + len(ContentAck) + 8 // label, text head, map growth

// ErrNotBound means a correctly signed ack does not answer the command it
// claims to: another device, command id, token or seq.
var ErrNotBound = errors.New("auth: ack does not answer this command")

// SignAck returns a as a signed ack.
func (s *Signer) SignAck(a *fence.Ack) ([]byte, error) {
	payload, err := fence.MarshalAck(a)
	if err != nil {
		return nil, err
	}
	return s.signContent(ContentAck, payload)
}

// VerifiedAck is what VerifyAck learned: the ack and who signed it.
type VerifiedAck struct {
	Ack   *fence.Ack
	KeyID []byte
}

// VerifyAck checks raw, a signed ack, against keys and returns the ack.
// Every refusal wraps fence.ErrInvalid and one of this package's sentinels.
func VerifyAck(raw []byte, keys DeviceKeys) (*VerifiedAck, error) {
	msg, kid, err := openContent(raw, ContentAck, MaxSignedAckSize)
	if err != nil {
		return nil, err
	}
	a, err := fence.UnmarshalAck(msg.Payload)
	if err != nil {
		return nil, fmt.Errorf("%w: ack payload: %w", ErrMalformed, err) // err wraps fence.ErrInvalid
	}
	if a.Device == "" || a.ID == "" {
		return nil, refuse(ErrMalformed, "a signed ack names its device and command")
	}
	if err := checkSignature(msg, kid, a.Device, keys.DeviceKey, "ack of "+a.ID); err != nil {
		return nil, err
	}
	return &VerifiedAck{Ack: a, KeyID: kid}, nil
}

// BoundTo checks that a (verified) answers env: same device, command id,
// token and seq. It returns an error wrapping fence.ErrInvalid and
// ErrNotBound if not.
func BoundTo(a *fence.Ack, env *fence.Envelope) error {
	if a.Device != env.Device || a.ID != env.ID || a.Token != env.Token || a.Seq != env.Seq {
		return refuse(ErrNotBound, "ack of %s/%s (token %d, seq %d) for the command %s/%s (token %d, seq %d)",
			a.Device, a.ID, a.Token, a.Seq, env.Device, env.ID, env.Token, env.Seq)
	}
	return nil
}

// ClaimedAck returns the ack raw claims to be, signed (unverified) or
// plain: only to find the command it names, or for a device whose acks
// are not verified (auth: off). Never resolve a verified device's command
// with it.
func ClaimedAck(raw []byte) (*fence.Ack, error) {
	if len(raw) < 2 || raw[0] != 0xd2 || raw[1] != 0x84 {
		return fence.UnmarshalAck(raw)
	}
	msg, _, err := openContent(raw, ContentAck, MaxSignedAckSize)
	if err != nil {
		return nil, err
	}
	return fence.UnmarshalAck(msg.Payload)
}

// openContent checks the size and COSE structure of raw, a signed
// statement of content type ctype, and returns it with its key id; the
// signature is not checked yet.
func openContent(raw []byte, ctype string, limit int) (*cose.Sign1Message, []byte, error) {
	if len(raw) > limit {
		return nil, nil, refuse(ErrMalformed, "%s of %d bytes, limit %d", ctype, len(raw), limit)
	}
	msg, kid, got, err := decodeSign1(raw)
	if err != nil {
		return nil, nil, err
	}
	if got != ctype {
		return nil, nil, refuse(ErrMalformed, "content type %q, want %q", got, ctype)
	}
	return msg, kid, nil
}
