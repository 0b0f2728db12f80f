package profile

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/transport/modbus"
)

func mustParse(t interface{ Fatal(...any) }, y string) *Profile {
	p, err := Parse([]byte(y), "t.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// One field of every kind, for the table tests.
const planProfile = `model: t1
fields:
  - {name: s16, table: holding, address: 0, type: int16, writable: true}
  - {name: u16, table: holding, address: 1, type: uint16, writable: true, idempotent: false}
  - {name: s32, table: holding, address: 2, type: int32, writable: true}
  - {name: u32le, table: holding, address: 4, type: uint32, word_order: little, writable: true}
  - {name: f32, table: holding, address: 6, type: float32, writable: true, verify: true}
  - {name: temp, table: holding, address: 8, type: int16, scale: 0.1, writable: true}
  - {name: kelvin, table: holding, address: 9, type: uint16, scale: 0.01, offset: -273.15, writable: true}
  - {name: mode, table: holding, address: 10, type: uint16, enum: {off: 0, heat: 1, cool: 2}, writable: true}
  - {name: fan, table: coil, address: 3, writable: true}
  - {name: ro, table: holding, address: 11, type: uint16}
  - {name: volts, table: input, address: 0, type: float32}
commands:
  - {kind: set_mode, field: mode}
  - {kind: setpoint, field: temp, idempotent: false}
  - kind: reset
    writes:
      - {table: holding, address: 0xF010, value: 3}
      - {table: holding, address: 0xF020, values: [1, -1]}
      - {table: coil, address: 7, value: 1}
`

func TestPlanFields(t *testing.T) {
	p := mustParse(t, planProfile)
	for _, tc := range []struct {
		field      string
		value      any
		want       modbus.Request
		idempotent bool
	}{
		{"s16", -2, modbus.Request{Func: modbus.FuncWriteSingle, Addr: 0, Values: []uint16{0xfffe}}, true},
		{"s16", 32767.0, modbus.Request{Func: modbus.FuncWriteSingle, Addr: 0, Values: []uint16{0x7fff}}, true},
		{"s16", json.Number("-32768"), modbus.Request{Func: modbus.FuncWriteSingle, Addr: 0, Values: []uint16{0x8000}}, true},
		{"u16", uint64(65535), modbus.Request{Func: modbus.FuncWriteSingle, Addr: 1, Values: []uint16{0xffff}}, false},
		{"u16", 2.5, modbus.Request{Func: modbus.FuncWriteSingle, Addr: 1, Values: []uint16{3}}, false}, // rounded, half away from zero
		{"s32", int64(-70000), modbus.Request{Func: modbus.FuncWriteMultiple, Addr: 2, Values: []uint16{0xfffe, 0xee90}}, true},
		{"u32le", 0x12345678, modbus.Request{Func: modbus.FuncWriteMultiple, Addr: 4, Values: []uint16{0x5678, 0x1234}}, true},
		{"f32", 230.1, modbus.Request{Func: modbus.FuncWriteMultiple, Addr: 6, Values: []uint16{0x4366, 0x199a}}, true},
		{"temp", 21.5, modbus.Request{Func: modbus.FuncWriteSingle, Addr: 8, Values: []uint16{215}}, true},
		{"temp", -0.3, modbus.Request{Func: modbus.FuncWriteSingle, Addr: 8, Values: []uint16{0xfffd}}, true},
		{"temp", 21.3, modbus.Request{Func: modbus.FuncWriteSingle, Addr: 8, Values: []uint16{213}}, true}, // 212.99999999999997 rounds to 213
		{"kelvin", 20.0, modbus.Request{Func: modbus.FuncWriteSingle, Addr: 9, Values: []uint16{29315}}, true},
		{"mode", "cool", modbus.Request{Func: modbus.FuncWriteSingle, Addr: 10, Values: []uint16{2}}, true},
		{"fan", true, modbus.Request{Func: modbus.FuncWriteCoil, Addr: 3, Values: []uint16{1}}, true},
		{"fan", false, modbus.Request{Func: modbus.FuncWriteCoil, Addr: 3, Values: []uint16{0}}, true},
	} {
		ops, err := p.PlanFields(map[string]any{tc.field: tc.value})
		if err != nil || len(ops) != 1 {
			t.Errorf("%s=%v: %v %v", tc.field, tc.value, ops, err)
			continue
		}
		op := ops[0]
		if !sameRequest(*op.Req, tc.want) || op.Field != tc.field || op.Idempotent != tc.idempotent || op.Verify != (tc.field == "f32") {
			t.Errorf("%s=%v: %+v %+v, want %+v", tc.field, tc.value, op, *op.Req, tc.want)
		}
	}
	// Several fields: in the profile's order, whatever the map's.
	ops, err := p.PlanFields(map[string]any{"fan": true, "s16": 1, "mode": "off"})
	if err != nil || len(ops) != 3 || ops[0].Field != "s16" || ops[1].Field != "mode" || ops[2].Field != "fan" {
		t.Fatalf("order: %+v %v", ops, err)
	}
	if ops, err := p.PlanFields(nil); err != nil || len(ops) != 0 {
		t.Fatalf("nothing: %v %v", ops, err)
	}
}

// Every refusal wraps fence.ErrInvalid and names the field; nothing is
// planned when one field is bad.
func TestPlanFieldsRefuses(t *testing.T) {
	p := mustParse(t, planProfile)
	for _, tc := range []struct {
		values map[string]any
		msg    string
	}{
		{map[string]any{"nope": 1}, `"nope": no such field in profile t1`},
		{map[string]any{"ro": 1}, `"ro" is not writable`},
		{map[string]any{"volts": 1}, `"volts" is not writable`},
		{map[string]any{"s16": 32768}, "s16: 32768: out of range: a int16 takes -32768..32767"},
		{map[string]any{"s16": -32768.6}, "s16: -32768.6: out of range"},
		{map[string]any{"u16": -1}, "u16: -1: out of range: a uint16 takes 0..65535"},
		{map[string]any{"u16": uint64(math.MaxUint64)}, "u16: 1.8446744073709552e+19: out of range"},
		{map[string]any{"u32le": 1 << 32}, "u32le: 4294967296: out of range"},
		{map[string]any{"temp": 3276.8}, "temp: 3276.8: out of range: a int16 ×0.1 takes -3276.8..3276.7"},
		{map[string]any{"kelvin": -300}, "kelvin: -300: out of range: a uint16 ×0.01 -273.15 takes -273.15..382.2"},
		{map[string]any{"f32": 1e39}, "f32: 1e+39: out of range of float32"},
		{map[string]any{"f32": math.NaN()}, "f32: NaN: want a number"},
		{map[string]any{"s16": "12"}, `s16: "12": want a number`},
		{map[string]any{"s16": nil}, "s16: null: want a number"},
		{map[string]any{"mode": "dry"}, `mode: "dry": want one of cool, heat, off`},
		{map[string]any{"mode": 1}, "mode: 1: want one of cool, heat, off"},
		{map[string]any{"fan": 1}, "fan: 1: want true or false"},
		{map[string]any{"s16": 1, "fan": "on"}, `fan: "on": want true or false`},
		{map[string]any{"s16": 1, "x": 1, "ro": 2}, `"ro" is not writable; "x": no such field`},
	} {
		ops, err := p.PlanFields(tc.values)
		if !errors.Is(err, fence.ErrInvalid) || !strings.Contains(err.Error(), tc.msg) || ops != nil {
			t.Errorf("%v: %v %v, want fence.ErrInvalid with %q", tc.values, ops, err, tc.msg)
		}
	}
}

func TestPlanCommand(t *testing.T) {
	p := mustParse(t, planProfile)
	ops, err := p.PlanCommand("reset", map[string]any{})
	if err != nil || len(ops) != 3 {
		t.Fatalf("reset: %+v %v", ops, err)
	}
	want := []modbus.Request{
		{Func: modbus.FuncWriteSingle, Addr: 0xF010, Values: []uint16{3}},
		{Func: modbus.FuncWriteMultiple, Addr: 0xF020, Values: []uint16{1, 0xffff}},
		{Func: modbus.FuncWriteCoil, Addr: 7, Values: []uint16{1}},
	}
	for i, op := range ops {
		if !sameRequest(*op.Req, want[i]) || op.Idempotent || op.Verify || op.Field != "" {
			t.Errorf("reset op %d: %+v %+v", i, op, *op.Req)
		}
	}
	// The plan is a copy: changing it does not change the profile.
	ops[0].Req.Values[0] = 99
	if again, _ := p.PlanCommand("reset", nil); again[0].Req.Values[0] != 3 {
		t.Fatal("the plan shares the profile's values")
	}
	ops, err = p.PlanCommand("set_mode", map[string]any{"value": "heat"})
	if err != nil || len(ops) != 1 || !sameRequest(*ops[0].Req, modbus.Request{Func: modbus.FuncWriteSingle, Addr: 10, Values: []uint16{1}}) || !ops[0].Idempotent || ops[0].Field != "mode" {
		t.Fatalf("set_mode: %+v %v", ops, err)
	}
	ops, err = p.PlanCommand("setpoint", map[string]any{"value": 19.5})
	if err != nil || len(ops) != 1 || ops[0].Req.Values[0] != 195 || ops[0].Idempotent {
		t.Fatalf("setpoint: %+v %v", ops, err)
	}
	ops, err = p.PlanCommand("twin.set", map[string]any{"fan": true})
	if err != nil || len(ops) != 1 || ops[0].Req.Func != modbus.FuncWriteCoil {
		t.Fatalf("twin.set: %+v %v", ops, err)
	}
	for _, tc := range []struct {
		kind string
		body map[string]any
		msg  string
	}{
		{"explode", nil, `command kind "explode": not in profile t1 (twin.set, set_mode, setpoint, reset)`},
		{"reset", map[string]any{"value": 1}, "reset takes no body"},
		{"set_mode", nil, `set_mode takes a body {"value": …}`},
		{"set_mode", map[string]any{"value": "heat", "x": 1}, "set_mode takes a body"},
		{"set_mode", map[string]any{"value": "dry"}, `set_mode: mode: "dry": want one of`},
		{"twin.set", map[string]any{"ro": 1}, `"ro" is not writable`},
	} {
		if _, err := p.PlanCommand(tc.kind, tc.body); !errors.Is(err, fence.ErrInvalid) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s %v: %v, want %q", tc.kind, tc.body, err, tc.msg)
		}
	}
}

// ReadBack reads what an op writes; Matches compares the answer.
func TestReadBack(t *testing.T) {
	p := mustParse(t, planProfile)
	ops, _ := p.PlanFields(map[string]any{"f32": 1.5, "fan": true})
	rb := ops[0].ReadBack()
	if !sameRequest(*rb, modbus.Request{Func: modbus.FuncReadHolding, Addr: 6, Count: 2}) {
		t.Errorf("f32 read back %+v", rb)
	}
	if !ops[0].Matches(&modbus.Response{Func: modbus.FuncReadHolding, Values: []uint16{0x3fc0, 0}}) ||
		ops[0].Matches(&modbus.Response{Func: modbus.FuncReadHolding, Values: []uint16{0x3fc0, 1}}) ||
		ops[0].Matches(&modbus.Response{Func: modbus.FuncReadHolding, Exception: modbus.ExIllegalAddress}) ||
		ops[0].Matches(&modbus.Response{Func: modbus.FuncReadHolding, Values: []uint16{0x3fc0}}) {
		t.Error("f32 matches")
	}
	if rb := ops[1].ReadBack(); !sameRequest(*rb, modbus.Request{Func: modbus.FuncReadCoils, Addr: 3, Count: 1}) {
		t.Errorf("fan read back %+v", rb)
	}
	if !ops[1].Matches(&modbus.Response{Values: []uint16{1}}) || ops[1].Matches(&modbus.Response{Values: []uint16{0}}) {
		t.Error("fan matches")
	}
}

// Round trips of every type × word order × scale: raw registers decode to
// an engineering value that plans back to the same registers; and an
// engineering value on the field's grid plans to registers that decode
// back to it.
func TestRoundTripProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		typ := rapid.SampledFrom([]string{"int16", "uint16", "int32", "uint32", "float32"}).Draw(t, "type")
		order := rapid.SampledFrom([]string{"big", "little"}).Draw(t, "order")
		scale := rapid.SampledFrom([]float64{1, 0.1, 0.01, 0.001, 10, 0.5, -1, 0.25, 2.5}).Draw(t, "scale")
		offset := rapid.SampledFrom([]float64{0, 0, -40, 273.15, 0.5}).Draw(t, "offset")
		wo := ""
		if typ == "int32" || typ == "uint32" || typ == "float32" {
			wo = ", word_order: " + order
		}
		p, err := Parse(fmt.Appendf(nil, "model: rt\nfields:\n  - {name: v, table: holding, address: 100, type: %s, scale: %v, offset: %v, writable: true%s}\n", typ, scale, offset, wo), "rt.yaml")
		if err != nil {
			t.Fatal(err)
		}
		f, _ := p.Field("v")
		words := []uint16{rapid.Uint16().Draw(t, "w0")}
		if f.Type.Width() == 2 {
			words = append(words, rapid.Uint16().Draw(t, "w1"))
		}
		blk := p.PollBlocks()[0]
		vals, err := p.Decode(blk, &modbus.Response{Func: modbus.FuncReadHolding, Addr: 100, Count: uint16(len(words)), Values: words})
		if f.Type == Float32 {
			x := math.Float32frombits(f.join(words))
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				if err == nil || len(vals) != 0 {
					t.Fatalf("NaN/Inf decoded: %v %v", vals, err)
				}
				return
			}
			if scale != 1 || offset != 0 {
				return // a scaled float32 is not exact: checked below from the value side
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		v := vals["v"]
		if _, isInt := v.(int64); isInt != (f.Type != Float32 && scale == 1 && offset == 0) {
			t.Fatalf("decoded %T for %s ×%v %+v", v, typ, scale, offset)
		}
		ops, err := p.PlanFields(map[string]any{"v": v})
		if err != nil {
			t.Fatalf("plan %v: %v", v, err)
		}
		if got := ops[0].Req.Values; len(got) != len(words) || got[0] != words[0] || len(got) == 2 && got[1] != words[1] {
			t.Fatalf("%s ×%v %+v %s: % x → %v → % x", typ, scale, offset, order, words, v, got)
		}
	})
}

// A float32 with a scale: the value a plan writes decodes to within
// float32 precision of it.
func TestScaledFloat32Property(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		scale := rapid.SampledFrom([]float64{0.1, 1000, -2}).Draw(t, "scale")
		p := mustParse(t, fmt.Sprintf("model: f\nfields:\n  - {name: v, table: holding, address: 0, type: float32, scale: %v, writable: true, word_order: little}\n", scale))
		x := rapid.Float64Range(-1e6, 1e6).Draw(t, "x")
		ops, err := p.PlanFields(map[string]any{"v": x})
		if err != nil {
			t.Fatal(err)
		}
		vals, err := p.Decode(p.PollBlocks()[0], &modbus.Response{Func: modbus.FuncReadHolding, Values: ops[0].Req.Values})
		if err != nil {
			t.Fatal(err)
		}
		if got := vals["v"].(float64); math.Abs(got-x) > math.Abs(x)*1e-6+1e-30 {
			t.Fatalf("%v → %v", x, got)
		}
	})
}
