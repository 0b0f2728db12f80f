package fence

import (
	"errors"
	"fmt"
	"reflect"

	"github.com/fxamacker/cbor/v2"
)

// Decoding limits beyond the byte-size limits in envelope.go.
const (
	MaxNesting    = 16
	MaxArrayElems = 1024
	MaxMapPairs   = 256
)

var (
	encMode  cbor.EncMode
	decMode  cbor.DecMode
	bodyMode cbor.DecMode // decMode's rules for a body on its own; see validateBody
)

func init() {
	var err error
	encMode, err = cbor.CoreDetEncOptions().EncMode()
	if err != nil {
		panic(err) // static options; cannot fail
	}
	decMode, err = cbor.DecOptions{
		DupMapKey:         cbor.DupMapKeyEnforcedAPF,
		IndefLength:       cbor.IndefLengthForbidden,
		TagsMd:            cbor.TagsForbidden,
		MaxNestedLevels:   MaxNesting,
		MaxArrayElements:  MaxArrayElems,
		MaxMapPairs:       MaxMapPairs,
		UTF8:              cbor.UTF8RejectInvalid,
		ExtraReturnErrors: cbor.ExtraDecErrorUnknownField,
		DefaultMapType:    reflect.TypeOf(map[string]any(nil)),
	}.DecMode()
	if err != nil {
		panic(err)
	}
	bodyMode, err = cbor.DecOptions{
		DupMapKey:        cbor.DupMapKeyEnforcedAPF,
		IndefLength:      cbor.IndefLengthForbidden,
		TagsMd:           cbor.TagsForbidden,
		MaxNestedLevels:  MaxNesting - 1, // the envelope map is the first level
		MaxArrayElements: MaxArrayElems,
		MaxMapPairs:      MaxMapPairs,
		UTF8:             cbor.UTF8RejectInvalid,
	}.DecMode()
	if err != nil {
		panic(err)
	}
}

// validateBody checks that a non-empty body is one CBOR data item that
// UnmarshalEnvelope accepts inside an envelope: within the limits, with no
// tags, indefinite lengths, duplicate map keys or invalid UTF-8 text at any
// depth. The envelope decoder keeps the body raw and checks it only for
// well-formedness, so without this a fence point would admit a command whose
// body no decoder can read, and MarshalEnvelope would produce envelopes that
// UnmarshalEnvelope rejects.
func validateBody(b cbor.RawMessage) error {
	if len(b) == 0 {
		return nil
	}
	var v any
	if err := bodyMode.Unmarshal(b, &v); err != nil {
		return invalidf("body: %v", err)
	}
	return nil
}

// MarshalEnvelope validates e and encodes it in deterministic CBOR.
func MarshalEnvelope(e *Envelope) ([]byte, error) {
	if err := e.Validate(); err != nil {
		return nil, err
	}
	b, err := encMode.Marshal(e)
	if err != nil {
		return nil, fmt.Errorf("fence: encode envelope: %w", err)
	}
	if len(b) > MaxEnvelopeSize {
		return nil, fmt.Errorf("%w: envelope is %d bytes, limit %d", ErrTooLarge, len(b), MaxEnvelopeSize)
	}
	return b, nil
}

// UnmarshalEnvelope decodes and validates an envelope. Every failure wraps
// ErrInvalid (and ErrTooLarge for oversized input), so a fence point answers
// it with an Invalid ack.
func UnmarshalEnvelope(b []byte) (*Envelope, error) {
	if len(b) > MaxEnvelopeSize {
		return nil, fmt.Errorf("%w: %w: %d bytes, limit %d", ErrInvalid, ErrTooLarge, len(b), MaxEnvelopeSize)
	}
	var e Envelope
	if err := decMode.Unmarshal(b, &e); err != nil {
		return nil, fmt.Errorf("%w: decode: %v", ErrInvalid, err)
	}
	if err := e.Validate(); err != nil {
		return nil, err
	}
	return &e, nil
}

// MarshalAck validates a and encodes it in deterministic CBOR.
func MarshalAck(a *Ack) ([]byte, error) {
	if err := a.Validate(); err != nil {
		return nil, err
	}
	b, err := encMode.Marshal(a)
	if err != nil {
		return nil, fmt.Errorf("fence: encode ack: %w", err)
	}
	return b, nil
}

// UnmarshalAck decodes and validates an ack.
func UnmarshalAck(b []byte) (*Ack, error) {
	if len(b) > MaxAckSize {
		return nil, fmt.Errorf("%w: %w: ack %d bytes, limit %d", ErrInvalid, ErrTooLarge, len(b), MaxAckSize)
	}
	var a Ack
	if err := decMode.Unmarshal(b, &a); err != nil {
		return nil, fmt.Errorf("%w: decode ack: %v", ErrInvalid, err)
	}
	if err := a.Validate(); err != nil {
		return nil, err
	}
	return &a, nil
}

// EncodeBody encodes v as a CBOR body in deterministic encoding.
func EncodeBody(v any) (cbor.RawMessage, error) {
	b, err := encMode.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("fence: encode body: %w", err)
	}
	if len(b) > MaxBodySize {
		return nil, fmt.Errorf("%w: body is %d bytes, limit %d", ErrTooLarge, len(b), MaxBodySize)
	}
	return b, nil
}

// DecodeBody decodes a body with the same limits as envelopes. Errors wrap
// ErrInvalid.
func DecodeBody(b cbor.RawMessage, v any) error {
	if len(b) > MaxBodySize {
		return fmt.Errorf("%w: %w: body %d bytes, limit %d", ErrInvalid, ErrTooLarge, len(b), MaxBodySize)
	}
	if err := decMode.Unmarshal(b, v); err != nil {
		var uf *cbor.UnknownFieldError
		if errors.As(err, &uf) {
			return fmt.Errorf("%w: decode body: %w", ErrInvalid, unknownField(b, v, uf.Index))
		}
		return fmt.Errorf("%w: decode body: %v", ErrInvalid, err)
	}
	return nil
}
