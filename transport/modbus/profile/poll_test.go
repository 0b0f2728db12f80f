package profile

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/edgefence/edgefence/transport/modbus"
)

type wantBlock struct {
	fn          byte
	addr, count uint16
	fields      string
	interval    time.Duration
}

func checkBlocks(t *testing.T, p *Profile, want []wantBlock) {
	t.Helper()
	got := p.PollBlocks()
	var g []wantBlock
	for _, b := range got {
		g = append(g, wantBlock{b.Req.Func, b.Req.Addr, b.Req.Count, strings.Join(b.Fields, " "), b.Interval})
	}
	if !reflect.DeepEqual(g, want) {
		t.Fatalf("blocks\n%v\nwant\n%v", g, want)
	}
}

func TestPollBlocksCoalesce(t *testing.T) {
	p := mustParse(t, `model: c
poll_interval: 2s
fields:
  - {name: d, table: input, address: 10, type: float32}
  - {name: a, table: input, address: 0, type: uint16}
  - {name: b, table: input, address: 1, type: int32}
  - {name: c, table: input, address: 7, type: int16}   # gap of 4 after b: read through
  - {name: e, table: input, address: 17, type: int16}  # gap of 5 after d: a new read
  - {name: h1, table: holding, address: 2, type: uint16}
  - {name: h0, table: holding, address: 0, type: uint16, poll_interval: 500ms}
  - {name: off, table: holding, address: 1, type: uint16, poll_interval: never}
  - {name: zero, table: holding, address: 3, type: uint16, poll_interval: 0s}
  - {name: c1, table: coil, address: 5}
  - {name: c2, table: coil, address: 9}
  - {name: x1, table: discrete, address: 100}
`)
	checkBlocks(t, p, []wantBlock{
		{modbus.FuncReadHolding, 0, 1, "h0", 500 * time.Millisecond},
		{modbus.FuncReadHolding, 2, 1, "h1", 2 * time.Second},
		{modbus.FuncReadInput, 0, 12, "a b c d", 2 * time.Second},
		{modbus.FuncReadInput, 17, 1, "e", 2 * time.Second},
		{modbus.FuncReadCoils, 5, 5, "c1 c2", 2 * time.Second},
		{modbus.FuncReadDiscrete, 100, 1, "x1", 2 * time.Second},
	})
	// PollBlocks is the caller's: changing it changes nothing.
	b := p.PollBlocks()
	b[0].Req.Count, b[0].Fields[0] = 99, "zz"
	if c := p.PollBlocks()[0]; c.Req.Count != 1 || c.Fields[0] != "h0" {
		t.Fatal("PollBlocks shares its blocks")
	}
}

func TestPollBlocksMaxGapZero(t *testing.T) {
	p := mustParse(t, "model: g\nmax_gap: 0\nfields:\n  - {name: a, table: holding, address: 0, type: uint16}\n  - {name: b, table: holding, address: 1, type: uint16}\n  - {name: c, table: holding, address: 3, type: uint16}\n")
	checkBlocks(t, p, []wantBlock{
		{modbus.FuncReadHolding, 0, 2, "a b", DefaultPollInterval},
		{modbus.FuncReadHolding, 3, 1, "c", DefaultPollInterval},
	})
	p = mustParse(t, "model: g\npoll_interval: never\nfields:\n  - {name: a, table: holding, address: 0, type: uint16}\n  - {name: b, table: holding, address: 1, type: uint16, poll_interval: 1m}\n")
	checkBlocks(t, p, []wantBlock{{modbus.FuncReadHolding, 1, 1, "b", time.Minute}})
}

