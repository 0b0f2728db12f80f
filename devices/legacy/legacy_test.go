package legacy

import (
	"bytes"
	"slices"
	"testing"

	"github.com/edgefence/edgefence/transport/modbus"
)

func TestRegistersApplyAndLog(t *testing.T) {
	var log bytes.Buffer
	d := NewRegisters("plc-1", 16, &log)
	pdu := func(q modbus.Request) []byte {
		b, err := q.Encode()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	w := modbus.Request{Func: modbus.FuncWriteMultiple, Addr: 2, Values: []uint16{7, 8}}
	if r, err := modbus.DecodeResponse(&w, d.Handle(pdu(w))); err != nil || r.Err() != nil {
		t.Fatal(r, err)
	}
	rd := modbus.Request{Func: modbus.FuncReadHolding, Addr: 1, Count: 3}
	if r, err := modbus.DecodeResponse(&rd, d.Handle(pdu(rd))); err != nil || !slices.Equal(r.Values, []uint16{0, 7, 8}) {
		t.Fatal(r, err)
	}
	out := modbus.Request{Func: modbus.FuncWriteSingle, Addr: 16, Values: []uint16{1}}
	if r, err := modbus.DecodeResponse(&out, d.Handle(pdu(out))); err != nil || r.Exception != modbus.ExIllegalAddress {
		t.Fatal(r, err)
	}
	if r := d.Handle([]byte{0x2b, 0, 1, 0, 1}); !bytes.Equal(r, []byte{0xab, modbus.ExIllegalFunction}) {
		t.Fatalf("unknown function: % x", r)
	}
	if r := d.Handle([]byte{0x06, 0}); !bytes.Equal(r, []byte{0x86, modbus.ExIllegalValue}) {
		t.Fatalf("short write: % x", r)
	}
	if r := d.Handle([]byte{0x05, 0, 1, 0xff, 0}); !bytes.Equal(r, []byte{0x85, modbus.ExIllegalFunction}) {
		t.Fatalf("a coil write to a register device: % x", r)
	}
	applied, err := ReadApplied(&log)
	if err != nil || len(applied) != 1 || applied[0].Device != "plc-1" || applied[0].Addr != 2 || !slices.Equal(applied[0].Values, []uint16{7, 8}) {
		t.Fatalf("applied log %+v %v", applied, err)
	}
	if w, e := d.Stats(); w != 1 || e != 4 {
		t.Fatalf("stats %d %d", w, e)
	}
}

// FuzzHandle: any bytes get a response PDU, never a panic.
func FuzzHandle(f *testing.F) {
	f.Add([]byte{0x10, 0x00, 0x01, 0x00, 0x02, 0x04, 0x00, 0x0a, 0x01, 0x02})
	f.Add([]byte{0x03, 0x00, 0x00, 0x00, 0x7e})
	f.Fuzz(func(t *testing.T, b []byte) {
		d := NewRegisters("fz", 16, nil)
		if r := d.Handle(b); len(r) == 0 {
			t.Fatalf("% x: empty response", b)
		}
	})
}
