package modbus

import (
	"bytes"
	"errors"
	"slices"
	"testing"

	"github.com/edgefence/edgefence/fence"
)

func TestRequestRoundTrip(t *testing.T) {
	for _, q := range []Request{
		{Func: FuncReadHolding, Addr: 7, Count: 3},
		{Func: FuncReadHolding, Addr: 0, Count: MaxReadRegisters},
		{Func: FuncWriteSingle, Addr: 65535, Values: []uint16{0xbeef}},
		{Func: FuncWriteMultiple, Addr: 10, Values: []uint16{1, 2, 3}},
		{Func: FuncWriteMultiple, Addr: 0, Values: make([]uint16, MaxWriteRegisters)},
		{Func: FuncReadCoils, Addr: 3, Count: MaxReadBits},
		{Func: FuncReadDiscrete, Addr: 0, Count: 1},
		{Func: FuncReadInput, Addr: 9, Count: 2},
		{Func: FuncWriteCoil, Addr: 4, Values: []uint16{1}},
		{Func: FuncWriteCoil, Addr: 4, Values: []uint16{0}},
		{Func: FuncWriteCoils, Addr: 5, Values: []uint16{1, 0, 1, 1, 0, 0, 0, 0, 1}},
		{Func: FuncWriteCoils, Addr: 0, Values: make([]uint16, MaxWriteCoils)},
	} {
		b, err := q.Encode()
		if err != nil {
			t.Fatalf("%+v: %v", q, err)
		}
		got, err := DecodeRequest(b)
		if err != nil || got.Func != q.Func || got.Addr != q.Addr || got.Count != q.Count || !slices.Equal(got.Values, q.Values) {
			t.Fatalf("%+v → % x → %+v, %v", q, b, got, err)
		}
	}
}

// The Modbus specification's own examples (v1.1b3, 6.3, 6.6, 6.12).
func TestSpecExamples(t *testing.T) {
	q := &Request{Func: FuncReadHolding, Addr: 0x006b, Count: 3}
	if b, _ := q.Encode(); !bytes.Equal(b, []byte{0x03, 0x00, 0x6b, 0x00, 0x03}) {
		t.Fatalf("read request % x", b)
	}
	r, err := DecodeResponse(q, []byte{0x03, 0x06, 0x02, 0x2b, 0x00, 0x00, 0x00, 0x64})
	if err != nil || !slices.Equal(r.Values, []uint16{0x022b, 0, 0x64}) {
		t.Fatalf("read response %+v %v", r, err)
	}
	w := &Request{Func: FuncWriteSingle, Addr: 1, Values: []uint16{3}}
	if b, _ := w.Encode(); !bytes.Equal(b, []byte{0x06, 0x00, 0x01, 0x00, 0x03}) {
		t.Fatalf("write single % x", b)
	}
	m := &Request{Func: FuncWriteMultiple, Addr: 1, Values: []uint16{0x000a, 0x0102}}
	if b, _ := m.Encode(); !bytes.Equal(b, []byte{0x10, 0x00, 0x01, 0x00, 0x02, 0x04, 0x00, 0x0a, 0x01, 0x02}) {
		t.Fatalf("write multiple % x", b)
	}
	if r, err := DecodeResponse(m, []byte{0x10, 0x00, 0x01, 0x00, 0x02}); err != nil || r.Count != 2 {
		t.Fatalf("write multiple response %+v %v", r, err)
	}
	if r, err := DecodeResponse(q, []byte{0x83, 0x02}); err != nil || !errors.Is(r.Err(), ErrException) {
		t.Fatalf("exception %+v %v", r, err)
	}
}

