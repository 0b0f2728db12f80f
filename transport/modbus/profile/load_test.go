package profile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgefence/edgefence/transport/modbus"
)

// The shipped example profiles load, and say what their comments say.
func TestExampleProfiles(t *testing.T) {
	dir := filepath.Join("..", "..", "..", "configs", "profiles")
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) != 2 {
		t.Fatalf("example profiles: %v %v", files, err)
	}
	all := map[string]*Profile{}
	for _, f := range files {
		p, err := Load(f)
		if err != nil {
			t.Fatal(err)
		}
		all[p.Model] = p
	}
	em, tc := all["acme-em100"], all["acme-tc20"]
	if em == nil || tc == nil {
		t.Fatalf("models %v", all)
	}
	if f, _ := em.Field("voltage_l1"); f.Table != Input || f.Type != Float32 || f.Writable || f.PollInterval != 5*time.Second {
		t.Errorf("voltage_l1 %+v", f)
	}
	if c, _ := em.Command("reset_energy"); c.Idempotent || len(c.Writes) != 1 || c.Writes[0].Address != 0xF010 {
		t.Errorf("reset_energy %+v", c)
	}
	ops, err := em.PlanCommand("reset_energy", nil)
	if err != nil || len(ops) != 1 || ops[0].Idempotent || ops[0].Req.Func != modbus.FuncWriteSingle || ops[0].Req.Values[0] != 3 {
		t.Errorf("reset_energy plan %+v %v", ops, err)
	}
	sp, _ := tc.Field("setpoint")
	if sp.Type != Int16 || sp.Scale != 0.1 || !sp.Writable || !sp.Verify || !sp.Idempotent {
		t.Errorf("setpoint %+v", sp)
	}
	ops, err = tc.PlanFields(map[string]any{"setpoint": 21.5, "mode": "heat", "fan": true})
	if err != nil || len(ops) != 3 {
		t.Fatalf("plan %+v %v", ops, err)
	}
	want := []modbus.Request{
		{Func: modbus.FuncWriteSingle, Addr: 0, Values: []uint16{215}},
		{Func: modbus.FuncWriteSingle, Addr: 1, Values: []uint16{1}},
		{Func: modbus.FuncWriteCoil, Addr: 0, Values: []uint16{1}},
	}
	for i, op := range ops {
		if !sameRequest(*op.Req, want[i]) {
			t.Errorf("op %d: %+v, want %+v", i, *op.Req, want[i])
		}
	}
	if !ops[0].Verify || ops[1].Verify {
		t.Errorf("verify: %+v", ops)
	}
	if f, _ := tc.Field("alarm"); f.Type != Bool || f.Table != Discrete || f.PollInterval != time.Second {
		t.Errorf("alarm %+v", f)
	}
}

func sameRequest(a, b modbus.Request) bool {
	if a.Func != b.Func || a.Addr != b.Addr || a.Count != b.Count || len(a.Values) != len(b.Values) {
		return false
	}
	for i := range a.Values {
		if a.Values[i] != b.Values[i] {
			return false
		}
	}
	return true
}

// profileOf is a profile with one field line (and what follows).
func profileOf(rest string) string {
	return "model: m1\npoll_interval: 1s\nfields:\n" + rest
}

