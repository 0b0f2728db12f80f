package modbus

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"
)

// bits turns "1011" into []uint16{1, 0, 1, 1}.
func bits(s string) []uint16 {
	out := make([]uint16, len(s))
	for i, c := range s {
		out[i] = uint16(c - '0')
	}
	return out
}

// The examples of the Modbus application protocol v1.1b3 for the bit and
// input-register functions (6.1, 6.2, 6.4, 6.5, 6.11) and its exception
// example (7): request, response, and the values the response carries.
var specBitVectors = []struct {
	name     string
	q        Request
	req, rsp []byte
	values   []uint16
}{
	{"6.1 read coils 20-38", Request{Func: FuncReadCoils, Addr: 0x13, Count: 19},
		[]byte{0x01, 0x00, 0x13, 0x00, 0x13}, []byte{0x01, 0x03, 0xCD, 0x6B, 0x05},
		bits("1011001111010110101")},
	{"6.2 read discrete inputs 197-218", Request{Func: FuncReadDiscrete, Addr: 0xC4, Count: 22},
		[]byte{0x02, 0x00, 0xC4, 0x00, 0x16}, []byte{0x02, 0x03, 0xAC, 0xDB, 0x35},
		bits("0011010111011011101011")},
	{"6.4 read input register 9", Request{Func: FuncReadInput, Addr: 8, Count: 1},
		[]byte{0x04, 0x00, 0x08, 0x00, 0x01}, []byte{0x04, 0x02, 0x00, 0x0A}, []uint16{10}},
	{"6.5 write coil 173 on", Request{Func: FuncWriteCoil, Addr: 0xAC, Values: []uint16{1}},
		[]byte{0x05, 0x00, 0xAC, 0xFF, 0x00}, []byte{0x05, 0x00, 0xAC, 0xFF, 0x00}, []uint16{1}},
	{"6.11 write coils 20-29", Request{Func: FuncWriteCoils, Addr: 0x13, Values: bits("1011001110")},
		[]byte{0x0F, 0x00, 0x13, 0x00, 0x0A, 0x02, 0xCD, 0x01}, []byte{0x0F, 0x00, 0x13, 0x00, 0x0A}, nil},
}

func TestSpecExamplesBits(t *testing.T) {
	for _, v := range specBitVectors {
		b, err := v.q.Encode()
		if err != nil || !bytes.Equal(b, v.req) {
			t.Errorf("%s: request % x, %v; want % x", v.name, b, err, v.req)
		}
		q, err := DecodeRequest(v.req)
		if err != nil || q.Func != v.q.Func || q.Addr != v.q.Addr || q.Count != v.q.Count || !slices.Equal(q.Values, v.q.Values) {
			t.Errorf("%s: decoded request %+v, %v", v.name, q, err)
		}
		r, err := DecodeResponse(&v.q, v.rsp)
		if err != nil || r.Err() != nil || !slices.Equal(r.Values, v.values) {
			t.Errorf("%s: response %+v, %v; want values %v", v.name, r, err, v.values)
			continue
		}
		if v.q.Func == FuncWriteCoils && r.Count != 10 {
			t.Errorf("%s: echo count %d", v.name, r.Count)
		}
		if again := r.Encode(); !bytes.Equal(again, v.rsp) {
			t.Errorf("%s: response re-encodes to % x, want % x", v.name, again, v.rsp)
		}
	}
	q := &Request{Func: FuncReadCoils, Addr: 0x04A1, Count: 1}
	r, err := DecodeResponse(q, []byte{0x81, 0x02})
	if err != nil || r.Exception != ExIllegalAddress {
		t.Fatalf("7 exception example: %+v %v", r, err)
	}
	var ee *ExceptionError
	if err := r.Err(); !errors.Is(err, ErrException) || !errors.As(err, &ee) || ee.Code != ExIllegalAddress || ee.Func != FuncReadCoils ||
		!strings.Contains(err.Error(), "illegal data address (0x02)") {
		t.Fatalf("exception error %v", err)
	}
}

func TestExceptionNames(t *testing.T) {
	want := map[byte]string{
		0x01: "illegal function", 0x02: "illegal data address", 0x03: "illegal data value",
		0x04: "server device failure", 0x05: "acknowledge", 0x06: "server device busy",
		0x08: "memory parity error", 0x0A: "gateway path unavailable",
		0x0B: "gateway target device failed to respond",
		0x07: "unknown exception", 0x09: "unknown exception", 0x0C: "unknown exception", 0: "unknown exception",
	}
	for code, name := range want {
		if got := ExceptionName(code); got != name {
			t.Errorf("ExceptionName(0x%02x) = %q, want %q", code, got, name)
		}
	}
	if err := (&ExceptionError{Func: 0x06, Code: ExDeviceBusy}).Error(); err != "modbus: function 0x06: server device busy (0x06)" {
		t.Errorf("Error() = %q", err)
	}
	if (&Response{Func: 3}).Err() != nil {
		t.Error("a plain response has an error")
	}
}

func TestIsWrite(t *testing.T) {
	for f, w := range map[byte]bool{FuncReadCoils: false, FuncReadDiscrete: false, FuncReadHolding: false, FuncReadInput: false,
		FuncWriteCoil: true, FuncWriteSingle: true, FuncWriteCoils: true, FuncWriteMultiple: true, 0x2b: false} {
		if (&Request{Func: f}).IsWrite() != w {
			t.Errorf("function 0x%02x: IsWrite %v", f, !w)
		}
	}
}

