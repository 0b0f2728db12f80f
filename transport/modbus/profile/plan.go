package profile

import (
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/transport/modbus"
)

// PlanFields returns the writes that set the desired twin values: one Op
// per field, in the profile's order. A field that is unknown or not
// writable, or a value that does not fit it, is an error wrapping
// fence.ErrInvalid that names every such field; nothing is planned then.
func (p *Profile) PlanFields(values map[string]any) ([]Op, error) {
	var problems []string
	for name := range values {
		switch f := p.byName[name]; {
		case f == nil:
			problems = append(problems, fmt.Sprintf("%q: no such field in profile %s", name, p.Model))
		case !f.Writable:
			problems = append(problems, fmt.Sprintf("%q is not writable", name))
		}
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		return nil, fmt.Errorf("%w: %s", fence.ErrInvalid, strings.Join(problems, "; "))
	}
	ops := make([]Op, 0, len(values))
	for _, f := range p.Fields {
		v, ok := values[f.Name]
		if !ok {
			continue
		}
		op, err := f.plan(v)
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		ops = append(ops, op)
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("%w: %s", fence.ErrInvalid, strings.Join(problems, "; "))
	}
	return ops, nil
}

// PlanCommand returns the writes of a command kind of the profile: its
// constants (the body must be empty), or the body's "value" written to its
// field. twin.set is PlanFields(body). Errors wrap fence.ErrInvalid.
func (p *Profile) PlanCommand(kind string, body map[string]any) ([]Op, error) {
	if kind == "twin.set" {
		return p.PlanFields(body)
	}
	c := p.byKind[kind]
	if c == nil {
		kinds := make([]string, 0, len(p.Commands))
		for _, c := range p.Commands {
			kinds = append(kinds, c.Kind)
		}
		return nil, fmt.Errorf("%w: command kind %q: not in profile %s (twin.set, %s)", fence.ErrInvalid, kind, p.Model, strings.Join(kinds, ", "))
	}
	if c.Field == "" {
		if len(body) != 0 {
			return nil, fmt.Errorf("%w: %s takes no body", fence.ErrInvalid, kind)
		}
		ops := make([]Op, len(c.Writes))
		for i, w := range c.Writes {
			ops[i] = Op{Req: w.request(), Idempotent: c.Idempotent}
		}
		return ops, nil
	}
	v, ok := body["value"]
	if !ok || len(body) != 1 {
		return nil, fmt.Errorf(`%w: %s takes a body {"value": …}`, fence.ErrInvalid, kind)
	}
	op, err := p.byName[c.Field].plan(v)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", fence.ErrInvalid, kind, err)
	}
	op.Idempotent = c.Idempotent
	return []Op{op}, nil
}

func (w Write) request() *modbus.Request {
	f := modbus.FuncWriteSingle
	switch {
	case w.Table == Coil:
		f = modbus.FuncWriteCoil
	case len(w.Values) > 1:
		f = modbus.FuncWriteMultiple
	}
	return &modbus.Request{Func: f, Addr: w.Address, Values: append([]uint16(nil), w.Values...)}
}

// plan is the write that sets f to the engineering value v.
func (f *Field) plan(v any) (Op, error) {
	words, err := f.encode(v)
	if err != nil {
		return Op{}, fmt.Errorf("%s: %w", f.Name, err)
	}
	w := Write{Table: f.Table, Address: f.Address, Values: words}
	return Op{Req: w.request(), Field: f.Name, Idempotent: f.Idempotent, Verify: f.Verify}, nil
}