// Every problem names the file, its line and its dotted key.
func TestLoadErrorsNameFileLineAndKey(t *testing.T) {
	const ok = "  - {name: a, table: holding, address: 0, type: uint16}\n"
	for _, tc := range []struct {
		name, yaml string
		line       int
		key, msg   string
	}{
		{"no model", "fields:\n" + ok, 0, "model", "required"},
		{"bad model", "model: 'a b'\nfields:\n" + ok, 1, "model", `"a b": want`},
		{"unknown top key", "model: m\nfeilds: []\ncommands: [{kind: k, writes: [{table: coil, address: 0, value: 1}]}]\n", 2, "feilds", "unknown key (want one of model"},
		{"key twice", "model: m\nmodel: n\nfields:\n" + ok, 2, "model", "given twice"},
		{"nothing", "model: m\n", 0, "fields", "needs fields or commands"},
		{"poll interval", "model: m\npoll_interval: soon\nfields:\n" + ok, 2, "poll_interval", `"soon": want a duration`},
		{"poll interval too short", "model: m\npoll_interval: 1ms\nfields:\n" + ok, 2, "poll_interval", "1ms: want at least 100ms"},
		{"max gap", "model: m\nmax_gap: 100\nfields:\n" + ok, 2, "max_gap", "100: want 0..64"},
		{"max gap type", "model: m\nmax_gap: x\nfields:\n" + ok, 2, "max_gap", "cannot unmarshal"},
		{"fields not a list", "model: m\nfields: {a: 1}\n", 2, "fields", "want a list"},
		{"field not a mapping", profileOf("  - a\n"), 4, "fields[0]", "want a mapping"},
		{"unknown field key", profileOf("  - name: a\n    table: holding\n    type: int16\n    address: 0\n    adress: 0\n"), 8, "fields[0].adress", "unknown key"},
		{"field name", profileOf("  - {name: 1a, table: holding, address: 0, type: uint16}\n"), 4, "fields[0].name", `"1a": want a twin field name`},
		{"field name with a dot", profileOf("  - {name: a.b, table: holding, address: 0, type: uint16}\n"), 4, "fields[0].name", "want a twin field name"},
		{"field name twice", profileOf(ok + "  - {name: a, table: holding, address: 1, type: uint16}\n"), 5, "fields[1].name", "listed above"},
		{"table", profileOf("  - {name: a, table: registers, address: 0, type: uint16}\n"), 4, "fields[0].table", `"registers": want holding, input, coil or discrete`},
		{"no type", profileOf("  - {name: a, table: input, address: 0}\n"), 4, "fields[0].type", "required"},
		{"type", profileOf("  - {name: a, table: input, address: 0, type: int64}\n"), 4, "fields[0].type", `"int64": want`},
		{"bool register", profileOf("  - {name: a, table: holding, address: 0, type: bool}\n"), 4, "fields[0].type", "bool is for coils"},
		{"int coil", profileOf("  - {name: a, table: coil, address: 0, type: int16}\n"), 4, "fields[0].type", "int16: a coil holds one bit"},
		{"no address", profileOf("  - {name: a, table: input, type: int16}\n"), 4, "fields[0].address", "required"},
		{"address negative", profileOf("  - name: a\n    table: input\n    type: int16\n    address: -1\n"), 7, "fields[0].address", "-1: want 0..65535"},
		{"address beyond", profileOf("  - {name: a, table: input, address: 65536, type: uint16}\n"), 4, "fields[0].address", "65536: want 0..65535"},
		{"32-bit at the top", profileOf("  - {name: a, table: input, address: 65535, type: float32}\n"), 4, "fields[0].address", "65535: want 0..65534 for a float32"},
		{"address hex", profileOf("  - {name: a, table: input, address: 0x10000, type: uint16}\n"), 4, "fields[0].address", "65536: want"},
		{"address type", profileOf("  - {name: a, table: input, address: one, type: uint16}\n"), 4, "fields[0].address", "cannot unmarshal !!str `one`"},
		{"word order", profileOf("  - {name: a, table: input, address: 0, type: int32, word_order: middle}\n"), 4, "fields[0].word_order", `"middle": want big`},
		{"word order of 16 bits", profileOf("  - {name: a, table: input, address: 0, type: int16, word_order: little}\n"), 4, "fields[0].word_order", "for 32-bit types only"},
		{"scale 0", profileOf("  - {name: a, table: input, address: 0, type: int16, scale: 0}\n"), 4, "fields[0].scale", "0: want a finite number other than 0"},
		{"scale nan", profileOf("  - {name: a, table: input, address: 0, type: int16, scale: .nan}\n"), 4, "fields[0].scale", "want a finite number"},
		{"scale of a bool", profileOf("  - {name: a, table: coil, address: 0, scale: 2}\n"), 4, "fields[0].scale", "for numbers, not a bool"},
		{"offset inf", profileOf("  - {name: a, table: input, address: 0, type: int16, offset: .inf}\n"), 4, "fields[0].offset", "want a finite number"},
		{"writable input", profileOf("  - {name: a, table: input, address: 0, type: int16, writable: true}\n"), 4, "fields[0].writable", "read-only"},
		{"writable discrete", profileOf("  - name: a\n    table: discrete\n    address: 0\n    writable: true\n"), 7, "fields[0].writable", "a discrete table is read-only"},
		{"verify input", profileOf("  - {name: a, table: input, address: 0, type: int16, verify: true}\n"), 4, "fields[0].verify", "for writes"},
		{"idempotent input", profileOf("  - {name: a, table: input, address: 0, type: int16, idempotent: false}\n"), 4, "fields[0].idempotent", "for writes"},
		{"writable type", profileOf("  - {name: a, table: coil, address: 0, writable: yes please}\n"), 4, "fields[0].writable", "cannot unmarshal"},
		{"field poll interval", profileOf("  - name: a\n    table: input\n    address: 0\n    type: int16\n    poll_interval: 5\n"), 8, "fields[0].poll_interval", `"5": want a duration`},
		{"overlap", profileOf("  - {name: a, table: input, address: 10, type: float32}\n  - {name: b, table: input, address: 11, type: int16}\n"), 5, "fields[1].address", `input 11 overlaps "a" (input 10..11)`},
		{"overlap, later field lower", profileOf("  - {name: a, table: holding, address: 11, type: int16}\n  - {name: b, table: holding, address: 10, type: uint32}\n"), 5, "fields[1].address", `holding 10 overlaps "a"`},
		{"same coil", profileOf("  - {name: a, table: coil, address: 3}\n  - {name: b, table: coil, address: 3}\n"), 5, "fields[1].address", "coil 3 overlaps"},
		{"enum of a float", profileOf("  - name: a\n    table: holding\n    address: 0\n    type: float32\n    enum: {x: 1}\n"), 8, "fields[0].enum", "for integer types"},
		{"enum with scale", profileOf("  - name: a\n    table: holding\n    address: 0\n    type: uint16\n    scale: 0.5\n    enum: {x: 1}\n"), 9, "fields[0].enum", "no scale or offset"},
		{"enum empty", profileOf("  - name: a\n    table: holding\n    address: 0\n    type: uint16\n    enum: {}\n"), 8, "fields[0].enum", "at least one"},
		{"enum range", profileOf("  - name: a\n    table: holding\n    address: 0\n    type: uint16\n    enum:\n      x: 1\n      y: 70000\n"), 10, "fields[0].enum.y", "70000: out of range for uint16"},
		{"enum twice", profileOf("  - name: a\n    table: holding\n    address: 0\n    type: int16\n    enum:\n      x: 1\n      y: 1\n"), 10, "fields[0].enum.y", `1 is also "x"`},
		{"enum value type", profileOf("  - name: a\n    table: holding\n    address: 0\n    type: int16\n    enum:\n      x: one\n"), 9, "fields[0].enum.x", "cannot unmarshal"},
		{"anchor on an unknown key", profileOf(ok) + "x: &a 1\n", 5, "x", "unknown key"},
		{"alias value", profileOf("  - {name: a, table: input, address: &a 0, type: int16}\n  - {name: b, table: input, address: *a, type: int16}\n"), 5, "fields[1].address", "aliases are not allowed"},
		{"command kind reserved", profileOf(ok) + "commands:\n  - kind: twin.set\n    field: a\n", 6, "commands[0].kind", `"twin.set" is reserved`},
		{"command kind write_register", profileOf(ok) + "commands:\n  - {kind: write_register, field: a}\n", 6, "commands[0].kind", "reserved"},
		{"command kind chars", profileOf(ok) + "commands:\n  - {kind: 'a b', field: a}\n", 6, "commands[0].kind", `"a b": want`},
		{"command kind twice", profileOf(ok) + "commands:\n  - {kind: k, field: a}\n  - {kind: k, field: a}\n", 7, "commands[1].kind", "listed above"},
		{"command neither", profileOf(ok) + "commands:\n  - {kind: k}\n", 6, "commands[0].writes", "give writes (constants) or field"},
		{"command both", profileOf(ok) + "commands:\n  - kind: k\n    field: a\n    writes: [{table: coil, address: 1, value: 1}]\n", 8, "commands[0].writes", "one of them"},
		{"command field unknown", profileOf(ok) + "commands:\n  - kind: k\n    field: b\n", 7, "commands[0].field", `"b": no such field`},
		{"command field read-only", profileOf("  - {name: a, table: input, address: 0, type: uint16}\n") + "commands:\n  - kind: k\n    field: a\n", 7, "commands[0].field", "read-only"},
		{"write table", profileOf(ok) + "commands:\n  - kind: k\n    writes:\n      - {table: input, address: 1, value: 1}\n", 8, "commands[0].writes[0].table", `"input": want holding or coil`},
		{"write value range", profileOf(ok) + "commands:\n  - kind: k\n    writes:\n      - {table: holding, address: 1, value: 65536}\n", 8, "commands[0].writes[0].value", "65536: want -32768..65535"},
		{"write coil value", profileOf(ok) + "commands:\n  - kind: k\n    writes:\n      - {table: coil, address: 1, value: 2}\n", 8, "commands[0].writes[0].value", "2: want 0..1 for a coil"},
		{"write no value", profileOf(ok) + "commands:\n  - kind: k\n    writes:\n      - {table: coil, address: 1}\n", 8, "commands[0].writes[0].value", "give value or values"},
		{"write coil values", profileOf(ok) + "commands:\n  - kind: k\n    writes:\n      - {table: coil, address: 1, values: [1, 0]}\n", 8, "commands[0].writes[0].values", "for holding registers"},
		{"write values beyond", profileOf(ok) + "commands:\n  - kind: k\n    writes:\n      - {table: holding, address: 65535, values: [1, 0]}\n", 8, "commands[0].writes[0].address", "65535: want 0..65534"},
		{"write no address", profileOf(ok) + "commands:\n  - kind: k\n    writes:\n      - {table: holding, value: 1}\n", 8, "commands[0].writes[0].address", "required"},
		{"write values range", profileOf(ok) + "commands:\n  - kind: k\n    writes:\n      - table: holding\n        address: 0\n        values: [1, -40000]\n", 10, "commands[0].writes[0].values[1]", "-40000: want"},
		{"too many writes", profileOf(ok) + "commands:\n  - kind: k\n    writes: [" + strings.Repeat("{table: coil, address: 1, value: 1}, ", 16) + "{table: coil, address: 1, value: 1}]\n", 7, "commands[0].writes", "17 writes: at most 16"},
		{"syntax", "model: m\nfields: [\n", 2, "", "yaml syntax"},
		{"not a mapping", "- a\n", 1, "", "not a profile"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml), "p.yaml")
			es := Errors(err)
			if !errors.Is(err, ErrProfile) || len(es) == 0 {
				t.Fatalf("got %v, want a profile error", err)
			}
			e := es[0]
			if len(es) != 1 || e.File != "p.yaml" || e.Line != tc.line || e.Key != tc.key || !strings.Contains(e.Msg, tc.msg) {
				t.Fatalf("got\n%v\nwant one problem: p.yaml:%d: %s: …%s…", err, tc.line, tc.key, tc.msg)
			}
		})
	}
}

