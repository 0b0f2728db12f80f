package profile

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"

	"github.com/edgefence/edgefence/transport/modbus"
)

// ErrDecode means a response does not fit the block it answers, or holds
// a value a twin cannot (a float32 NaN or infinity).
var ErrDecode = errors.New("modbus profile: cannot decode")

// PollBlocks returns the reads that poll the profile's fields (those with
// a poll interval), shortest interval first, then by table and address.
// The fields of one table and interval are read together, in address
// order, while the gap between two is at most MaxGap and the read at most
// 125 registers or 2000 bits. The caller owns the result.
func (p *Profile) PollBlocks() []Block {
	out := make([]Block, len(p.blocks))
	for i, b := range p.blocks {
		q := *b.Req
		out[i] = Block{Req: &q, Fields: slices.Clone(b.Fields), Interval: b.Interval}
	}
	return out
}

// coalesce groups the polled fields into blocks.
func coalesce(fields []*Field, maxGap int) []Block {
	polled := make([]*Field, 0, len(fields))
	for _, f := range fields {
		if f.PollInterval > 0 {
			polled = append(polled, f)
		}
	}
	sort.SliceStable(polled, func(i, j int) bool {
		a, b := polled[i], polled[j]
		if a.PollInterval != b.PollInterval {
			return a.PollInterval < b.PollInterval
		}
		return a.Table < b.Table || a.Table == b.Table && a.Address < b.Address
	})
	var out []Block
	var start, end int
	for i, f := range polled {
		a, e := int(f.Address), int(f.Address)+f.Type.Width()
		if i > 0 {
			last := &out[len(out)-1]
			if prev := polled[i-1]; prev.Table == f.Table && prev.PollInterval == f.PollInterval &&
				a-end <= maxGap && e-start <= f.Table.maxRead() {
				end = e
				last.Req.Count = uint16(end - start)
				last.Fields = append(last.Fields, f.Name)
				continue
			}
		}
		start, end = a, e
		out = append(out, Block{
			Req:      &modbus.Request{Func: f.Table.ReadFunc(), Addr: f.Address, Count: uint16(e - a)},
			Fields:   []string{f.Name},
			Interval: f.PollInterval,
		})
	}
	return out
}

// Decode returns the engineering values of b's fields in r, the answer to
// b.Req: one value per coil or discrete input in r.Values (0 or 1), one
// per register otherwise. An exception response is its error
// (modbus.ErrException). A field whose value a twin cannot hold (a float32
// NaN or infinity) is left out and named in an error wrapping ErrDecode;
// the other fields are returned with it.
func (p *Profile) Decode(b Block, r *modbus.Response) (map[string]any, error) {
	switch {
	case r == nil:
		return nil, fmt.Errorf("%w: no response", ErrDecode)
	case r.Exception != 0:
		return nil, r.Err()
	case r.Func != b.Req.Func:
		return nil, fmt.Errorf("%w: response function 0x%02x to a read 0x%02x", ErrDecode, r.Func, b.Req.Func)
	case len(r.Values) < int(b.Req.Count):
		return nil, fmt.Errorf("%w: %d values for a read of %d", ErrDecode, len(r.Values), b.Req.Count)
	}
	out := make(map[string]any, len(b.Fields))
	var errs []error
	for _, name := range b.Fields {
		f := p.byName[name]
		if f == nil || f.Table.ReadFunc() != b.Req.Func || f.Address < b.Req.Addr ||
			int(f.Address)+f.Type.Width() > int(b.Req.Addr)+int(b.Req.Count) {
			return nil, fmt.Errorf("%w: field %q is not in this block of profile %s", ErrDecode, name, p.Model)
		}
		i := int(f.Address - b.Req.Addr)
		v, err := f.decode(r.Values[i : i+f.Type.Width()])
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out[name] = v
	}
	return out, errors.Join(errs...)
}

// decode turns the field's raw words into its engineering value.
func (f *Field) decode(w []uint16) (any, error) {
	var raw int64
	switch f.Type {
	case Bool:
		return w[0] != 0, nil
	case Float32:
		x := float64(math.Float32frombits(f.join(w)))
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return nil, fmt.Errorf("%w: field %s: the device holds %v", ErrDecode, f.Name, x)
		}
		// The shortest decimal that is this float32: 230.1, not 230.100006.
		x, _ = strconv.ParseFloat(strconv.FormatFloat(x, 'g', -1, 32), 64)
		if f.Scale == 1 && f.Offset == 0 {
			return x, nil
		}
		return x*f.Scale + f.Offset, nil
	case Int16:
		raw = int64(int16(w[0]))
	case Uint16:
		raw = int64(w[0])
	case Int32:
		raw = int64(int32(f.join(w)))
	case Uint32:
		raw = int64(f.join(w))
	}
	if f.enumNames != nil {
		if name, ok := f.enumNames[raw]; ok {
			return name, nil
		}
		return raw, nil
	}
	if f.Scale == 1 && f.Offset == 0 {
		return raw, nil
	}
	return f.engineering(raw), nil
}

// engineering is raw × scale + offset, rounded to the decimals of scale
// and offset.
func (f *Field) engineering(raw int64) float64 {
	x := float64(raw)*f.Scale + f.Offset
	if f.decimals >= 0 {
		p := math.Pow10(f.decimals)
		if y := math.Round(x*p) / p; !math.IsInf(y, 0) {
			x = y
		}
	}
	return x
}

// join is two registers as a 32-bit value, in the field's word order.
func (f *Field) join(w []uint16) uint32 {
	if f.LittleEndian {
		return uint32(w[1])<<16 | uint32(w[0])
	}
	return uint32(w[0])<<16 | uint32(w[1])
}

// Field returns the field called name, if the profile has it.
func (p *Profile) Field(name string) (*Field, bool) {
	f, ok := p.byName[name]
	return f, ok
}

// Command returns the command of kind, if the profile has it.
func (p *Profile) Command(kind string) (*Command, bool) {
	c, ok := p.byKind[kind]
	return c, ok
}
