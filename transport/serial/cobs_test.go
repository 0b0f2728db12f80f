package serial

import (
	"bytes"
	"encoding/hex"
	"testing"
)

// seq returns the bytes from, from+1, ..., to.
func seq(from, to int) []byte {
	b := make([]byte, 0, to-from+1)
	for i := from; i <= to; i++ {
		b = append(b, byte(i))
	}
	return b
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// cobsVectors are the examples of the Wikipedia article on COBS (encoded
// forms without the trailing 0x00 delimiter). They also seed FuzzCOBS.
var cobsVectors = []struct {
	name    string
	decoded []byte
	encoded []byte
}{
	{"1 zero", []byte{0x00}, []byte{0x01, 0x01}},
	{"2 zeros", []byte{0x00, 0x00}, []byte{0x01, 0x01, 0x01}},
	{"3 zero-11-zero", []byte{0x00, 0x11, 0x00}, []byte{0x01, 0x02, 0x11, 0x01}},
	{"4 11-22-zero-33", []byte{0x11, 0x22, 0x00, 0x33}, []byte{0x03, 0x11, 0x22, 0x02, 0x33}},
	{"5 no zeros", []byte{0x11, 0x22, 0x33, 0x44}, []byte{0x05, 0x11, 0x22, 0x33, 0x44}},
	{"6 trailing zeros", []byte{0x11, 0x00, 0x00, 0x00}, []byte{0x02, 0x11, 0x01, 0x01, 0x01}},
	{"7 01..FE", seq(0x01, 0xFE), cat([]byte{0xFF}, seq(0x01, 0xFE))},
	{"8 00..FE", seq(0x00, 0xFE), cat([]byte{0x01, 0xFF}, seq(0x01, 0xFE))},
	{"9 01..FF", seq(0x01, 0xFF), cat([]byte{0xFF}, seq(0x01, 0xFE), []byte{0x02, 0xFF})},
	{"10 02..FF,00", cat(seq(0x02, 0xFF), []byte{0x00}), cat([]byte{0xFF}, seq(0x02, 0xFF), []byte{0x01, 0x01})},
	{"11 03..FF,00,01", cat(seq(0x03, 0xFF), []byte{0x00, 0x01}), cat([]byte{0xFE}, seq(0x03, 0xFF), []byte{0x02, 0x01})},
	// Not in the article: the empty string, and a full block followed by
	// a zero.
	{"empty", []byte{}, []byte{0x01}},
	{"01..FE,00", cat(seq(0x01, 0xFE), []byte{0x00}), cat([]byte{0xFF}, seq(0x01, 0xFE), []byte{0x01, 0x01})},
}

func TestCOBSVectors(t *testing.T) {
	for _, tc := range cobsVectors {
		t.Run(tc.name, func(t *testing.T) {
			got := appendCOBS(nil, tc.decoded)
			if !bytes.Equal(got, tc.encoded) {
				t.Errorf("encode:\n got %s\nwant %s", hex.EncodeToString(got), hex.EncodeToString(tc.encoded))
			}
			if len(got) > cobsMaxLen(len(tc.decoded)) {
				t.Errorf("encoded %d bytes, above cobsMaxLen %d", len(got), cobsMaxLen(len(tc.decoded)))
			}
			dec, err := appendUncobs(nil, tc.encoded)
			if err != nil || !bytes.Equal(dec, tc.decoded) {
				t.Errorf("decode: got %s, %v; want %s", hex.EncodeToString(dec), err, hex.EncodeToString(tc.decoded))
			}
		})
	}
}

func TestCOBSInvalid(t *testing.T) {
	for _, enc := range [][]byte{
		{0x00},             // a delimiter inside
		{0x03, 0x11},       // block runs past the end
		{0x03, 0x11, 0x00}, // zero in a block
		{0xFF, 0x01},       // full block cut short
	} {
		if _, err := appendUncobs(nil, enc); err == nil {
			t.Errorf("appendUncobs(%x) succeeded", enc)
		}
	}
}

// FuzzCOBS checks that encoding round-trips and never emits a zero, and
// that decoding arbitrary input never panics.
func FuzzCOBS(f *testing.F) {
	for _, tc := range cobsVectors {
		f.Add(tc.decoded)
		f.Add(tc.encoded)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		enc := appendCOBS(nil, data)
		if bytes.IndexByte(enc, 0) >= 0 {
			t.Fatalf("encoding of %x contains a zero: %x", data, enc)
		}
		if len(enc) > cobsMaxLen(len(data)) {
			t.Fatalf("encoding of %d bytes is %d long, above %d", len(data), len(enc), cobsMaxLen(len(data)))
		}
		dec, err := appendUncobs(nil, enc)
		if err != nil || !bytes.Equal(dec, data) {
			t.Fatalf("round trip of %x: %x, %v", data, dec, err)
		}
		if dec, err := appendUncobs(nil, data); err == nil {
			if again, err := appendUncobs(nil, appendCOBS(nil, dec)); err != nil || !bytes.Equal(again, dec) {
				t.Fatalf("decode(encode(decode(%x))) = %x, %v", data, again, err)
			}
		}
	})
}
