// Package auth signs and verifies fenced envelopes (invariant I7): a
// command is a COSE_Sign1 message (RFC 9052, tag 18) whose payload is the
// envelope's deterministic CBOR, signed with ES256 (ECDSA P-256, SHA-256:
// what mbedTLS and PSA Crypto verify on a microcontroller) by the issuing
// gateway's key, named by its key id (kid) in the protected header.
//
// The verifier checks the bytes it received, never a re-encoding: the
// payload is verified as sent, then decoded with fence's strict limits.
// Order: size, COSE structure (tagged, alg ES256 and kid protected, no
// critical headers, nothing unprotected), payload decoded as an envelope,
// the signer's key looked up for that device (Keys: unknown, revoked or
// not authorised for the device), signature. Every refusal wraps
// fence.ErrInvalid and one sentinel saying which, so a fence point answers
// invalid with its mark unchanged and counts the reason.
package auth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"fmt"

	"github.com/fxamacker/cbor/v2"
	"github.com/veraison/go-cose"

	"github.com/edgefence/edgefence/fence"
)

// Limits of a signed envelope.
const (
	// MaxKeyID is the longest key id accepted.
	MaxKeyID = 64
	// Overhead bounds what COSE adds to the envelope: the tag and array
	// (2 B), the protected header (alg and a kid of at most MaxKeyID,
	// ≤ 75 B), the empty unprotected map (1 B), the payload's byte-string
	// head (≤ 3 B), the signature (64 B and its 2-byte head).
	Overhead = 2 + 75 + 1 + 3 + 66
	// MaxSignedSize is the largest signed envelope: fence.MaxEnvelopeSize
	// plus Overhead.
	MaxSignedSize = fence.MaxEnvelopeSize + Overhead
)

// Sentinel errors; each also wraps fence.ErrInvalid.
var (
	ErrUnsigned      = errors.New("auth: not a signed envelope")
	ErrMalformed     = errors.New("auth: malformed signed envelope")
	ErrAlgorithm     = errors.New("auth: algorithm not accepted")
	ErrUnknownKey    = errors.New("auth: unknown signer key")
	ErrRevoked       = errors.New("auth: signer key revoked")
	ErrNotAuthorised = errors.New("auth: signer not authorised for this device")
	ErrBadSignature  = errors.New("auth: bad signature")
)

// refuse wraps why and fence.ErrInvalid.
func refuse(why error, format string, args ...any) error {
	return fmt.Errorf("%w: %w: %s", fence.ErrInvalid, why, fmt.Sprintf(format, args...))
}

// Signer signs envelopes with one gateway key.
type Signer struct {
	kid []byte
	s   cose.Signer
}

// NewSigner returns a Signer for key (P-256) named kid (1 to MaxKeyID bytes).
func NewSigner(kid []byte, key *ecdsa.PrivateKey) (*Signer, error) {
	if len(kid) == 0 || len(kid) > MaxKeyID {
		return nil, fmt.Errorf("auth: key id of %d bytes: want 1 to %d", len(kid), MaxKeyID)
	}
	if key == nil || key.Curve != elliptic.P256() {
		return nil, errors.New("auth: signer key must be ECDSA P-256 (ES256)")
	}
	s, err := cose.NewSigner(cose.AlgorithmES256, key)
	if err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	return &Signer{kid: append([]byte(nil), kid...), s: s}, nil
}

// KeyID returns the signer's key id.
func (s *Signer) KeyID() []byte { return append([]byte(nil), s.kid...) }

// Sign returns env as a signed envelope: COSE_Sign1, tagged, payload the
// envelope's deterministic CBOR (fence.MarshalEnvelope validates it).
func (s *Signer) Sign(env *fence.Envelope) ([]byte, error) {
	payload, err := fence.MarshalEnvelope(env)
	if err != nil {
		return nil, err
	}
	return s.signContent("", payload)
}

