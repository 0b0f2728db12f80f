package fence

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// rawMarkRecord lays a record out by hand, from the layout in MarkRecord's
// doc, with no check of its fields: the reference the encoder is compared
// with, and a way to build CRC-valid records the encoder refuses.
func rawMarkRecord(version byte, m Mark, at int64, holder, id string) []byte {
	return rawEpochRecord(version, 0, m, at, holder, id)
}

// rawEpochRecord is rawMarkRecord with an epoch, laid out after the version
// byte for any version but 1.
func rawEpochRecord(version byte, epoch uint64, m Mark, at int64, holder, id string) []byte {
	b := []byte{version}
	if version != 1 {
		b = binary.BigEndian.AppendUint64(b, epoch)
	}
	b = binary.BigEndian.AppendUint64(b, uint64(m.Token))
	b = binary.BigEndian.AppendUint64(b, m.Seq)
	b = binary.BigEndian.AppendUint64(b, uint64(at))
	b = append(append(b, byte(len(holder))), holder...)
	b = append(append(b, byte(len(id))), id...)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)))
}

// validRecords are records at the edges of the format.
func validRecords() []MarkRecord {
	return []MarkRecord{
		{Mark: Mark{Token: 1, Seq: 1}},
		{Mark: Mark{Token: 1 << 40, Seq: 7}, At: time.UnixMilli(1700000000123), Holder: "gw-1.example", ID: "01J9ZK3T8QW5R2M6X4N0B7C1DE"},
		{Mark: Mark{Token: ^Token(0), Seq: ^uint64(0)}, At: time.UnixMilli(-1), Holder: strings.Repeat("h", MaxHolderLen), ID: strings.Repeat("i", MaxIDLen)},
		{Mark: Mark{Token: 3, Seq: 2}, At: time.UnixMilli(5), Holder: "holder-é", ID: "c:1/2"},
		{Epoch: 1, Mark: Mark{Token: 1, Seq: 1}},
		{Epoch: 1767225600123, Mark: Mark{Token: 3, Seq: ^uint64(0)}, At: time.UnixMilli(1767225600456), Holder: "operator reset", ID: "reset:0a1b"},
		{Epoch: ^uint64(0), Mark: Mark{Token: ^Token(0), Seq: ^uint64(0)}, At: time.UnixMilli(-1), Holder: strings.Repeat("h", MaxHolderLen), ID: strings.Repeat("i", MaxIDLen)},
	}
}

// fataler is what the helpers need of a *testing.T or a *rapid.T.
type fataler interface {
	Helper()
	Fatalf(format string, args ...any)
}

func marshalRecord(tb fataler, r MarkRecord) []byte {
	tb.Helper()
	b, err := r.MarshalBinary()
	if err != nil {
		tb.Fatalf("%+v: %v", r, err)
	}
	return b
}

// recordSeeds are valid encodings and near misses.
func recordSeeds(tb testing.TB) [][]byte {
	var valid [][]byte
	for _, r := range validRecords() {
		valid = append(valid, marshalRecord(tb, r))
	}
	seeds := append([][]byte(nil), valid...)
	for _, v := range valid {
		seeds = append(seeds, v[:len(v)-1], append(bytes.Clone(v), 0))
		for _, i := range []int{0, 1, 9, 25, len(v) - 1} {
			x := bytes.Clone(v)
			x[i] ^= 0x10
			seeds = append(seeds, x)
		}
	}
	return append(seeds, nil, []byte{1}, []byte{2}, rawMarkRecord(1, Mark{}, 0, "", ""),
		rawEpochRecord(2, 0, Mark{Token: 1, Seq: 1}, 0, "", ""))
}

// The encoder writes the documented layout, byte for byte.
func TestMarkRecordLayout(t *testing.T) {
	for _, r := range validRecords() {
		var at int64
		if !r.At.IsZero() {
			at = r.At.UnixMilli()
		}
		version := byte(1)
		if r.Epoch != 0 {
			version = 2
		}
		if got, want := marshalRecord(t, r), rawEpochRecord(version, r.Epoch, r.Mark, at, r.Holder, r.ID); !bytes.Equal(got, want) {
			t.Errorf("%+v:\n got %x\nwant %x", r, got, want)
		}
	}
	// AppendBinary appends.
	b, err := validRecords()[1].AppendBinary([]byte("key"))
	if err != nil || !bytes.HasPrefix(b, []byte("key")) || !bytes.Equal(b[3:], marshalRecord(t, validRecords()[1])) {
		t.Fatalf("AppendBinary: %x %v", b, err)
	}
}

