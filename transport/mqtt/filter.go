package mqtt

import (
	"strings"
	"unicode/utf8"
)

// maxStringLen is the MQTT limit for UTF-8 strings and binary data
// (two-byte length prefix). paho silently truncates longer values.
const maxStringLen = 65535

// validTopic reports whether name is a valid topic name to publish to.
func validTopic(name string) bool {
	return name != "" && len(name) <= maxStringLen && utf8.ValidString(name) &&
		!strings.ContainsAny(name, "+#\x00")
}

// validFilter reports whether filter is a valid topic filter: '+' and '#'
// must each fill a whole level and '#' must be the last level. Shared
// subscriptions ($share/<group>/<filter>) are accepted.
func validFilter(filter string) bool {
	if filter == "" || len(filter) > maxStringLen || !utf8.ValidString(filter) ||
		strings.ContainsRune(filter, 0) {
		return false
	}
	if rest, ok := strings.CutPrefix(filter, "$share/"); ok {
		group, f, ok := strings.Cut(rest, "/")
		if !ok || group == "" || f == "" || strings.ContainsAny(group, "+#") {
			return false
		}
		filter = f
	}
	levels := strings.Split(filter, "/")
	for i, l := range levels {
		switch {
		case l == "#":
			if i != len(levels)-1 {
				return false
			}
		case l == "+":
		case strings.ContainsAny(l, "+#"):
			return false
		}
	}
	return true
}

// matchFilter reports whether topic matches filter under MQTT rules. A
// filter starting with a wildcard does not match topics starting with '$'.
// The filter is assumed valid (see validFilter).
func matchFilter(filter, topic string) bool {
	if rest, ok := strings.CutPrefix(filter, "$share/"); ok {
		_, filter, _ = strings.Cut(rest, "/")
	}
	if strings.HasPrefix(topic, "$") && (strings.HasPrefix(filter, "+") || strings.HasPrefix(filter, "#")) {
		return false
	}
	for {
		fl, frest, fmore := strings.Cut(filter, "/")
		if fl == "#" {
			return true // matches the parent level and everything below
		}
		tl, trest, tmore := strings.Cut(topic, "/")
		if fl != "+" && fl != tl {
			return false
		}
		switch {
		case !fmore && !tmore:
			return true
		case !tmore:
			return frest == "#" // "a/#" matches "a"
		case !fmore:
			return false
		}
		filter, topic = frest, trest
	}
}

// routes indexes subscriptions (by their position in registration order)
// for delivery: a filter without wildcards matches exactly one topic, so
// it is found by a map lookup; only filters with wildcards are matched one
// by one. With one filter per device, delivery no longer grows with the
// number of devices.
type routes struct {
	exact map[string][]int // topic → subscriptions whose filter is that topic
	wild  []int            // subscriptions whose filter has '+' or '#'
}

// add indexes subscription i with a valid filter.
func (r *routes) add(i int, filter string) {
	f := filter
	if rest, ok := strings.CutPrefix(f, "$share/"); ok {
		_, f, _ = strings.Cut(rest, "/")
	}
	if strings.ContainsAny(f, "+#") {
		r.wild = append(r.wild, i)
		return
	}
	if r.exact == nil {
		r.exact = make(map[string][]int)
	}
	r.exact[f] = append(r.exact[f], i)
}