// Every problem at once, in the order of the file.
func TestLoadReportsEveryProblem(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "bad.yaml")
	y := profileOf("  - {name: a, table: input, address: 0, type: int64}\n  - {name: b, table: holding, address: 0, type: int16, scale: 0}\n") +
		"commands:\n  - {kind: read_registers, field: b}\n"
	if err := os.WriteFile(path, []byte(y), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path)
	es := Errors(err)
	want := []string{path + ":4: fields[0].type", path + ":5: fields[1].scale", path + ":7: commands[0].kind"}
	if len(es) != len(want) {
		t.Fatalf("got\n%v\nwant %d problems", err, len(want))
	}
	for i, w := range want {
		if !strings.HasPrefix(es[i].Error(), w) {
			t.Errorf("problem %d: %v, want %s…", i, es[i], w)
		}
	}
	// Keys count the file's fields, those with problems too; a command
	// naming a field with a problem is not reported again.
	y = profileOf("  - {name: x, table: x}\n  - {name: a, table: input, address: 10, type: float32}\n  - {name: b, table: input, address: 11, type: int16}\n") +
		"commands:\n  - {kind: k, field: x}\n"
	_, err = Parse([]byte(y), "o.yaml")
	if es := Errors(err); len(es) != 2 || es[1].Key != "fields[2].address" || es[1].Line != 6 {
		t.Errorf("got\n%v\nwant fields[0].table and fields[2].address", err)
	}
	if _, err := Load(filepath.Join(dir, "missing.yaml")); !errors.Is(err, fs.ErrNotExist) || len(Errors(err)) != 0 {
		t.Errorf("missing file: %v", err)
	}
	big := filepath.Join(dir, "big.yaml")
	if err := os.WriteFile(big, make([]byte, MaxFileSize+1), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(big); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("big file: %v", err)
	}
}

