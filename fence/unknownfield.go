package fence

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"

	"github.com/fxamacker/cbor/v2"
)

// UnknownFieldError is what DecodeBody returns, wrapped with ErrInvalid,
// when the body is a map with a key the target struct has no field for.
// The CBOR decoder reports only the key's position in its map; this names
// the key, so that a device's Invalid ack says which field it refused.
type UnknownFieldError struct {
	Field string // the unknown key (CBOR diagnostic notation if not text)
	In    string // the body's key holding the map with the unknown key, "" at the top
	Index int    // the unknown key's position in its map, as the decoder reported it
}

// maxFieldShown bounds the key quoted in the message: an ack's reason is at
// most MaxReasonLen bytes, and the key is the part that must fit.
const maxFieldShown = 64

func (e *UnknownFieldError) Error() string {
	f := e.Field
	if len(f) > maxFieldShown {
		f = truncateUTF8(f, maxFieldShown) + "…"
	}
	switch {
	case e.In != "" && e.Field != "":
		return fmt.Sprintf("unknown field %q in %q", f, e.In)
	case e.In != "":
		return fmt.Sprintf("unknown field in %q (map element index %d)", e.In, e.Index)
	case e.Field != "":
		return fmt.Sprintf("unknown field %q", f)
	}
	return fmt.Sprintf("unknown field at map element index %d", e.Index)
}

// unknownField names the key the decoder refused, decoding b into v with
// index idx (its position in whichever map it is in). A key of the body's
// map is unknown if a map holding it alone, with a null value, is refused;
// otherwise the key whose value is refused holds the unknown key, and idx
// is a position in that value's map (or in one deeper down: then only the
// body's key and the index are given).
func unknownField(b []byte, v any, idx int) *UnknownFieldError {
	e := &UnknownFieldError{Index: idx}
	pairs, ok := mapPairs(b)
	if !ok || reflect.TypeOf(v).Kind() != reflect.Pointer {
		return e
	}
	refused := func(k, val []byte) bool {
		one := append(append([]byte{0xa1}, k...), val...) // a map of one pair
		err := decMode.Unmarshal(one, reflect.New(reflect.TypeOf(v).Elem()).Interface())
		var uf *cbor.UnknownFieldError
		return errors.As(err, &uf)
	}
	for _, p := range pairs {
		if refused(p[0], []byte{0xf6}) { // null
			e.Field = keyText(p[0])
			return e
		}
	}
	for _, p := range pairs {
		if refused(p[0], p[1]) {
			e.In = keyText(p[0])
			// The key at idx of the value's map, if unknown there itself
			// (deeper down, the message gives the index only).
			if inner, ok := mapPairs(p[1]); ok && idx < len(inner) &&
				refused(p[0], append(append([]byte{0xa1}, inner[idx][0]...), 0xf6)) {
				e.Field = keyText(inner[idx][0])
			}
			return e
		}
	}
	return e
}

// mapPairs splits a definite-length CBOR map into its raw keys and values.
func mapPairs(b []byte) ([][2]cbor.RawMessage, bool) {
	if len(b) == 0 || b[0]>>5 != 5 {
		return nil, false
	}
	n, hdr := uint64(b[0]&0x1f), 1
	switch {
	case n < 24:
	case n == 24 && len(b) >= 2:
		n, hdr = uint64(b[1]), 2
	case n == 25 && len(b) >= 3:
		n, hdr = uint64(binary.BigEndian.Uint16(b[1:])), 3
	case n == 26 && len(b) >= 5:
		n, hdr = uint64(binary.BigEndian.Uint32(b[1:])), 5
	case n == 27 && len(b) >= 9:
		n, hdr = binary.BigEndian.Uint64(b[1:]), 9
	default:
		return nil, false // indefinite length (never decoded this far) or truncated
	}
	if n > MaxMapPairs {
		return nil, false
	}
	dec := cbor.NewDecoder(bytes.NewReader(b[hdr:]))
	pairs := make([][2]cbor.RawMessage, n)
	for i := range pairs {
		if dec.Decode(&pairs[i][0]) != nil || dec.Decode(&pairs[i][1]) != nil {
			return nil, false
		}
	}
	return pairs, true
}

// keyText is a map key as text: the string itself, else its diagnostic
// notation (e.g. 7 for an integer key).
func keyText(k cbor.RawMessage) string {
	var s string
	if cbor.Unmarshal(k, &s) == nil {
		return s
	}
	if d, err := cbor.Diagnose(k); err == nil {
		return d
	}
	return fmt.Sprintf("%x", []byte(k))
}