// A read is at most 125 registers or 2000 bits.
func TestPollBlocksMaxCount(t *testing.T) {
	var b strings.Builder
	b.WriteString("model: big\nfields:\n")
	for i := range 70 { // 140 contiguous registers
		fmt.Fprintf(&b, "  - {name: f%d, table: holding, address: %d, type: float32}\n", i, 2*i)
	}
	for i := range 2001 {
		fmt.Fprintf(&b, "  - {name: c%d, table: coil, address: %d}\n", i, i)
	}
	p := mustParse(t, b.String())
	blocks := p.PollBlocks()
	if len(blocks) != 4 {
		t.Fatalf("%d blocks", len(blocks))
	}
	for i, w := range []struct{ addr, count uint16 }{{0, 124}, {124, 16}, {0, 2000}, {2000, 1}} {
		if q := blocks[i].Req; q.Addr != w.addr || q.Count != w.count {
			t.Errorf("block %d: %+v, want %d+%d", i, q, w.addr, w.count)
		}
	}
}

func TestDecode(t *testing.T) {
	p := mustParse(t, planProfile)
	q := mustParse(t, `model: r
fields:
  - {name: s16, table: input, address: 0, type: int16}
  - {name: u16, table: input, address: 1, type: uint16}
  - {name: s32le, table: input, address: 2, type: int32, word_order: little}
  - {name: f32, table: input, address: 4, type: float32}
  - {name: temp, table: input, address: 6, type: int16, scale: 0.1}
  - {name: mode, table: input, address: 7, type: uint16, enum: {off: 0, heat: 1}}
  - {name: u32, table: input, address: 8, type: uint32}
`)
	blocks := q.PollBlocks()
	if len(blocks) != 1 || blocks[0].Req.Count != 10 {
		t.Fatalf("%+v", blocks)
	}
	r := &modbus.Response{Func: modbus.FuncReadInput, Addr: 0, Count: 10,
		Values: []uint16{0xfffe, 0xfffe, 0x0001, 0x8000, 0x4366, 0x199a, 0xfffd, 7, 0xffff, 0xffff}}
	got, err := q.Decode(blocks[0], r)
	want := map[string]any{"s16": int64(-2), "u16": int64(65534), "s32le": int64(-2147483647), "f32": 230.1, "temp": -0.3, "mode": int64(7), "u32": int64(4294967295)}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v %v\nwant %v", got, err, want)
	}
	r.Values[7] = 1
	if got, _ := q.Decode(blocks[0], r); got["mode"] != "heat" {
		t.Errorf("mode %v", got["mode"])
	}
	// A NaN is left out and named; the rest stands.
	r.Values[4], r.Values[5] = 0x7fc0, 0
	got, err = q.Decode(blocks[0], r)
	if !errors.Is(err, ErrDecode) || !strings.Contains(err.Error(), "field f32: the device holds NaN") || got["f32"] != nil || got["s16"] != int64(-2) {
		t.Errorf("NaN: %v %v", got, err)
	}
	// Coils.
	cb := p.PollBlocks()
	var coil Block
	for _, b := range cb {
		if b.Req.Func == modbus.FuncReadCoils {
			coil = b
		}
	}
	if got, err := p.Decode(coil, &modbus.Response{Func: modbus.FuncReadCoils, Values: []uint16{1}}); err != nil || got["fan"] != true {
		t.Errorf("coil: %v %v", got, err)
	}
	for _, tc := range []struct {
		r    *modbus.Response
		b    Block
		want error
		msg  string
	}{
		{nil, blocks[0], ErrDecode, "no response"},
		{&modbus.Response{Func: modbus.FuncReadInput, Exception: modbus.ExIllegalAddress}, blocks[0], modbus.ErrException, "illegal data address (0x02)"},
		{&modbus.Response{Func: modbus.FuncReadHolding, Values: make([]uint16, 10)}, blocks[0], ErrDecode, "response function 0x03 to a read 0x04"},
		{&modbus.Response{Func: modbus.FuncReadInput, Values: make([]uint16, 9)}, blocks[0], ErrDecode, "9 values for a read of 10"},
		{&modbus.Response{Func: modbus.FuncReadCoils, Values: []uint16{1}}, Block{Req: coil.Req, Fields: []string{"s16"}}, ErrDecode, `field "s16" is not in this block`},
	} {
		if _, err := q.Decode(tc.b, tc.r); !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%+v: %v, want %v %q", tc.r, err, tc.want, tc.msg)
		}
	}
}
