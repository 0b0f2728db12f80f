package profile

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/edgefence/edgefence/transport/modbus"
)

// The name patterns are compiled on first use: their bounded repetitions
// make ~75 KB of programs, which an agent without Modbus profiles would
// otherwise keep on its heap from start to exit (docs/BENCHMARKS.md, "Agent
// RSS at 10 devices").
var (
	modelRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$`) })
	fieldRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_]{0,63}$`) })
	kindRE  = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9._:/-]{1,64}$`) })
)

// build validates raw and returns the profile; problems go to d.errs.
func (d *decoder) build(raw *rawProfile) *Profile {
	p := &Profile{
		Model:        raw.Model,
		Description:  raw.Description,
		PollInterval: DefaultPollInterval,
		MaxGap:       DefaultMaxGap,
		byName:       map[string]*Field{},
		byKind:       map[string]*Command{},
	}
	switch {
	case raw.Model == "":
		d.bad(d.line("model"), "model", "required: the name devices give as modbus.profile")
	case !modelRE().MatchString(raw.Model):
		d.bad(d.line("model"), "model", "%q: want 1 to 64 of [A-Za-z0-9._-], not starting with '.'", raw.Model)
	}
	if raw.PollInterval != nil {
		p.PollInterval = time.Duration(*raw.PollInterval)
	}
	if raw.MaxGap != nil {
		if g := *raw.MaxGap; g < 0 || g > MaxGap {
			d.bad(d.line("max_gap"), "max_gap", "%d: want 0..%d", g, MaxGap)
		} else {
			p.MaxGap = g
		}
	}
	if len(raw.Fields) == 0 && len(raw.Commands) == 0 {
		d.bad(d.line("fields"), "fields", "a profile needs fields or commands")
	}
	for i := range raw.Fields {
		key := fmt.Sprintf("fields[%d]", i)
		f := d.field(&raw.Fields[i], key, p.PollInterval)
		switch {
		case f == nil:
			d.broken[raw.Fields[i].Name] = true
		case p.byName[f.Name] != nil:
			d.bad(d.line(key+".name"), key+".name", "%q: a field of that name is listed above", f.Name)
		default:
			f.index = i
			p.byName[f.Name] = f
			p.Fields = append(p.Fields, f)
		}
	}
	d.overlaps(p.Fields)
	for i := range raw.Commands {
		key := fmt.Sprintf("commands[%d]", i)
		if c := d.command(&raw.Commands[i], key, p); c != nil {
			if _, dup := p.byKind[c.Kind]; dup {
				d.bad(d.line(key+".kind"), key+".kind", "%q: a command of that kind is listed above", c.Kind)
				continue
			}
			p.byKind[c.Kind] = c
			p.Commands = append(p.Commands, c)
		}
	}
	p.blocks = coalesce(p.Fields, p.MaxGap)
	return p
}

// field validates one field; nil if it has a problem.
func (d *decoder) field(r *rawField, key string, poll time.Duration) *Field {
	n := len(d.errs)
	bad := func(k, format string, args ...any) { d.bad(d.line(key+"."+k), key+"."+k, format, args...) }
	f := &Field{Name: r.Name, Unit: r.Unit, Writable: r.Writable, Verify: r.Verify, Idempotent: true, Scale: 1, PollInterval: poll, decimals: -1}
	if !fieldRE().MatchString(r.Name) {
		bad("name", "%q: want a twin field name: a letter, then letters, digits or '_', at most 64", r.Name)
	}
	f.Table = tableNames[r.Table]
	if f.Table == 0 {
		bad("table", "%q: want holding, input, coil or discrete", r.Table)
		return nil
	}
	d.fieldType(r, f, bad)
	if r.Address == nil {
		bad("address", "required")
	} else if a := *r.Address; a < 0 || f.Type != 0 && a+f.Type.Width() > 1<<16 {
		bad("address", "%d: want 0..%d for a %s", a, 1<<16-f.Type.Width(), f.Type)
	} else {
		f.Address = uint16(a)
	}
	switch {
	case r.Writable && !f.Table.Writable():
		bad("writable", "a %s table is read-only: writable is for holding registers and coils", f.Table)
	case r.Idempotent != nil && !f.Table.Writable():
		bad("idempotent", "for writes: only holding registers and coils")
	case r.Verify && !f.Table.Writable():
		bad("verify", "for writes: only holding registers and coils")
	}
	if r.Idempotent != nil {
		f.Idempotent = *r.Idempotent
	}
	if r.PollInterval != nil {
		f.PollInterval = time.Duration(*r.PollInterval)
	}
	if len(d.errs) > n {
		return nil
	}
	return f
}

// fieldType validates a field's type, word order, scale, offset and enum.
func (d *decoder) fieldType(r *rawField, f *Field, bad func(k, format string, args ...any)) {
	if r.Type == "" && f.Table.Bits() {
		r.Type = "bool"
	}
	f.Type = typeNames[r.Type]
	switch {
	case r.Type == "":
		bad("type", "required: int16, uint16, int32, uint32 or float32")
	case f.Type == 0:
		bad("type", "%q: want int16, uint16, int32, uint32, float32 or bool", r.Type)
	case f.Type == Bool && !f.Table.Bits():
		bad("type", "bool is for coils and discrete inputs; a %s register is int16, uint16, int32, uint32 or float32", f.Table)
	case f.Type != Bool && f.Table.Bits():
		bad("type", "%s: a %s holds one bit: bool", f.Type, f.Table)
		f.Type = 0
	}
	switch r.WordOrder {
	case "", "big":
	case "little":
		f.LittleEndian = true
	default:
		bad("word_order", "%q: want big (high word first) or little", r.WordOrder)
	}
	if r.WordOrder != "" && f.Type != 0 && f.Type.Width() != 2 {
		bad("word_order", "for 32-bit types only; a %s is one register", f.Type)
	}
	numeric := f.Type != 0 && f.Type != Bool
	if r.Scale != nil {
		f.Scale = *r.Scale
		switch {
		case !numeric:
			bad("scale", "for numbers, not a %s", f.Type)
		case f.Scale == 0 || math.IsNaN(f.Scale) || math.IsInf(f.Scale, 0):
			bad("scale", "%v: want a finite number other than 0", f.Scale)
		}
	}
	if r.Offset != nil {
		f.Offset = *r.Offset
		switch {
		case !numeric:
			bad("offset", "for numbers, not a %s", f.Type)
		case math.IsNaN(f.Offset) || math.IsInf(f.Offset, 0):
			bad("offset", "%v: want a finite number", f.Offset)
		}
	}
	if f.Type != Float32 && f.Type != Bool {
		f.decimals = max(decimals(f.Scale), decimals(f.Offset))
	}
	if r.Enum != nil {
		d.enum(r, f, bad)
	}
}

// enum validates a field's enumeration: names for raw values of an
// integer type without scale or offset.
func (d *decoder) enum(r *rawField, f *Field, bad func(k, format string, args ...any)) {
	switch {
	case f.Type == 0:
		return
	case f.Type == Bool || f.Type == Float32:
		bad("enum", "for integer types, not %s", f.Type)
		return
	case f.Scale != 1 || f.Offset != 0:
		bad("enum", "an enum field has no scale or offset: its values are raw")
		return
	case len(r.Enum) == 0:
		bad("enum", "want at least one name: value")
		return
	}
	f.Enum = r.Enum
	f.enumNames = make(map[int64]string, len(r.Enum))
	lo, hi := f.Type.intRange()
	names := make([]string, 0, len(r.Enum))
	for name := range r.Enum {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		v := r.Enum[name]
		switch other, dup := f.enumNames[v]; {
		case name == "" || len(name) > MaxNameLen:
			bad("enum."+name, "want a name of 1 to %d characters", MaxNameLen)
		case v < lo || v > hi:
			bad("enum."+name, "%d: out of range for %s (%d..%d)", v, f.Type, lo, hi)
		case dup:
			bad("enum."+name, "%d is also %q", v, other)
		default:
			f.enumNames[v] = name
		}
	}
}

// decimals is how many decimals x has in its shortest form (-1: too many
// to round to).
func decimals(x float64) int {
	s := strconv.FormatFloat(x, 'f', -1, 64)
	_, frac, _ := strings.Cut(s, ".")
	if len(frac) > 12 {
		return -1
	}
	return len(frac)
}

// overlaps reports fields whose registers (bits) overlap on one table.
func (d *decoder) overlaps(fields []*Field) {
	byStart := slices.Clone(fields)
	sort.SliceStable(byStart, func(i, j int) bool {
		a, b := byStart[i], byStart[j]
		return a.Table < b.Table || a.Table == b.Table && a.Address < b.Address
	})
	for i := 1; i < len(byStart); i++ {
		prev, f := byStart[i-1], byStart[i]
		if prev.Table == f.Table && int(f.Address) < int(prev.Address)+prev.Type.Width() {
			// Report the one lower in the file.
			if prev.index > f.index {
				prev, f = f, prev
			}
			key := fmt.Sprintf("fields[%d].address", f.index)
			d.bad(d.line(key), key, "%s %d overlaps %q (%s %d..%d)", f.Table, f.Address, prev.Name, prev.Table, prev.Address, int(prev.Address)+prev.Type.Width()-1)
		}
	}
}

// command validates one command kind; nil if it has a problem.
func (d *decoder) command(r *rawCommand, key string, p *Profile) *Command {
	n := len(d.errs)
	bad := func(k, format string, args ...any) { d.bad(d.line(key+"."+k), key+"."+k, format, args...) }
	c := &Command{Kind: r.Kind, Field: r.Field}
	switch {
	case !kindRE().MatchString(r.Kind):
		bad("kind", "%q: want 1 to 64 of [A-Za-z0-9._:/-]", r.Kind)
	case slices.Contains(reservedKinds, r.Kind):
		bad("kind", "%q is reserved (%s)", r.Kind, strings.Join(reservedKinds, ", "))
	}
	switch {
	case (r.Field == "") == (len(r.Writes) == 0):
		bad("writes", "give writes (constants) or field (the body's value), one of them")
	case r.Field != "":
		f := p.byName[r.Field]
		switch {
		case f == nil && d.broken[r.Field]:
			return nil // its problem is reported
		case f == nil:
			bad("field", "%q: no such field", r.Field)
		case !f.Table.Writable():
			bad("field", "%q is on a %s table, which is read-only", r.Field, f.Table)
		default:
			c.Idempotent = f.Idempotent
		}
	case len(r.Writes) > MaxCommandWrites:
		bad("writes", "%d writes: at most %d", len(r.Writes), MaxCommandWrites)
	default:
		for i := range r.Writes {
			if w, ok := d.write(&r.Writes[i], fmt.Sprintf("%s.writes[%d]", key, i)); ok {
				c.Writes = append(c.Writes, w)
			}
		}
	}
	if r.Idempotent != nil {
		c.Idempotent = *r.Idempotent
	}
	if len(d.errs) > n {
		return nil
	}
	return c
}

// write validates one constant write of a command.
func (d *decoder) write(r *rawWrite, key string) (Write, bool) {
	n := len(d.errs)
	bad := func(k, format string, args ...any) { d.bad(d.line(key+"."+k), key+"."+k, format, args...) }
	w := Write{Table: tableNames[r.Table]}
	if !w.Table.Writable() {
		bad("table", "%q: want holding or coil", r.Table)
		return w, false
	}
	vals := r.Values
	switch {
	case (r.Value == nil) == (r.Values == nil):
		bad("value", "give value or values, one of them")
	case r.Value != nil:
		vals = []int{*r.Value}
	case w.Table == Coil:
		bad("values", "for holding registers; write coils one at a time")
	case len(vals) < 1 || len(vals) > modbus.MaxWriteRegisters:
		bad("values", "%d values: want 1..%d", len(vals), modbus.MaxWriteRegisters)
	}
	lo, hi := -1<<15, 1<<16-1
	if w.Table == Coil {
		lo, hi = 0, 1
	}
	for i, v := range vals {
		if v < lo || v > hi {
			k := "value"
			if r.Value == nil {
				k = fmt.Sprintf("values[%d]", i)
			}
			bad(k, "%d: want %d..%d for a %s", v, lo, hi, w.Table)
		}
		w.Values = append(w.Values, uint16(v))
	}
	switch {
	case r.Address == nil:
		bad("address", "required")
	case *r.Address < 0 || *r.Address+max(len(vals), 1) > 1<<16:
		bad("address", "%d: want 0..%d", *r.Address, 1<<16-max(len(vals), 1))
	default:
		w.Address = uint16(*r.Address)
	}
	return w, len(d.errs) == n
}
