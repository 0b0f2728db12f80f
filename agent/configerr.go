package agent

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/edgefence/edgefence/internal/keyerr"
)

// ConfigError is one problem in a configuration: the dotted key it is
// about (devices[3].fence), and where the key is, when known. It wraps
// ErrConfig. Config errors come joined (errors.Join), one per problem.
type ConfigError struct {
	File string // the config file, when read from one
	Line int    // 1-based line of Key in File; 0 if the key is not in the file
	Key  string // dotted key, e.g. etcd.lease_ttl or devices[3].fence; or a flag, e.g. --etcd
	Msg  string
}

func (e *ConfigError) Error() string { return keyerr.Format(e.File, e.Line, e.Key, e.Msg) }

// Unwrap makes errors.Is(err, ErrConfig) true.
func (e *ConfigError) Unwrap() error { return ErrConfig }

// ConfigErrors returns the ConfigErrors in err (joined or single), in order.
func ConfigErrors(err error) []*ConfigError { return keyerr.All[*ConfigError](err) }

// keyLines maps the dotted keys present in a YAML document to their lines.
type keyLines map[string]int

// line returns the line of key, or of its nearest parent in the file.
func (kl keyLines) line(key string) int { return keyerr.Line(kl, key) }

// keyAt returns the deepest key on line, for errors yaml reports by line.
func (kl keyLines) keyAt(line int) string {
	best := ""
	for k, l := range kl {
		if l == line && (len(k) > len(best) || len(k) == len(best) && k < best) {
			best = k
		}
	}
	return best
}

var unmarshalerType = reflect.TypeFor[yaml.Unmarshaler]()

// walkNode records the line of every key under n, a node decoding into t,
// reports keys t does not have, and returns the keys whose values are
// aliases.
func walkNode(n *yaml.Node, t reflect.Type, key string, lines keyLines, errs *[]error) (aliased []string) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n.Kind == yaml.AliasNode {
		// Not followed: the anchor's keys are checked where it is, and
		// following aliases would multiply the work (billion laughs).
		return []string{key}
	}
	if reflect.PointerTo(t).Implements(unmarshalerType) {
		return nil // a leaf with its own decoding (Secret)
	}
	switch {
	case t.Kind() == reflect.Struct && n.Kind == yaml.MappingNode:
		fields := yamlFields(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			child := k.Value
			if key != "" {
				child = key + "." + k.Value
			}
			f, ok := fields[k.Value]
			if !ok {
				msg := "unknown key"
				if s := suggest(k.Value, fields); s != "" {
					msg += " (did you mean " + s + "?)"
				}
				*errs = append(*errs, &ConfigError{Line: k.Line, Key: child, Msg: msg})
				continue
			}
			lines[child] = k.Line
			aliased = append(aliased, walkNode(v, f.Type, child, lines, errs)...)
		}
	case t.Kind() == reflect.Map && n.Kind == yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			lines[key+"."+n.Content[i].Value] = n.Content[i].Line
		}
	case t.Kind() == reflect.Slice && n.Kind == yaml.SequenceNode:
		for i, item := range n.Content {
			child := key + "[" + strconv.Itoa(i) + "]"
			lines[child] = item.Line
			aliased = append(aliased, walkNode(item, t.Elem(), child, lines, errs)...)
		}
	}
	return aliased
}

// yamlFields returns the fields of struct type t by yaml name.
func yamlFields(t reflect.Type) map[string]reflect.StructField {
	out := make(map[string]reflect.StructField, t.NumField())
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		out[name] = f
	}
	return out
}

// ConfigKeys returns every dotted key of Config, list items as [], for
// documentation checks: e.g. etcd.lease_ttl, devices[].serial.port.
func ConfigKeys() []string {
	var out []string
	var walk func(t reflect.Type, prefix string)
	walk = func(t reflect.Type, prefix string) {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		switch {
		case reflect.PointerTo(t).Implements(unmarshalerType):
		case t.Kind() == reflect.Struct && t != reflect.TypeFor[struct{}]():
			if t.PkgPath() == "time" {
				return
			}
			fields := yamlFields(t)
			names := make([]string, 0, len(fields))
			for n := range fields {
				names = append(names, n)
			}
			sort.Strings(names)
			for _, n := range names {
				k := n
				if prefix != "" {
					k = prefix + "." + n
				}
				out = append(out, k)
				walk(fields[n].Type, k)
			}
		case t.Kind() == reflect.Slice && t.Elem().Kind() != reflect.String:
			walk(t.Elem(), prefix+"[]")
		}
	}
	walk(reflect.TypeFor[Config](), "")
	return out
}

