package fence_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"testing"
	"time"

	"github.com/edgefence/edgefence/fence"
)

// rawResetRecord lays a reset record out by hand from the layout in
// ResetRecord's doc (the epoch only for a version other than 1).
func rawResetRecord(version byte, counter, epoch uint64, at int64, id string) []byte {
	b := binary.BigEndian.AppendUint64([]byte{version}, counter)
	if version != 1 {
		b = binary.BigEndian.AppendUint64(b, epoch)
	}
	b = binary.BigEndian.AppendUint64(b, uint64(at))
	b = append(append(b, byte(len(id))), id...)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)))
}

// A reset record of epoch 0 keeps format 1 (as stored before epochs); one
// of a later epoch is format 2; both read back; every bit flip, cut, and
// CRC-valid record the format does not allow is refused.
func TestResetRecordFormats(t *testing.T) {
	at := time.UnixMilli(1767225600123)
	for _, tc := range []struct {
		r    fence.ResetRecord
		want []byte
	}{
		{fence.ResetRecord{Counter: 3, ID: "reset:a", At: at}, rawResetRecord(1, 3, 0, at.UnixMilli(), "reset:a")},
		{fence.ResetRecord{Counter: 3, Epoch: 1767225600000, ID: "reset:a", At: at}, rawResetRecord(2, 3, 1767225600000, at.UnixMilli(), "reset:a")},
		{fence.ResetRecord{Counter: 1<<64 - 1, Epoch: 1<<64 - 1}, rawResetRecord(2, 1<<64-1, 1<<64-1, 0, "")},
	} {
		b, err := tc.r.MarshalBinary()
		if err != nil || !bytes.Equal(b, tc.want) {
			t.Fatalf("%+v: %x %v, want %x", tc.r, b, err, tc.want)
		}
		var got fence.ResetRecord
		if err := got.UnmarshalBinary(b); err != nil || got.Counter != tc.r.Counter || got.Epoch != tc.r.Epoch || got.ID != tc.r.ID || !got.At.Equal(tc.r.At) {
			t.Fatalf("read %+v %v, wrote %+v", got, err, tc.r)
		}
		for i := range len(b) * 8 {
			x := bytes.Clone(b)
			x[i/8] ^= 1 << (i % 8)
			if err := got.UnmarshalBinary(x); !errors.Is(err, fence.ErrMarkRecordCorrupt) {
				t.Fatalf("bit %d flipped: %v", i, err)
			}
		}
		for n := range len(b) {
			if err := got.UnmarshalBinary(b[:n]); !errors.Is(err, fence.ErrMarkRecordCorrupt) {
				t.Fatalf("cut at %d: %v", n, err)
			}
		}
	}
	for name, b := range map[string][]byte{
		"version 2 of epoch 0": rawResetRecord(2, 3, 0, 0, "reset:a"),
		"version 3":            rawResetRecord(3, 3, 1, 0, "reset:a"),
		"counter 0":            rawResetRecord(2, 0, 1, 0, "reset:a"),
		"version 2, 1 layout":  append([]byte{2}, rawResetRecord(1, 3, 0, 0, "reset:a")[1:]...),
	} {
		var r fence.ResetRecord
		if err := r.UnmarshalBinary(b); !errors.Is(err, fence.ErrMarkRecordCorrupt) {
			t.Errorf("%s: %+v %v", name, r, err)
		}
	}
}
