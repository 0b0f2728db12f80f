package profile

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/edgefence/edgefence/transport/modbus"
)

func exampleProfile(b *testing.B, name string) *Profile {
	p, err := Load(filepath.Join("..", "..", "..", "configs", "profiles", name))
	if err != nil {
		b.Fatal(err)
	}
	return p
}

// blockOf is the poll block that starts with field.
func blockOf(p *Profile, field string) Block {
	for _, b := range p.PollBlocks() {
		if b.Fields[0] == field {
			return b
		}
	}
	return Block{}
}

// A twin.set of the thermostat: a scaled int16, an enum and a coil.
func BenchmarkPlanFields(b *testing.B) {
	p := exampleProfile(b, "hvac-controller.yaml")
	values := map[string]any{"setpoint": 21.5, "mode": "heat", "fan": true}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.PlanFields(values); err != nil {
			b.Fatal(err)
		}
	}
}

// One poll answer of the meter: three float32 voltages (6 registers).
func BenchmarkDecodeFloat32x3(b *testing.B) {
	p := exampleProfile(b, "energy-meter.yaml")
	blk := blockOf(p, "voltage_l1")
	r := &modbus.Response{Func: modbus.FuncReadInput, Count: 6, Values: []uint16{0x4366, 0x199a, 0x4366, 0x0000, 0x4365, 0xe666}}
	b.ReportAllocs()
	for b.Loop() {
		if v, err := p.Decode(blk, r); err != nil || len(v) != 3 {
			b.Fatal(v, err)
		}
	}
}

// One poll answer of the thermostat's holding block: a scaled int16 and an
// enum.
func BenchmarkDecodeScaledEnum(b *testing.B) {
	p := exampleProfile(b, "hvac-controller.yaml")
	blk := blockOf(p, "setpoint")
	r := &modbus.Response{Func: modbus.FuncReadHolding, Count: 2, Values: []uint16{215, 1}}
	b.ReportAllocs()
	for b.Loop() {
		if v, err := p.Decode(blk, r); err != nil || len(v) != 2 {
			b.Fatal(v, err)
		}
	}
}

// Loading the meter's profile (what `config check` and the agent's start
// do once per file).
func BenchmarkParse(b *testing.B) {
	y, err := os.ReadFile(filepath.Join("..", "..", "..", "configs", "profiles", "energy-meter.yaml"))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(y, "energy-meter.yaml"); err != nil {
			b.Fatal(err)
		}
	}
}