// suggest returns the known key closest to s, if it is close.
func suggest(s string, fields map[string]reflect.StructField) string {
	best, bestD := "", 3
	for k := range fields {
		d := editDistance(s, k)
		if d < bestD || d == bestD && best != "" && k < best {
			best, bestD = k, d
		}
	}
	if bestD > 2 || bestD >= len(s) {
		return ""
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

var yamlLineRE = regexp.MustCompile(`^(?:yaml: )?line (\d+): (.*)$`)

// yamlErrors converts a yaml/v3 decoding error into ConfigErrors with
// lines (and keys, where the line has one).
func yamlErrors(err error, lines keyLines, syntax bool) []error {
	var msgs []string
	var te *yaml.TypeError
	if errors.As(err, &te) {
		msgs = te.Errors
	} else {
		msgs = []string{err.Error()}
	}
	out := make([]error, 0, len(msgs))
	for _, m := range msgs {
		ce := &ConfigError{Msg: m}
		if sm := yamlLineRE.FindStringSubmatch(m); sm != nil {
			ce.Line, _ = strconv.Atoi(sm[1])
			ce.Msg = sm[2]
			if !syntax {
				ce.Key = lines.keyAt(ce.Line)
			}
		}
		if syntax {
			ce.Msg = "yaml syntax: " + strings.TrimPrefix(ce.Msg, "yaml: ")
		}
		out = append(out, ce)
	}
	return out
}

// aliasBomb says where the aliases are that make root expand to far more
// nodes than it has (yaml/v3 refuses such a document with "document
// contains excessive aliasing", naming no key): from the root it follows,
// along the config's keys, the child that holds most of the expansion,
// and stops at an alias or where the expansion is spread over many
// children (devices: [*a, *a, …]). It returns nil if no key can be named.
func aliasBomb(root *yaml.Node, lines keyLines) *ConfigError {
	sizes := map[*yaml.Node]uint64{}
	var size func(n *yaml.Node) uint64
	size = func(n *yaml.Node) uint64 {
		if s, ok := sizes[n]; ok {
			return s
		}
		sizes[n] = 1 // an alias of its own ancestor counts once
		s := uint64(1)
		if n.Kind == yaml.AliasNode && n.Alias != nil {
			s = size(n.Alias)
		}
		for _, c := range n.Content {
			s = min(s+size(c), 1<<62)
		}
		sizes[n] = s
		return s
	}
	n, t, key := root, reflect.TypeFor[Config](), ""
	for n.Kind != yaml.AliasNode {
		var best *yaml.Node
		var bestT reflect.Type
		bestKey := ""
		var sum uint64 // of the children that decode: not unknown keys
		consider := func(c *yaml.Node, ct reflect.Type, ck string) {
			sum = min(sum+size(c), 1<<62)
			if best == nil || size(c) > size(best) {
				best, bestT, bestKey = c, ct, ck
			}
		}
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		switch {
		case t.Kind() == reflect.Struct && n.Kind == yaml.MappingNode:
			fields := yamlFields(t)
			for i := 0; i+1 < len(n.Content); i += 2 {
				if f, ok := fields[n.Content[i].Value]; ok {
					consider(n.Content[i+1], f.Type, strings.TrimPrefix(key+"."+n.Content[i].Value, "."))
				}
			}
		case t.Kind() == reflect.Slice && n.Kind == yaml.SequenceNode:
			for i, c := range n.Content {
				consider(c, t.Elem(), key+"["+strconv.Itoa(i)+"]")
			}
		}
		if best == nil || 2*size(best) <= sum {
			break
		}
		n, t, key = best, bestT, bestKey
	}
	total := size(n)
	if n == root {
		return nil // no key to name: yaml's message stands
	}
	ce := &ConfigError{Line: lines.line(key), Key: key}
	if n.Kind == yaml.AliasNode {
		ce.Line = n.Line
		ce.Msg = fmt.Sprintf("alias *%s expands to %d nodes: excessive aliasing (a YAML alias bomb?); write the value out", n.Value, total)
	} else {
		ce.Msg = fmt.Sprintf("its aliases expand to %d nodes: excessive aliasing (a YAML alias bomb?); write the values out", total)
	}
	return ce
}
