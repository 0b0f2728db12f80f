package modbus

import (
	"bytes"
	"errors"
	"testing"
	"time"
)

// Frames from the Modbus specifications and their common worked examples:
// the CRC bytes as they go on the wire, low byte first.
var rtuVectors = []struct {
	frame []byte
}{
	{[]byte{0x01, 0x03, 0x00, 0x00, 0x00, 0x0A, 0xC5, 0xCD}}, // read 10 holding registers of unit 1
	{[]byte{0x01, 0x06, 0x00, 0x01, 0x00, 0x03, 0x98, 0x0B}}, // write register 1 = 3
	{[]byte{0x11, 0x03, 0x00, 0x6B, 0x00, 0x03, 0x76, 0x87}}, // unit 17, registers 107..109
}

func TestRTUVectors(t *testing.T) {
	for _, v := range rtuVectors {
		unit, pdu := v.frame[0], v.frame[1:len(v.frame)-2]
		got, err := EncodeRTU(unit, pdu)
		if err != nil || !bytes.Equal(got, v.frame) {
			t.Errorf("EncodeRTU(%d, % x) = % x, %v; want % x", unit, pdu, got, err, v.frame)
		}
		back, err := DecodeRTU(v.frame, unit)
		if err != nil || !bytes.Equal(back, pdu) {
			t.Errorf("DecodeRTU(% x) = % x, %v", v.frame, back, err)
		}
	}
}

// Every single-bit error on the line is caught by the CRC (or, in the unit
// byte, as another unit's answer): never a PDU.
func TestRTUBitErrors(t *testing.T) {
	for _, v := range rtuVectors {
		for i := range len(v.frame) * 8 {
			f := bytes.Clone(v.frame)
			f[i/8] ^= 1 << (i % 8)
			if pdu, err := DecodeRTU(f, v.frame[0]); !errors.Is(err, ErrCRC) && !errors.Is(err, ErrFrame) {
				t.Fatalf("bit %d flipped in % x: PDU % x, %v", i, v.frame, pdu, err)
			}
		}
	}
}

func TestRTURefusals(t *testing.T) {
	good := rtuVectors[0].frame
	for _, tc := range []struct {
		name  string
		frame []byte
		unit  byte
		want  error
	}{
		{"another unit's answer", good, 2, ErrFrame},
		{"too short", good[:3], 1, ErrFrame},
		{"too long", make([]byte, MaxRTUFrame+1), 1, ErrFrame},
		{"truncated", good[:len(good)-1], 1, ErrCRC},
	} {
		if _, err := DecodeRTU(tc.frame, tc.unit); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	for _, tc := range []struct {
		unit byte
		pdu  []byte
	}{{MaxUnit + 1, []byte{3}}, {1, nil}, {1, make([]byte, maxPDU+1)}} {
		if _, err := EncodeRTU(tc.unit, tc.pdu); !errors.Is(err, ErrFrame) {
			t.Errorf("EncodeRTU(%d, %d bytes): %v", tc.unit, len(tc.pdu), err)
		}
	}
}

func TestRTUTiming(t *testing.T) {
	slow, err := TimingFor(9600)
	if err != nil {
		t.Fatal(err)
	}
	// 11 bits at 9,600 baud: 1,145.8 µs a character; t3.5 4,010 µs.
	if slow.Char != 1145833*time.Nanosecond || slow.T35 != slow.Char*7/2 || slow.T15 != slow.Char*3/2 {
		t.Errorf("9600 baud: %+v", slow)
	}
	if f := slow.FrameTime(8); f != 8*slow.Char+slow.T35 {
		t.Errorf("frame time %v", f)
	}
	fast, err := TimingFor(115200)
	if err != nil || fast.T15 != 750*time.Microsecond || fast.T35 != 1750*time.Microsecond {
		t.Errorf("115200 baud: %+v %v (the fixed intervals above 19,200 baud)", fast, err)
	}
	if _, err := TimingFor(0); !errors.Is(err, ErrFrame) {
		t.Errorf("baud 0: %v", err)
	}
}

func TestTCPFrames(t *testing.T) {
	pdu := []byte{0x03, 0x00, 0x6B, 0x00, 0x03}
	h := MBAP{Transaction: 0x0102, Unit: 17}
	adu, err := EncodeTCP(h, pdu)
	want := []byte{0x01, 0x02, 0x00, 0x00, 0x00, 0x06, 0x11, 0x03, 0x00, 0x6B, 0x00, 0x03}
	if err != nil || !bytes.Equal(adu, want) {
		t.Fatalf("EncodeTCP = % x, %v; want % x", adu, err, want)
	}
	if back, err := DecodeTCP(adu, h); err != nil || !bytes.Equal(back, pdu) {
		t.Fatalf("DecodeTCP = % x, %v", back, err)
	}
	bad := func(mut func([]byte) []byte) []byte { return mut(bytes.Clone(adu)) }
	for _, tc := range []struct {
		name string
		adu  []byte
		want MBAP
	}{
		{"another transaction's answer", adu, MBAP{Transaction: 0x0103, Unit: 17}},
		{"another unit's answer", adu, MBAP{Transaction: 0x0102, Unit: 18}},
		{"protocol id not 0", bad(func(b []byte) []byte { b[3] = 1; return b }), h},
		{"length says more than sent", bad(func(b []byte) []byte { b[5] = 9; return b }), h},
		{"length 1: no PDU", bad(func(b []byte) []byte { b[5] = 1; return b[:7] }), h},
		{"short header", adu[:5], h},
	} {
		if _, err := DecodeTCP(tc.adu, tc.want); !errors.Is(err, ErrFrame) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

func FuzzDecodeRTU(f *testing.F) {
	for _, v := range rtuVectors {
		f.Add(v.frame, v.frame[0])
	}
	f.Fuzz(func(t *testing.T, frame []byte, unit byte) {
		pdu, err := DecodeRTU(frame, unit)
		if err != nil {
			return
		}
		again, err := EncodeRTU(unit, pdu)
		if err == nil && !bytes.Equal(again, frame) {
			t.Fatalf("decoded % x to % x, which encodes to % x", frame, pdu, again)
		}
	})
}

func FuzzDecodeTCP(f *testing.F) {
	f.Add([]byte{0x01, 0x02, 0x00, 0x00, 0x00, 0x06, 0x11, 0x03, 0x00, 0x6B, 0x00, 0x03}, uint16(0x0102), byte(17))
	f.Fuzz(func(t *testing.T, adu []byte, tx uint16, unit byte) {
		h := MBAP{Transaction: tx, Unit: unit}
		pdu, err := DecodeTCP(adu, h)
		if err != nil {
			return
		}
		again, err := EncodeTCP(h, pdu)
		if err != nil || !bytes.Equal(again, adu) {
			t.Fatalf("decoded % x to % x, which encodes to % x (%v)", adu, pdu, again, err)
		}
	})
}

func BenchmarkCRC16(b *testing.B) {
	frame := make([]byte, MaxRTUFrame-2)
	b.SetBytes(int64(len(frame)))
	for b.Loop() {
		CRC16(frame)
	}
}

func BenchmarkRTURoundTrip(b *testing.B) {
	pdu := []byte{0x10, 0x00, 0x00, 0x00, 0x02, 0x04, 0x00, 0x0A, 0x01, 0x02}
	for b.Loop() {
		f, err := EncodeRTU(1, pdu)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := DecodeRTU(f, 1); err != nil {
			b.Fatal(err)
		}
	}
}