// signContent returns payload as a COSE_Sign1 signed by s, tagged, with
// the protected content type ctype ("": none, as a command).
func (s *Signer) signContent(ctype string, payload []byte) ([]byte, error) {
	hdr := cose.Headers{Protected: cose.ProtectedHeader{
		cose.HeaderLabelAlgorithm: cose.AlgorithmES256,
		cose.HeaderLabelKeyID:     s.kid,
	}}
	if ctype != "" {
		hdr.Protected[cose.HeaderLabelContentType] = ctype
	}
	out, err := cose.Sign1(rand.Reader, s.s, hdr, payload, nil)
	if err != nil {
		return nil, fmt.Errorf("auth: sign: %w", err)
	}
	return out, nil
}

// Keys answers, for a verifier, which public key a key id names and
// whether that key may command the device. It returns an error wrapping
// ErrUnknownKey, ErrRevoked or ErrNotAuthorised when it may not.
type Keys interface {
	Key(kid []byte, device string) (*ecdsa.PublicKey, error)
}

// Verified is what Verify learned: the envelope and who signed it.
type Verified struct {
	Envelope *fence.Envelope
	KeyID    []byte
}

// Verify checks raw, a signed envelope, against keys and returns the
// envelope. Every refusal wraps fence.ErrInvalid and one of this package's
// sentinels (fence.ErrTooLarge too for an oversized one).
func Verify(raw []byte, keys Keys) (*Verified, error) {
	if len(raw) > MaxSignedSize {
		return nil, fmt.Errorf("%w: %w: %w: %d bytes, limit %d", fence.ErrInvalid, ErrMalformed, fence.ErrTooLarge, len(raw), MaxSignedSize)
	}
	msg, kid, err := decode(raw)
	if err != nil {
		return nil, err
	}
	env, err := fence.UnmarshalEnvelope(msg.Payload)
	if err != nil {
		return nil, fmt.Errorf("%w: payload: %w", ErrMalformed, err) // err wraps fence.ErrInvalid
	}
	if err := checkSignature(msg, kid, env.Device, keys.Key, "command "+env.ID); err != nil {
		return nil, err
	}
	return &Verified{Envelope: env, KeyID: kid}, nil
}

// checkSignature looks up the key kid for device with key and checks msg's
// signature with it; what names the message in a refusal.
func checkSignature(msg *cose.Sign1Message, kid []byte, device string, key func(kid []byte, device string) (*ecdsa.PublicKey, error), what string) error {
	pub, err := key(kid, device)
	switch {
	case err == nil && pub == nil:
		return refuse(ErrUnknownKey, "key %x", kid)
	case err != nil && !errors.Is(err, fence.ErrInvalid):
		return fmt.Errorf("%w: key %x for %s: %w", fence.ErrInvalid, kid, device, err)
	case err != nil:
		return fmt.Errorf("key %x for %s: %w", kid, device, err)
	}
	if pub.Curve != elliptic.P256() {
		return refuse(ErrAlgorithm, "key %x is not P-256", kid)
	}
	v, err := cose.NewVerifier(cose.AlgorithmES256, pub)
	if err != nil {
		return refuse(ErrAlgorithm, "key %x: %v", kid, err)
	}
	if err := msg.Verify(nil, v); err != nil {
		return refuse(ErrBadSignature, "key %x, device %s, %s", kid, device, what)
	}
	return nil
}

// decode checks the COSE structure of a signed envelope strictly and
// returns it with its key id: alg and kid protected, nothing else.
func decode(raw []byte) (*cose.Sign1Message, []byte, error) {
	msg, kid, ctype, err := decodeSign1(raw)
	if err != nil {
		return nil, nil, err
	}
	if ctype != "" {
		return nil, nil, refuse(ErrMalformed, "protected content type %q: a command carries none", ctype)
	}
	return msg, kid, nil
}

