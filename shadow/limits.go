package shadow

import (
	"encoding/json"
	"fmt"
	"math"
)

// Defaults of Limits.
const (
	DefaultMaxSize  = 64 << 10 // bytes of the JSON encoding of a state or patch
	DefaultMaxDepth = 8        // nesting of objects and arrays; the top object is 1
)

// Limits bound documents and patches. The zero value (or a non-positive
// field) means the defaults.
type Limits struct {
	// MaxSize bounds the compact JSON encoding of a patch and of the state
	// that results from merging it (metadata not counted).
	MaxSize int
	// MaxDepth bounds the nesting of objects and arrays; the top-level
	// object is depth 1, {"a":{"b":[1]}} is depth 3.
	MaxDepth int
}

func (l Limits) withDefaults() Limits {
	if l.MaxSize <= 0 {
		l.MaxSize = DefaultMaxSize
	}
	if l.MaxDepth <= 0 {
		l.MaxDepth = DefaultMaxDepth
	}
	return l
}

// Normalize checks m against lim and returns a deep copy in the canonical
// form every function of this package works on: objects are
// map[string]any, arrays []any, numbers float64 (Go integer and float
// types and json.Number are converted), plus string, bool and nil. Other
// types and non-finite numbers are ErrInvalid; nesting beyond lim.MaxDepth
// is ErrTooDeep; an encoding larger than lim.MaxSize is ErrTooLarge. A nil
// m is an empty object.
func Normalize(m map[string]any, lim Limits) (map[string]any, error) {
	lim = lim.withDefaults()
	out, err := normObject(m, 1, lim.MaxDepth)
	if err != nil {
		return nil, err
	}
	if err := checkSize(out, lim); err != nil {
		return nil, err
	}
	return out, nil
}

func checkSize(m map[string]any, lim Limits) error {
	b, err := json.Marshal(m)
	if err != nil {
		return invalidf("encode: %v", err)
	}
	if len(b) > lim.MaxSize {
		return fmt.Errorf("%w: %w: %d bytes, limit %d", ErrInvalid, ErrTooLarge, len(b), lim.MaxSize)
	}
	return nil
}

func tooDeep(max int) error {
	return fmt.Errorf("%w: %w: more than %d levels", ErrInvalid, ErrTooDeep, max)
}

func normObject(m map[string]any, depth, max int) (map[string]any, error) {
	if depth > max {
		return nil, tooDeep(max)
	}
	out := make(map[string]any, len(m))
	for k, v := range m {
		nv, err := normValue(v, depth, max)
		if err != nil {
			return nil, err
		}
		out[k] = nv
	}
	return out, nil
}

// normValue normalizes v, found inside a container at depth.
func normValue(v any, depth, max int) (any, error) {
	switch x := v.(type) {
	case nil, bool, string:
		return x, nil
	case float64:
		return finite(x)
	case float32:
		return finite(float64(x))
	case int:
		return float64(x), nil
	case int8:
		return float64(x), nil
	case int16:
		return float64(x), nil
	case int32:
		return float64(x), nil
	case int64:
		return float64(x), nil
	case uint:
		return float64(x), nil
	case uint8:
		return float64(x), nil
	case uint16:
		return float64(x), nil
	case uint32:
		return float64(x), nil
	case uint64:
		return float64(x), nil
	case json.Number:
		f, err := x.Float64()
		if err != nil {
			return nil, invalidf("number %q: %v", string(x), err)
		}
		return finite(f)
	case map[string]any:
		return normObject(x, depth+1, max)
	case []any:
		if depth+1 > max {
			return nil, tooDeep(max)
		}
		out := make([]any, len(x))
		for i, e := range x {
			ne, err := normValue(e, depth+1, max)
			if err != nil {
				return nil, err
			}
			out[i] = ne
		}
		return out, nil
	default:
		return nil, invalidf("unsupported value type %T", v)
	}
}

func finite(f float64) (any, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return nil, invalidf("number %v is not finite", f)
	}
	return f, nil
}