// encode turns an engineering value into the field's raw words.
func (f *Field) encode(v any) ([]uint16, error) {
	switch {
	case f.Type == Bool:
		b, ok := v.(bool)
		if !ok {
			return nil, fmt.Errorf("%s: want true or false", describe(v))
		}
		if b {
			return []uint16{1}, nil
		}
		return []uint16{0}, nil
	case f.Enum != nil:
		s, ok := v.(string)
		raw, known := f.Enum[s]
		if !ok || !known {
			return nil, fmt.Errorf("%s: want one of %s", describe(v), f.enumList())
		}
		return f.words(raw), nil
	}
	x, i, isInt, ok := number(v)
	if !ok {
		return nil, fmt.Errorf("%s: want a number", describe(v))
	}
	if f.Type == Float32 {
		y := (x - f.Offset) / f.Scale
		if math.IsNaN(y) || math.Abs(y) > math.MaxFloat32 {
			return nil, fmt.Errorf("%v: out of range of float32", x)
		}
		u := math.Float32bits(float32(y))
		return f.split(u), nil
	}
	lo, hi := f.Type.intRange()
	if !isInt || f.Scale != 1 || f.Offset != 0 {
		y := math.Round((x - f.Offset) / f.Scale)
		if !(y >= float64(lo) && y <= float64(hi)) { // NaN too
			return nil, fmt.Errorf("%v: out of range: a %s%s takes %s", x, f.Type, f.scaleText(), f.engRange())
		}
		i = int64(y)
	} else if i < lo || i > hi {
		return nil, fmt.Errorf("%v: out of range: a %s takes %d..%d", i, f.Type, lo, hi)
	}
	return f.words(i), nil
}

// words is raw as the field's registers.
func (f *Field) words(raw int64) []uint16 {
	if f.Type.Width() == 1 {
		return []uint16{uint16(raw)}
	}
	return f.split(uint32(raw))
}

// split is a 32-bit value as two registers, in the field's word order.
func (f *Field) split(u uint32) []uint16 {
	if f.LittleEndian {
		return []uint16{uint16(u), uint16(u >> 16)}
	}
	return []uint16{uint16(u >> 16), uint16(u)}
}

func (f *Field) scaleText() string {
	s := ""
	if f.Scale != 1 {
		s += fmt.Sprintf(" ×%v", f.Scale)
	}
	if f.Offset != 0 {
		s += fmt.Sprintf(" %+v", f.Offset)
	}
	return s
}

// engRange is the engineering range of an integer field.
func (f *Field) engRange() string {
	lo, hi := f.Type.intRange()
	a, b := f.engineering(lo), f.engineering(hi)
	if a > b {
		a, b = b, a
	}
	return fmt.Sprintf("%v..%v", a, b)
}

func (f *Field) enumList() string {
	names := make([]string, 0, len(f.Enum))
	for n := range f.Enum {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// number reads a value as a float64 and, when it is an integer type (or
// a json.Number that is one), exactly as an int64.
func number(v any) (x float64, i int64, isInt, ok bool) {
	switch n := v.(type) {
	case float64:
		return n, 0, false, !math.IsNaN(n) && !math.IsInf(n, 0)
	case float32:
		return float64(n), 0, false, !math.IsNaN(float64(n)) && !math.IsInf(float64(n), 0)
	case int:
		return float64(n), int64(n), true, true
	case int8:
		return float64(n), int64(n), true, true
	case int16:
		return float64(n), int64(n), true, true
	case int32:
		return float64(n), int64(n), true, true
	case int64:
		return float64(n), n, true, true
	case uint8:
		return float64(n), int64(n), true, true
	case uint16:
		return float64(n), int64(n), true, true
	case uint32:
		return float64(n), int64(n), true, true
	case uint:
		return unsigned(uint64(n))
	case uint64:
		return unsigned(n)
	case json.Number:
		if i, err := n.Int64(); err == nil {
			return float64(i), i, true, true
		}
		x, err := n.Float64()
		return x, 0, false, err == nil && !math.IsInf(x, 0)
	}
	return 0, 0, false, false
}

func unsigned(n uint64) (float64, int64, bool, bool) {
	if n > math.MaxInt64 {
		return float64(n), 0, false, true
	}
	return float64(n), int64(n), true, true
}

// describe names a value for an error: its JSON form, short.
func describe(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		b = fmt.Append(nil, v) // NaN, ±Inf
	}
	if len(b) > 40 {
		return string(b[:37]) + "…"
	}
	return string(b)
}
