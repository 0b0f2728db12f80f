package shim

import (
	"errors"
	"os"
	"testing"
	"time"

	"github.com/edgefence/edgefence/fence"
)

// The CBOR records the shim wrote before it stored fence.MarkRecord
// (testdata/README.md) still decode.
func TestLegacyRecordFixtures(t *testing.T) {
	for file, want := range map[string]Record{
		"testdata/record-cbor-full.bin": {Mark: fence.Mark{Token: 7350, Seq: 42}, At: time.UnixMilli(1767225600123), Holder: "gw-a", ID: "cmd-0042"},
		"testdata/record-cbor-bare.bin": {Mark: fence.Mark{Token: 1, Seq: 1}},
	} {
		v, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if v[0]>>5 != cborMajorMap {
			t.Fatalf("%s: first byte %#x is not a CBOR map", file, v[0])
		}
		r, err := decodeLegacyRecord(v)
		if err != nil || r.Mark != want.Mark || !r.At.Equal(want.At) || r.Holder != want.Holder || r.ID != want.ID {
			t.Errorf("%s: %+v %v, want %+v", file, r, err, want)
		}
		// A MarkRecord never starts like a CBOR map, nor does one bit off.
		b, err := r.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		for bit := range 8 {
			if x := b[0] ^ 1<<bit; x>>5 == cborMajorMap {
				t.Errorf("version byte %#x with bit %d flipped reads as a CBOR map", b[0], bit)
			}
		}
		if _, err := decodeLegacyRecord(v[:len(v)-1]); !errors.Is(err, fence.ErrMarkRecordCorrupt) {
			t.Errorf("%s cut short: %v", file, err)
		}
	}
}
