package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/edgefence/edgefence/fence"
)

// JSONToBody converts a JSON value to a CBOR command body. Empty input means
// no body. Integral numbers become CBOR integers (a register address, a
// count), others floats. What CBOR cannot carry as written is refused,
// naming where in the body it is, before any command is issued: a second
// value after the first, an integer beyond 64 bits, a number beyond a
// float64 (1e999 would be +Inf) or a non-zero one that would round to 0.
// Errors wrap ErrBadBody.
func JSONToBody(js []byte) ([]byte, error) {
	if len(bytes.TrimSpace(js)) == 0 {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("%w: not JSON: %v", ErrBadBody, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: data after its JSON value", ErrBadBody)
	}
	v, err := numbers(v, "")
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadBody, err)
	}
	return fence.EncodeBody(v)
}

// numbers replaces json.Numbers with int64, uint64 or float64, refusing
// those none of them holds faithfully. path is where v is in the body.
func numbers(v any, path string) (any, error) {
	switch x := v.(type) {
	case json.Number:
		return number(x, path)
	case map[string]any:
		for _, k := range slices.Sorted(maps.Keys(x)) { // the first bad one in a stable order
			p := k
			if path != "" {
				p = path + "." + k
			}
			n, err := numbers(x[k], p)
			if err != nil {
				return nil, err
			}
			x[k] = n
		}
	case []any:
		for i, e := range x {
			n, err := numbers(e, fmt.Sprintf("%s[%d]", path, i))
			if err != nil {
				return nil, err
			}
			x[i] = n
		}
	}
	return v, nil
}

// number converts one JSON number.
func number(x json.Number, path string) (any, error) {
	s := string(x)
	if i, err := x.Int64(); err == nil {
		return i, nil
	}
	if u, err := strconv.ParseUint(s, 10, 64); err == nil {
		return u, nil
	}
	where := "the body"
	if path != "" {
		where = strconv.Quote(path)
	}
	if !strings.ContainsAny(s, ".eE") {
		return nil, fmt.Errorf("%s: integer %s does not fit in 64 bits", where, s)
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil { // out of range: ±Inf
		return nil, fmt.Errorf("%s: %s is beyond a 64-bit float (it would be sent as %v)", where, s, f)
	}
	mant, _, _ := strings.Cut(strings.ToLower(s), "e")
	if f == 0 && strings.ContainsAny(mant, "123456789") {
		return nil, fmt.Errorf("%s: %s is too small for a 64-bit float (it would be sent as 0)", where, s)
	}
	return f, nil
}