func TestBitLimits(t *testing.T) {
	for _, q := range []Request{
		{Func: FuncReadCoils, Count: MaxReadBits},
		{Func: FuncReadDiscrete, Addr: 65535, Count: 1},
		{Func: FuncReadInput, Count: MaxReadRegisters},
		{Func: FuncWriteCoils, Values: make([]uint16, MaxWriteCoils)},
		{Func: FuncWriteCoil, Addr: 65535, Values: []uint16{0}},
	} {
		if err := q.Validate(); err != nil {
			t.Errorf("%+v: %v", q.Func, err)
		}
	}
	for name, q := range map[string]Request{
		"read 0 coils":      {Func: FuncReadCoils, Count: 0},
		"read 2001 coils":   {Func: FuncReadCoils, Count: MaxReadBits + 1},
		"read 126 inputs":   {Func: FuncReadInput, Count: MaxReadRegisters + 1},
		"write 1969 coils":  {Func: FuncWriteCoils, Values: make([]uint16, MaxWriteCoils+1)},
		"write no coils":    {Func: FuncWriteCoils},
		"coil value 2":      {Func: FuncWriteCoil, Values: []uint16{2}},
		"coils value 7":     {Func: FuncWriteCoils, Values: []uint16{0, 7}},
		"two single coils":  {Func: FuncWriteCoil, Values: []uint16{1, 1}},
		"beyond the space":  {Func: FuncReadDiscrete, Addr: 65535, Count: 2},
		"unknown function":  {Func: 0x2b, Count: 1},
		"write single none": {Func: FuncWriteSingle},
	} {
		if err := q.Validate(); !errors.Is(err, ErrPDU) {
			t.Errorf("%s: %v", name, err)
		}
		if _, err := DecodeResponse(&q, []byte{q.Func, 0, 0, 0, 0}); !errors.Is(err, ErrPDU) {
			t.Errorf("%s: a response to an invalid request decodes: %v", name, err)
		}
	}
}

var badResponses = []struct {
	q   Request
	rsp []byte
}{
	{Request{Func: FuncReadCoils, Count: 19}, []byte{0x01, 0x02, 0xCD, 0x6B}},              // byte count for 16
	{Request{Func: FuncReadCoils, Count: 19}, []byte{0x01, 0x03, 0xCD, 0x6B}},              // truncated
	{Request{Func: FuncReadCoils, Count: 8}, []byte{0x02, 0x01, 0xCD}},                     // another function
	{Request{Func: FuncReadInput, Count: 1}, []byte{0x04, 0x04, 0x00, 0x0A, 0x00, 0x01}},   // two registers
	{Request{Func: FuncReadInput, Count: 1}, []byte{0x84, 0x02, 0x00}},                     // long exception
	{Request{Func: FuncWriteCoil, Addr: 1, Values: []uint16{1}}, []byte{0x05, 0, 1, 0, 0}}, // echo off for on
	{Request{Func: FuncWriteCoil, Addr: 1, Values: []uint16{0}}, []byte{0x05, 0, 2, 0, 0}}, // echo of another coil
	{Request{Func: FuncWriteCoils, Addr: 1, Values: []uint16{1, 0}}, []byte{0x0F, 0, 1, 0, 3}},
	{Request{Func: FuncWriteCoils, Addr: 1, Values: []uint16{1, 0}}, []byte{0x0F, 0, 1, 0}},
}

func TestDecodeResponseRejects(t *testing.T) {
	for _, c := range badResponses {
		if r, err := DecodeResponse(&c.q, c.rsp); !errors.Is(err, ErrPDU) {
			t.Errorf("0x%02x % x: %+v %v", c.q.Func, c.rsp, r, err)
		}
	}
	// A device that leaves garbage in the padding bits is still understood.
	q := &Request{Func: FuncReadCoils, Count: 3}
	if r, err := DecodeResponse(q, []byte{0x01, 0x01, 0xF5}); err != nil || !slices.Equal(r.Values, bits("101")) {
		t.Errorf("padding: %+v %v", r, err)
	}
}

// FuzzDecodeResponse: whatever a device sends, decoding never panics, and a
// response that decodes re-encodes to one that decodes the same.
func FuzzDecodeResponse(f *testing.F) {
	for _, v := range specBitVectors {
		f.Add(v.q.Func, v.q.Addr, v.q.Span(), v.rsp)
	}
	for _, c := range badResponses {
		f.Add(c.q.Func, c.q.Addr, c.q.Span(), c.rsp)
	}
	f.Add(FuncReadHolding, uint16(0x6b), uint16(3), []byte{0x03, 0x06, 0x02, 0x2b, 0x00, 0x00, 0x00, 0x64})
	f.Fuzz(func(t *testing.T, fn byte, addr, n uint16, b []byte) {
		q := &Request{Func: fn, Addr: addr, Count: n}
		if q.IsWrite() {
			// The echo a write expects: values taken from the fuzzed bytes.
			q.Count = 0
			q.Values = make([]uint16, min(int(n), 300))
			for i := range q.Values {
				if i < len(b) {
					q.Values[i] = uint16(b[i])
				}
				if isBits(fn) {
					q.Values[i] &= 1
				}
			}
			if fn == FuncWriteCoil || fn == FuncWriteSingle {
				q.Values = q.Values[:min(len(q.Values), 1)]
			}
		}
		r, err := DecodeResponse(q, b)
		if err != nil {
			return
		}
		again, err := DecodeResponse(q, r.Encode())
		if err != nil || again.Exception != r.Exception || again.Addr != r.Addr || again.Count != r.Count || !slices.Equal(again.Values, r.Values) {
			t.Fatalf("% x decoded to %+v, whose encoding decodes to %+v, %v", b, r, again, err)
		}
	})
}
