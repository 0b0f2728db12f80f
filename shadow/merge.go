package shadow

import "reflect"

// Merge returns dst with patch applied, following JSON Merge Patch (RFC
// 7386): a field of patch replaces the field of dst, except that null
// deletes the field and an object merges field by field into the object
// of dst (a non-object field of dst counts as an empty object); arrays and
// scalars replace whole. Neither argument is modified and the result
// shares nothing with them. Both are expected in Normalize's form.
func Merge(dst, patch map[string]any) map[string]any {
	out := Clone(dst)
	mergeInto(out, patch)
	return out
}

func mergeInto(dst, patch map[string]any) {
	for k, v := range patch {
		switch pv := v.(type) {
		case nil:
			delete(dst, k)
		case map[string]any:
			cur, ok := dst[k].(map[string]any)
			if !ok {
				cur = make(map[string]any, len(pv))
				dst[k] = cur
			}
			mergeInto(cur, pv)
		default:
			dst[k] = cloneValue(v)
		}
	}
}

// Delta returns the fields of desired that differ from reported: nested
// objects are compared field by field, anything else (arrays included) as
// a whole. Merging the result into reported makes every field desired sets
// equal to desired; fields only reported has are left alone. The result is
// empty (never nil) when reported already satisfies desired.
func Delta(desired, reported map[string]any) map[string]any {
	out := make(map[string]any)
	for k, dv := range desired {
		rv, ok := reported[k]
		if dm, isObj := dv.(map[string]any); isObj {
			if rm, ok := rv.(map[string]any); ok {
				if sub := Delta(dm, rm); len(sub) > 0 {
					out[k] = sub
				}
				continue
			}
			out[k] = Clone(dm)
			continue
		}
		if !ok || !Equal(dv, rv) {
			out[k] = cloneValue(dv)
		}
	}
	return out
}

// Equal reports whether two values in Normalize's form are equal (objects
// and arrays deeply). Values of other types are compared with
// reflect.DeepEqual.
func Equal(a, b any) bool {
	switch x := a.(type) {
	case nil:
		return b == nil
	case string:
		y, ok := b.(string)
		return ok && x == y
	case float64:
		y, ok := b.(float64)
		return ok && x == y
	case bool:
		y, ok := b.(bool)
		return ok && x == y
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k, xv := range x {
			yv, ok := y[k]
			if !ok || !Equal(xv, yv) {
				return false
			}
		}
		return true
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !Equal(x[i], y[i]) {
				return false
			}
		}
		return true
	}
	return reflect.DeepEqual(a, b)
}

// Clone returns a deep copy of m (nil gives an empty object).
func Clone(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = cloneValue(v)
	}
	return out
}

func cloneValue(v any) any {
	switch x := v.(type) {
	case map[string]any:
		return Clone(x)
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = cloneValue(e)
		}
		return out
	default:
		return v
	}
}