// Version 1 as the fence table wrote it before MarkRecord existed
// (testdata/README.md) still reads, and is what MarshalBinary writes today.
func TestMarkRecordFixtureV1(t *testing.T) {
	old, err := os.ReadFile("testdata/record-v1.bin")
	if err != nil {
		t.Fatal(err)
	}
	want := MarkRecord{Mark: Mark{Token: 7350, Seq: 42}, At: time.UnixMilli(1767225600123), Holder: "gw-a", ID: "cmd-0042"}
	var r MarkRecord
	if err := r.UnmarshalBinary(old); err != nil || !recordsEqual(r, want) {
		t.Fatalf("fixture read as %+v, %v; want %+v", r, err, want)
	}
	if b := marshalRecord(t, want); !bytes.Equal(b, old) {
		t.Fatalf("re-encoded %x, fixture %x", b, old)
	}
}

func recordsEqual(a, b MarkRecord) bool {
	return a.Epoch == b.Epoch && a.Mark == b.Mark && a.At.Equal(b.At) && a.Holder == b.Holder && a.ID == b.ID
}

func drawRecord(t *rapid.T) MarkRecord {
	text := func(label string, max int) string {
		s := rapid.StringN(0, max, max).Draw(t, label)
		for len(s) > max { // StringN counts runes
			s = strings.ToValidUTF8(s[:len(s)-1], "")
		}
		return s
	}
	r := MarkRecord{
		Mark:   Mark{Token: Token(rapid.Uint64Min(1).Draw(t, "token")), Seq: rapid.Uint64Min(1).Draw(t, "seq")},
		Holder: text("holder", MaxHolderLen),
		ID:     text("id", MaxIDLen),
	}
	if ms := rapid.Int64().Draw(t, "at"); ms != 0 {
		r.At = time.UnixMilli(ms)
	}
	if rapid.Bool().Draw(t, "hasEpoch") {
		r.Epoch = rapid.Uint64Min(1).Draw(t, "epoch")
	}
	return r
}

// Every storable record reads back as it was written; every encoding read
// re-encodes to the same bytes.
func TestPropMarkRecordRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		r := drawRecord(t)
		b, err := r.MarshalBinary()
		if err != nil {
			t.Fatalf("%+v: %v", r, err)
		}
		var got MarkRecord
		if err := got.UnmarshalBinary(b); err != nil || !recordsEqual(got, r) {
			t.Fatalf("wrote %+v, read %+v, %v", r, got, err)
		}
		if re, _ := got.MarshalBinary(); !bytes.Equal(re, b) {
			t.Fatalf("re-encoded %x, want %x", re, b)
		}
	})
}

// checkCorrupt asserts b does not read, with ErrMarkRecordCorrupt, and that
// a failed read leaves the record alone.
func checkCorrupt(t fataler, what string, b []byte) {
	t.Helper()
	r := MarkRecord{ID: "untouched"}
	if err := r.UnmarshalBinary(b); !errors.Is(err, ErrMarkRecordCorrupt) || r.ID != "untouched" {
		t.Fatalf("%s (%x): %v, record %+v; want ErrMarkRecordCorrupt, record untouched", what, b, err, r)
	}
}

// Every single-bit flip anywhere in a record is detected (CRC-32C catches
// every one; the test makes sure nothing reads a field before the check).
func TestMarkRecordEveryBitFlipDetected(t *testing.T) {
	check := func(t fataler, b []byte) {
		for i := range len(b) * 8 {
			x := bytes.Clone(b)
			x[i/8] ^= 1 << (i % 8)
			checkCorrupt(t, fmt.Sprintf("byte %d bit %d flipped", i/8, i%8), x)
		}
	}
	for _, r := range validRecords() {
		check(t, marshalRecord(t, r))
	}
	rapid.Check(t, func(t *rapid.T) { check(t, marshalRecord(t, drawRecord(t))) })
}

// A record cut at any length, or with a byte added, is detected.
func TestMarkRecordTruncationDetected(t *testing.T) {
	for _, r := range validRecords() {
		b := marshalRecord(t, r)
		for n := range len(b) {
			checkCorrupt(t, "truncated", b[:n])
		}
		checkCorrupt(t, "extended", append(bytes.Clone(b), 0))
	}
}

