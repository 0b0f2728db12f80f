package profile

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/edgefence/edgefence/internal/keyerr"
)

// The file as written: pointers where absent and zero differ.
type rawProfile struct {
	Model        string       `yaml:"model"`
	Description  string       `yaml:"description"`
	PollInterval *interval    `yaml:"poll_interval"`
	MaxGap       *int         `yaml:"max_gap"`
	Fields       []rawField   `yaml:"fields"`
	Commands     []rawCommand `yaml:"commands"`
}

type rawField struct {
	Name         string           `yaml:"name"`
	Table        string           `yaml:"table"`
	Address      *int             `yaml:"address"`
	Type         string           `yaml:"type"`
	WordOrder    string           `yaml:"word_order"`
	Scale        *float64         `yaml:"scale"`
	Offset       *float64         `yaml:"offset"`
	Unit         string           `yaml:"unit"`
	Enum         map[string]int64 `yaml:"enum"`
	Writable     bool             `yaml:"writable"`
	Idempotent   *bool            `yaml:"idempotent"`
	Verify       bool             `yaml:"verify"`
	PollInterval *interval        `yaml:"poll_interval"`
}

type rawCommand struct {
	Kind       string     `yaml:"kind"`
	Field      string     `yaml:"field"`
	Writes     []rawWrite `yaml:"writes"`
	Idempotent *bool      `yaml:"idempotent"`
}

type rawWrite struct {
	Table   string `yaml:"table"`
	Address *int   `yaml:"address"`
	Value   *int   `yaml:"value"`
	Values  []int  `yaml:"values"`
}

// interval is a poll interval: a duration, or "never" (0).
type interval time.Duration

func (iv *interval) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return errors.New(`want a duration (5s, 500ms) or "never"`)
	}
	if n.Value == "never" {
		*iv = 0
		return nil
	}
	d, err := time.ParseDuration(n.Value)
	switch {
	case err != nil:
		return fmt.Errorf(`%q: want a duration (5s, 500ms) or "never"`, n.Value)
	case d != 0 && d < MinPollInterval:
		return fmt.Errorf("%v: want at least %v, or never", d, MinPollInterval)
	}
	*iv = interval(d)
	return nil
}

// decoder decodes a YAML node tree into the raw structs strictly, one key
// at a time, so that every problem has its key and line: unknown keys,
// keys given twice, aliases and values of the wrong type.
type decoder struct {
	file   string
	lines  map[string]int  // dotted key → line
	broken map[string]bool // fields with a problem: commands naming them are not reported again
	failed map[string]bool // keys whose values did not decode: not checked again
	built  bool            // decoding is over: checking the values
	errs   []error
}

func (d *decoder) bad(line int, key, format string, args ...any) {
	if !d.built {
		d.failed[key] = true
	} else if d.underFailed(key) {
		return // the value's problem is reported: not "required" too
	}
	d.errs = append(d.errs, &Error{File: d.file, Line: line, Key: key, Msg: fmt.Sprintf(format, args...)})
}

var unmarshalerType = reflect.TypeFor[yaml.Unmarshaler]()

func (d *decoder) decode(n *yaml.Node, v reflect.Value, key string) {
	if n.Kind == yaml.AliasNode {
		d.bad(n.Line, key, "aliases are not allowed in a profile: write the value out")
		return
	}
	t := v.Type()
	if t.Kind() == reflect.Pointer {
		if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
			return // absent
		}
		v.Set(reflect.New(t.Elem()))
		v = v.Elem()
		t = t.Elem()
	}
	switch {
	case reflect.PointerTo(t).Implements(unmarshalerType) || t.Kind() != reflect.Struct && t.Kind() != reflect.Slice && t.Kind() != reflect.Map:
		if err := n.Decode(v.Addr().Interface()); err != nil {
			d.bad(n.Line, key, "%s", yamlMessage(err))
		}
	case n.Kind == yaml.ScalarNode && n.Tag == "!!null":
	case t.Kind() == reflect.Struct:
		d.mapping(n, key, func(name string, vn *yaml.Node, k string) bool {
			f, ok := fieldByTag(t, name)
			if ok {
				d.decode(vn, v.FieldByIndex(f.Index), k)
			}
			return ok
		}, func() string { return strings.Join(tagNames(t), ", ") })
	case t.Kind() == reflect.Map:
		v.Set(reflect.MakeMap(t))
		d.mapping(n, key, func(name string, vn *yaml.Node, k string) bool {
			e := reflect.New(t.Elem()).Elem()
			d.decode(vn, e, k)
			v.SetMapIndex(reflect.ValueOf(name), e)
			return true
		}, nil)
	case n.Kind != yaml.SequenceNode:
		d.bad(n.Line, key, "want a list")
	default:
		v.Set(reflect.MakeSlice(t, len(n.Content), len(n.Content)))
		for i, item := range n.Content {
			k := key + "[" + strconv.Itoa(i) + "]"
			d.lines[k] = item.Line
			d.decode(item, v.Index(i), k)
		}
	}
}

// mapping decodes a mapping node: put decodes one key's value, under its
// dotted key, or returns false for an unknown key (known lists the keys
// for the message).
func (d *decoder) mapping(n *yaml.Node, key string, put func(name string, vn *yaml.Node, key string) bool, known func() string) {
	if n.Kind != yaml.MappingNode {
		d.bad(n.Line, key, "want a mapping of keys")
		return
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		kn, vn := n.Content[i], n.Content[i+1]
		k := kn.Value
		if key != "" {
			k = key + "." + kn.Value
		}
		if kn.Kind != yaml.ScalarNode {
			d.bad(kn.Line, key, "a key must be a plain string")
			continue
		}
		if seen[kn.Value] {
			d.bad(kn.Line, k, "given twice")
			continue
		}
		seen[kn.Value] = true
		d.lines[k] = kn.Line
		if !put(kn.Value, vn, k) {
			delete(d.lines, k)
			d.bad(kn.Line, k, "unknown key (want one of %s)", known())
		}
	}
}

func fieldByTag(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		if tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ","); tag == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

func tagNames(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		tag, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		out = append(out, tag)
	}
	return out
}

var yamlLineRE = regexp.MustCompile(`^(?:yaml: )?(?:line \d+: )?`)

// yamlMessage is a yaml/v3 decoding error without its line (the caller's
// Error has it): "cannot unmarshal !!str `x` into int".
func yamlMessage(err error) string {
	var te *yaml.TypeError
	if errors.As(err, &te) && len(te.Errors) > 0 {
		msgs := slices.Clone(te.Errors)
		for i, m := range msgs {
			msgs[i] = yamlLineRE.ReplaceAllString(m, "")
		}
		return strings.Join(msgs, "; ")
	}
	return yamlLineRE.ReplaceAllString(err.Error(), "")
}

// underFailed reports whether key, or a key above it, did not decode.
func (d *decoder) underFailed(key string) bool {
	for key != "" {
		if d.failed[key] {
			return true
		}
		i := strings.LastIndexAny(key, ".[")
		if i < 0 {
			return false
		}
		key = key[:i]
	}
	return false
}

// line is the line of key, or of its nearest parent in the file.
func (d *decoder) line(key string) int { return keyerr.Line(d.lines, key) }
