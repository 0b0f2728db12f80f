package agent

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
)

// Device labels and fan-out selections.
//
// A device may carry labels in the config (`labels: {site: a, kind:
// meter}`). A fan-out (POST /v1/fanout, `edgefence send --devices` or
// `--selector`) selects the devices it commands in one of three ways:
//
//   - an explicit list of device ids (ids this agent does not know are
//     reported per device, as unknown);
//   - a glob over the configured device ids, with path.Match semantics
//     (`*` any run of characters, `?` one, `[a-z]` a class; device ids
//     have no '/', so `*` spans the whole id);
//   - a label selector: terms joined by commas, all of which must hold;
//     `key=value` holds for a device whose label key has that value,
//     `key!=value` for one whose label key is absent or another value.

// Label keys and values: keys 1–63 of [a-z0-9._-] starting with a letter
// or digit; values 1–63 of [A-Za-z0-9._-].
const maxLabelLen = 63

// ErrSelection is the error of a selection that is malformed or selects
// no device; the local API answers it 400.
var ErrSelection = errors.New("bad device selection")

// labelKeyProblem says what is wrong with k as a label key, or "".
func labelKeyProblem(k string) string {
	if k == "" || len(k) > maxLabelLen {
		return fmt.Sprintf("label key %q must be 1 to %d characters", k, maxLabelLen)
	}
	if !isLower(k[0]) && !isDigit(k[0]) {
		return fmt.Sprintf("label key %q must start with a-z or 0-9", k)
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; !isLower(c) && !isDigit(c) && c != '.' && c != '_' && c != '-' {
			return fmt.Sprintf("label key %q: character %q not in [a-z0-9._-]", k, c)
		}
	}
	return ""
}

// labelValueProblem says what is wrong with v as a label value, or "".
func labelValueProblem(v string) string {
	if v == "" || len(v) > maxLabelLen {
		return fmt.Sprintf("label value %q must be 1 to %d characters", v, maxLabelLen)
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; !isLower(c) && !isDigit(c) && !(c >= 'A' && c <= 'Z') && c != '.' && c != '_' && c != '-' {
			return fmt.Sprintf("label value %q: character %q not in [A-Za-z0-9._-]", v, c)
		}
	}
	return ""
}

func isLower(c byte) bool { return c >= 'a' && c <= 'z' }
func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// checkLabels is the rule of a device's labels: each key and value,
// reported under devices[i].labels.KEY.
func checkLabels(v deviceCheck, bad badFunc) {
	keys := make([]string, 0, len(v.d.Labels))
	for k := range v.d.Labels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if p := labelKeyProblem(k); p != "" {
			bad(v.key+".labels."+k, "%s", p)
		} else if p := labelValueProblem(v.d.Labels[k]); p != "" {
			bad(v.key+".labels."+k, "%s", p)
		}
	}
}

// labelTerm is one term of a selector: key=value, or key!=value (not).
type labelTerm struct {
	key, value string
	not        bool
}

// Selector is a parsed label selector.
type Selector []labelTerm

// ParseSelector parses s: terms `key=value` or `key!=value` joined by
// commas, all of which must hold. An error wraps ErrSelection and names
// the term.
func ParseSelector(s string) (Selector, error) {
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("%w: empty selector", ErrSelection)
	}
	var sel Selector
	for term := range strings.SplitSeq(s, ",") {
		term = strings.TrimSpace(term)
		var t labelTerm
		k, v, ok := strings.Cut(term, "!=")
		if ok {
			t.not = true
		} else if k, v, ok = strings.Cut(term, "="); !ok {
			return nil, fmt.Errorf("%w: selector term %q: want key=value or key!=value", ErrSelection, term)
		}
		t.key, t.value = strings.TrimSpace(k), strings.TrimSpace(v)
		if p := labelKeyProblem(t.key); p != "" {
			return nil, fmt.Errorf("%w: selector term %q: %s", ErrSelection, term, p)
		}
		if p := labelValueProblem(t.value); p != "" {
			return nil, fmt.Errorf("%w: selector term %q: %s", ErrSelection, term, p)
		}
		sel = append(sel, t)
	}
	return sel, nil
}

// Matches reports whether a device with labels satisfies every term.
func (s Selector) Matches(labels map[string]string) bool {
	for _, t := range s {
		v, ok := labels[t.key]
		if t.not == (ok && v == t.value) {
			return false
		}
	}
	return true
}

// Selection says which devices one fan-out commands: exactly one of its
// fields is set.
type Selection struct {
	Devices  []string `json:"devices,omitempty"`  // explicit device ids
	Glob     string   `json:"glob,omitempty"`     // path.Match over the configured ids
	Selector string   `json:"selector,omitempty"` // labels, e.g. site=a,kind!=meter
}

// resolve returns the device ids sel selects among the configured devices
// (in config order for a glob or selector; as given, duplicates dropped,
// for a list, unknown ids included: the fan-out reports them). An error
// wraps ErrSelection.
func (sel Selection) resolve(cfg []DeviceConfig) ([]string, error) {
	n := 0
	for _, set := range []bool{len(sel.Devices) > 0, sel.Glob != "", sel.Selector != ""} {
		if set {
			n++
		}
	}
	if n != 1 {
		return nil, fmt.Errorf("%w: give exactly one of devices, glob and selector", ErrSelection)
	}
	var out []string
	switch {
	case len(sel.Devices) > 0:
		seen := make(map[string]bool, len(sel.Devices))
		for _, d := range sel.Devices {
			if !seen[d] {
				seen[d] = true
				out = append(out, d)
			}
		}
		return out, nil
	case sel.Glob != "":
		if _, err := path.Match(sel.Glob, ""); err != nil {
			return nil, fmt.Errorf("%w: glob %q: %w", ErrSelection, sel.Glob, err)
		}
		for _, d := range cfg {
			if ok, _ := path.Match(sel.Glob, d.ID); ok {
				out = append(out, d.ID)
			}
		}
	default:
		s, err := ParseSelector(sel.Selector)
		if err != nil {
			return nil, err
		}
		for _, d := range cfg {
			if s.Matches(d.Labels) {
				out = append(out, d.ID)
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: %s selects no configured device", ErrSelection, sel)
	}
	return out, nil
}

// String says what sel is, for messages.
func (sel Selection) String() string {
	switch {
	case sel.Glob != "":
		return fmt.Sprintf("glob %q", sel.Glob)
	case sel.Selector != "":
		return fmt.Sprintf("selector %q", sel.Selector)
	}
	return fmt.Sprintf("%d listed devices", len(sel.Devices))
}