// FuzzParse: any bytes are a profile or *Errors, never a panic; a profile
// plans and polls without panicking.
func FuzzParse(f *testing.F) {
	for _, n := range []string{"energy-meter.yaml", "hvac-controller.yaml"} {
		if b, err := os.ReadFile(filepath.Join("..", "..", "..", "configs", "profiles", n)); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte(profileOf("  - {name: a, table: input, address: &a 0, type: int16}\n  - {name: b, table: input, address: *a}\n")))
	f.Add([]byte("a: &x [*x]\n"))
	f.Add([]byte("model: m\nfields:\n  - {name: e, table: holding, address: 1, type: int16, enum: {a: 1, b: -1}}\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := Parse(b, "f.yaml")
		if err != nil {
			if !errors.Is(err, ErrProfile) || len(Errors(err)) == 0 {
				t.Fatalf("error %v: not *Errors", err)
			}
			return
		}
		for _, blk := range p.PollBlocks() {
			n := int(blk.Req.Count)
			limit := modbus.MaxReadRegisters
			if blk.Req.Func == modbus.FuncReadCoils || blk.Req.Func == modbus.FuncReadDiscrete {
				limit = MaxReadBits
			}
			if n < 1 || n > limit {
				t.Fatalf("block %+v", blk.Req)
			}
			r := &modbus.Response{Func: blk.Req.Func, Addr: blk.Req.Addr, Count: blk.Req.Count, Values: make([]uint16, n)}
			if _, err := p.Decode(blk, r); err != nil {
				t.Fatalf("decode zeros: %v", err)
			}
		}
		for _, fl := range p.Fields {
			if fl.Writable {
				_, _ = p.PlanFields(map[string]any{fl.Name: 1.0})
			}
		}
	})
}