// Records the format cannot hold are refused by the encoder; CRC-valid
// records of another version or a zero mark by the decoder.
func TestMarkRecordRefuses(t *testing.T) {
	for _, r := range []MarkRecord{
		{},
		{Mark: Mark{Token: 1}},
		{Mark: Mark{Seq: 1}},
		{Mark: Mark{Token: 1, Seq: 1}, Holder: strings.Repeat("h", MaxHolderLen+1)},
		{Mark: Mark{Token: 1, Seq: 1}, ID: strings.Repeat("i", MaxIDLen+1)},
		{Mark: Mark{Token: 1, Seq: 1}, Holder: "\xff"},
		{Mark: Mark{Token: 1, Seq: 1}, ID: "\xc3"},
	} {
		if b, err := r.MarshalBinary(); !errors.Is(err, ErrInvalid) || len(b) != 0 {
			t.Errorf("%+v: %x %v, want ErrInvalid", r, b, err)
		}
	}
	for what, b := range map[string][]byte{
		"version 0":                     rawMarkRecord(0, Mark{Token: 1, Seq: 1}, 0, "", ""),
		"version 3":                     rawEpochRecord(3, 1, Mark{Token: 1, Seq: 1}, 0, "", ""),
		"version 2 epoch 0":             rawEpochRecord(2, 0, Mark{Token: 1, Seq: 1}, 0, "", ""),
		"version 2 short":               rawMarkRecord(1, Mark{Token: 1, Seq: 1}, 0, "", "")[1:],
		"version 1 layout of version 2": append([]byte{2}, rawMarkRecord(1, Mark{Token: 1, Seq: 1}, 0, "", "")[1:]...),
		"zero mark epoch 9":             rawEpochRecord(2, 9, Mark{}, 0, "", ""),
		"zero mark":                     rawMarkRecord(1, Mark{}, 0, "", ""),
		"zero seq":                      rawMarkRecord(1, Mark{Token: 4}, 0, "", ""),
		"holder not UTF-8":              rawMarkRecord(1, Mark{Token: 1, Seq: 1}, 0, "\xff", ""),
		"holder too long":               rawMarkRecord(1, Mark{Token: 1, Seq: 1}, 0, strings.Repeat("h", MaxHolderLen+1), ""),
		"id too long":                   rawMarkRecord(1, Mark{Token: 1, Seq: 1}, 0, "", strings.Repeat("i", MaxIDLen+1)),
		"cbor":                          []byte("\xa4\x01\xa2\x01\x19\x1c\xb6\x02\x18\x2a\x02\x1b\x00\x00\x01\x9b\x76\xda\xa8\x7b\x03\x64gw-a\x04\x68cmd-0042"),
	} {
		checkCorrupt(t, what, b)
	}
}

// A stored time of 0 is "unknown" and reads as the zero time; the zero time
// is stored as 0.
func TestMarkRecordUnknownTime(t *testing.T) {
	var r MarkRecord
	if err := r.UnmarshalBinary(rawMarkRecord(1, Mark{Token: 1, Seq: 1}, 0, "", "")); err != nil || !r.At.IsZero() {
		t.Fatalf("%+v %v", r, err)
	}
	if b := marshalRecord(t, MarkRecord{Mark: Mark{Token: 1, Seq: 1}}); binary.BigEndian.Uint64(b[17:]) != 0 {
		t.Fatalf("zero time stored as %x", b[17:25])
	}
}

func TestMarkRecordSeeds(t *testing.T) {
	seeds := recordSeeds(t)
	n := len(validRecords())
	for _, s := range seeds[:n] {
		var r MarkRecord
		if err := r.UnmarshalBinary(s); err != nil {
			t.Fatalf("%x: %v", s, err)
		}
	}
	for _, s := range seeds[n:] {
		checkCorrupt(t, "seed", s)
	}
}

// FuzzParseMarkRecord: the stored-record parser never panics, accepts only
// canonical encodings of a real mark, and everything it accepts round-trips.
func FuzzParseMarkRecord(f *testing.F) {
	for _, s := range recordSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var r MarkRecord
		if err := r.UnmarshalBinary(b); err != nil {
			if !errors.Is(err, ErrMarkRecordCorrupt) {
				t.Fatalf("error %v does not wrap ErrMarkRecordCorrupt", err)
			}
			return
		}
		if r.Mark.Token == 0 || r.Mark.Seq == 0 {
			t.Fatalf("parsed a zero mark %v", r.Mark)
		}
		if re, err := r.MarshalBinary(); err != nil || !bytes.Equal(re, b) {
			t.Fatalf("parsed %x, re-encoded %x %v", b, re, err)
		}
	})
}