// decodeSign1 checks the COSE structure strictly and returns it with its
// key id and content type ("" if none): alg and kid protected, a content
// type (text) optional, nothing else, nothing unprotected.
func decodeSign1(raw []byte) (*cose.Sign1Message, []byte, string, error) {
	if len(raw) < 2 || raw[0] != 0xd2 || raw[1] != 0x84 {
		// An unsigned envelope is a CBOR map (0xa0–0xbf): say so plainly.
		return nil, nil, "", refuse(ErrUnsigned, "want COSE_Sign1 (tag 18, array of 4)")
	}
	if err := wellFormed(raw); err != nil {
		return nil, nil, "", refuse(ErrMalformed, "%v", err)
	}
	var msg cose.Sign1Message
	if err := msg.UnmarshalCBOR(raw); err != nil {
		return nil, nil, "", refuse(ErrMalformed, "%v", err)
	}
	if len(msg.Headers.Unprotected) != 0 {
		return nil, nil, "", refuse(ErrMalformed, "unprotected header must be empty")
	}
	p := msg.Headers.Protected
	for label := range p {
		if label != cose.HeaderLabelAlgorithm && label != cose.HeaderLabelKeyID && label != cose.HeaderLabelContentType {
			return nil, nil, "", refuse(ErrMalformed, "protected header %v not accepted (only alg, kid and content type)", label)
		}
	}
	alg, err := p.Algorithm()
	if err != nil || alg != cose.AlgorithmES256 {
		return nil, nil, "", refuse(ErrAlgorithm, "alg %v (%v): want ES256", alg, err)
	}
	kid, ok := p[cose.HeaderLabelKeyID].([]byte)
	if !ok || len(kid) == 0 || len(kid) > MaxKeyID {
		return nil, nil, "", refuse(ErrMalformed, "kid: want 1 to %d bytes in the protected header", MaxKeyID)
	}
	if msg.Payload == nil {
		return nil, nil, "", refuse(ErrMalformed, "detached payload")
	}
	var ctype string
	if v, ok := p[cose.HeaderLabelContentType]; ok {
		if ctype, ok = v.(string); !ok || ctype == "" {
			return nil, nil, "", refuse(ErrMalformed, "content type: want text")
		}
	}
	return &msg, kid, ctype, nil
}

// strict decodes raw once with limits before go-cose sees it: one data
// item, no indefinite lengths or duplicate keys, bounded nesting.
var strict = func() cbor.DecMode {
	m, err := cbor.DecOptions{
		DupMapKey:        cbor.DupMapKeyEnforcedAPF,
		IndefLength:      cbor.IndefLengthForbidden,
		MaxNestedLevels:  8,
		MaxArrayElements: 16,
		MaxMapPairs:      16,
	}.DecMode()
	if err != nil {
		panic(err) // static options
	}
	return m
}()

func wellFormed(raw []byte) error {
	var v any
	rest, err := strict.UnmarshalFirst(raw, &v)
	if err != nil {
		return err
	}
	if len(rest) != 0 {
		return fmt.Errorf("%d bytes after the message", len(rest))
	}
	return nil
}

// Peek returns the envelope inside a signed envelope without checking the
// signature: only for addressing the refusal of one that failed Verify
// (the ack names the command, so its sender learns why). Never act on it.
func Peek(raw []byte) (*fence.Envelope, error) {
	if len(raw) > MaxSignedSize {
		return nil, refuse(ErrMalformed, "%d bytes", len(raw))
	}
	msg, _, err := decode(raw)
	if err != nil {
		return nil, err
	}
	return fence.UnmarshalEnvelope(msg.Payload)
}

// Claimed returns the envelope raw claims to be, signed (unverified) or
// plain: only to address the refusal of a command that failed Verify, so
// that its sender learns why. Never act on it.
func Claimed(raw []byte) (*fence.Envelope, error) {
	if env, err := Peek(raw); err == nil {
		return env, nil
	}
	return fence.UnmarshalEnvelope(raw)
}