var badRequests = [][]byte{
	nil,
	{0x03},
	{0x03, 0x00, 0x01, 0x00},
	{0x03, 0x00, 0x01, 0x00, 0x00},             // count 0
	{0x03, 0x00, 0x01, 0x00, 0x7e},             // count 126
	{0x03, 0xff, 0xff, 0x00, 0x02},             // beyond the address space
	{0x06, 0x00, 0x01, 0x00},                   // short
	{0x06, 0x00, 0x01, 0x00, 0x01, 0x00},       // long
	{0x10, 0x00, 0x01, 0x00, 0x02, 0x04, 0x00}, // truncated values
	{0x10, 0x00, 0x01, 0x00, 0x02, 0x03, 0x00, 0x01, 0x00, 0x02}, // byte count mismatch
	{0x10, 0x00, 0x01, 0x00, 0x00, 0x00},                         // zero registers
	{0x2b, 0x00, 0x01, 0x00, 0x01},                               // unknown function
	{0x01, 0x00, 0x01, 0x00, 0x00},                               // read 0 coils
	{0x02, 0x00, 0x01, 0x07, 0xd1},                               // read 2001 inputs
	{0x04, 0x00, 0x01, 0x00, 0x7e},                               // read 126 input registers
	{0x05, 0x00, 0x01, 0x00, 0x01},                               // coil value neither 0xff00 nor 0
	{0x05, 0x00, 0x01, 0xff, 0x00, 0x00},                         // long coil write
	{0x0f, 0x00, 0x01, 0x00, 0x0a, 0x01, 0xcd},                   // 10 coils in 1 byte
	{0x0f, 0x00, 0x01, 0x00, 0x03, 0x01, 0x0d},                   // padding bits set
	{0x0f, 0x00, 0x01, 0x00, 0x00, 0x00},                         // zero coils
	{0x0f, 0x00, 0x01, 0x07, 0xb1, 0xf7},                         // 1969 coils
	bytes.Repeat([]byte{0x10}, 300),
}

func TestDecodeRequestRejects(t *testing.T) {
	for _, b := range badRequests {
		if q, err := DecodeRequest(b); !errors.Is(err, ErrPDU) {
			t.Errorf("% x: %+v %v", b, q, err)
		}
	}
}

func FuzzDecodeRequest(f *testing.F) {
	for _, b := range badRequests {
		f.Add(b)
	}
	f.Add([]byte{0x10, 0x00, 0x01, 0x00, 0x02, 0x04, 0x00, 0x0a, 0x01, 0x02})
	f.Fuzz(func(t *testing.T, b []byte) {
		q, err := DecodeRequest(b)
		if err != nil {
			return
		}
		enc, err := q.Encode()
		if err != nil || !bytes.Equal(enc, b) {
			t.Fatalf("% x decoded to %+v, re-encoded % x %v", b, q, enc, err)
		}
	})
}

func TestCommandPDU(t *testing.T) {
	body := func(v any) []byte {
		b, err := fence.EncodeBody(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	env := func(kind string, b []byte) *fence.Envelope {
		return &fence.Envelope{V: fence.Version, Device: "plc-1", Token: 5, Seq: 1, ID: "c1", Kind: kind, Body: b}
	}
	ok := []struct {
		env  *fence.Envelope
		want Request
	}{
		{env(KindWriteRegister, body(map[string]any{"addr": 3, "value": 42})), Request{Func: FuncWriteSingle, Addr: 3, Values: []uint16{42}}},
		{env(KindWriteRegisters, body(map[string]any{"addr": 0, "values": []int{1, 2}})), Request{Func: FuncWriteMultiple, Addr: 0, Values: []uint16{1, 2}}},
		{env(KindReadRegisters, body(map[string]any{"addr": 9, "count": 4})), Request{Func: FuncReadHolding, Addr: 9, Count: 4}},
	}
	for _, c := range ok {
		q, err := CommandPDU(c.env)
		if err != nil || q.Func != c.want.Func || q.Addr != c.want.Addr || q.Count != c.want.Count || !slices.Equal(q.Values, c.want.Values) {
			t.Errorf("%s: %+v %v", c.env.Kind, q, err)
		}
	}
	for name, e := range map[string]*fence.Envelope{
		"no body":        env(KindWriteRegister, nil),
		"no addr":        env(KindWriteRegister, body(map[string]any{"value": 1})),
		"value too big":  env(KindWriteRegister, body(map[string]any{"addr": 1, "value": 70000})),
		"negative":       env(KindWriteRegister, body(map[string]any{"addr": 1, "value": -1})),
		"unknown field":  env(KindWriteRegister, body(map[string]any{"addr": 1, "value": 1, "coil": true})),
		"mixed":          env(KindWriteRegister, body(map[string]any{"addr": 1, "value": 1, "values": []int{1}})),
		"too many":       env(KindWriteRegisters, body(map[string]any{"addr": 0, "values": make([]int, 124)})),
		"empty values":   env(KindWriteRegisters, body(map[string]any{"addr": 0, "values": []int{}})),
		"read zero":      env(KindReadRegisters, body(map[string]any{"addr": 0, "count": 0})),
		"unknown kind":   env("set", body(map[string]any{"addr": 0})),
		"string address": env(KindWriteRegister, body(map[string]any{"addr": "one", "value": 1})),
	} {
		if q, err := CommandPDU(e); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("%s: %+v %v", name, q, err)
		}
	}
}
