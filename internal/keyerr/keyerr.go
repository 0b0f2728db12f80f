// Package keyerr is what the agent's config and the Modbus device profiles
// share about a problem in a YAML file: it is at a line, under a dotted key
// (devices[3].fence, fields[2].type), and printed as compilers print
// theirs, FILE:LINE: KEY: MESSAGE.
package keyerr

import (
	"fmt"
	"strings"
)

// Format returns file:line: key: msg, leaving out what is unknown (an
// empty file or key, line 0).
func Format(file string, line int, key, msg string) string {
	var b strings.Builder
	switch {
	case file != "" && line > 0:
		fmt.Fprintf(&b, "%s:%d: ", file, line)
	case file != "":
		b.WriteString(file + ": ")
	case line > 0:
		fmt.Fprintf(&b, "line %d: ", line)
	}
	if key != "" {
		b.WriteString(key + ": ")
	}
	b.WriteString(msg)
	return b.String()
}

// All returns the errors of type T in err, joined (errors.Join) or
// wrapped, in order; a T is not looked into.
func All[T error](err error) []T {
	var out []T
	var walk func(error)
	walk = func(err error) {
		if e, ok := err.(T); ok {
			out = append(out, e)
			return
		}
		switch u := err.(type) {
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				walk(e)
			}
		case interface{ Unwrap() error }:
			if e := u.Unwrap(); e != nil {
				walk(e)
			}
		}
	}
	if err != nil {
		walk(err)
	}
	return out
}

// Line returns the line of key in lines, or of its nearest parent there
// (devices[3] for devices[3].serial.port); 0 if none is.
func Line(lines map[string]int, key string) int {
	for key != "" {
		if l, ok := lines[key]; ok {
			return l
		}
		i := strings.LastIndexAny(key, ".[")
		if i < 0 {
			return 0
		}
		key = key[:i]
	}
	return 0
}
