package shadow

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"

	"github.com/fxamacker/cbor/v2"
)

// DecodeJSON parses one JSON object (a document or a patch) and returns it
// in Normalize's form. Input larger than lim.MaxSize is refused before it
// is parsed. Anything but exactly one object is ErrInvalid.
func DecodeJSON(b []byte, lim Limits) (map[string]any, error) {
	lim = lim.withDefaults()
	if len(b) > lim.MaxSize {
		return nil, fmt.Errorf("%w: %w: %d bytes, limit %d", ErrInvalid, ErrTooLarge, len(b), lim.MaxSize)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, invalidf("JSON: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, invalidf("JSON: data after the object")
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, invalidf("JSON: want an object, got %s", jsonKind(v))
	}
	return Normalize(m, lim)
}

// EncodeJSON encodes m as compact JSON with sorted keys.
func EncodeJSON(m map[string]any) ([]byte, error) {
	if m == nil {
		m = map[string]any{}
	}
	b, err := json.Marshal(m)
	if err != nil {
		return nil, invalidf("encode JSON: %v", err)
	}
	return b, nil
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case []any:
		return "an array"
	case string:
		return "a string"
	case float64:
		return "a number"
	case bool:
		return "a boolean"
	}
	return fmt.Sprintf("%T", v)
}

// maxSafeInt is the largest integer a float64 holds exactly (2^53).
const maxSafeInt = 1 << 53

var (
	cborEnc cbor.EncMode
	cborDec cbor.DecMode
)

func init() {
	var err error
	cborEnc, err = cbor.CoreDetEncOptions().EncMode()
	if err != nil {
		panic(err) // static options; cannot fail
	}
	cborDec, err = cbor.DecOptions{
		DupMapKey:        cbor.DupMapKeyEnforcedAPF,
		IndefLength:      cbor.IndefLengthForbidden,
		TagsMd:           cbor.TagsForbidden,
		MaxNestedLevels:  64, // Normalize enforces Limits.MaxDepth
		MaxArrayElements: 1 << 16,
		MaxMapPairs:      1 << 16,
		UTF8:             cbor.UTF8RejectInvalid,
		DefaultMapType:   reflect.TypeOf(map[string]any(nil)),
	}.DecMode()
	if err != nil {
		panic(err)
	}
}

// EncodeCBOR encodes m for the device link in deterministic CBOR (RFC 8949
// core deterministic encoding: sorted keys, shortest forms). Whole numbers
// within ±2^53 are encoded as CBOR integers, so a device never has to parse
// a float for a setpoint of 21. m is checked with Normalize.
func EncodeCBOR(m map[string]any, lim Limits) ([]byte, error) {
	n, err := Normalize(m, lim)
	if err != nil {
		return nil, err
	}
	b, err := cborEnc.Marshal(intsForCBOR(n))
	if err != nil {
		return nil, invalidf("encode CBOR: %v", err)
	}
	return b, nil
}

// DecodeCBOR decodes one CBOR map with text keys (a document or a patch)
// into Normalize's form: integers become float64 (exact within ±2^53).
// Tags, byte strings, indefinite lengths, duplicate keys and trailing data
// are ErrInvalid; the limits apply as in DecodeJSON (MaxSize to the CBOR
// input and to the JSON form).
func DecodeCBOR(b []byte, lim Limits) (map[string]any, error) {
	lim = lim.withDefaults()
	if len(b) > lim.MaxSize {
		return nil, fmt.Errorf("%w: %w: %d bytes, limit %d", ErrInvalid, ErrTooLarge, len(b), lim.MaxSize)
	}
	var v any
	if err := cborDec.Unmarshal(b, &v); err != nil {
		if errors.As(err, new(*cbor.MaxNestedLevelError)) {
			return nil, tooDeep(lim.MaxDepth)
		}
		return nil, invalidf("CBOR: %v", err)
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, invalidf("CBOR: want a map with text keys, got %T", v)
	}
	return Normalize(m, lim)
}

// intsForCBOR returns a copy of v (in Normalize's form) with whole float64
// values within ±2^53 replaced by int64.
func intsForCBOR(v any) any {
	switch x := v.(type) {
	case float64:
		if x == math.Trunc(x) && math.Abs(x) <= maxSafeInt && !(x == 0 && math.Signbit(x)) {
			return int64(x)
		}
		return x
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = intsForCBOR(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = intsForCBOR(e)
		}
		return out
	}
	return v
}
