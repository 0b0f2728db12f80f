package fence

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"time"
	"unicode/utf8"
)

// MarkRecord is a fence point's durable high-water mark and who moved it
// there, when: the one record both fence points keep per device, the
// gateway's fence table (Table) and the device shim (devices/shim).
//
// Its encoding (MarshalBinary, AppendBinary) is a fixed binary layout,
// big-endian, with a checksum, rather than CBOR: the table reads it inside
// the write transaction that every group commit runs one admit after the
// other, where its decoding cost is paid serially; and a flipped bit in a
// stored token must be detected, not obeyed (a token raised by corruption
// would refuse every real holder, a token lowered would let a stale one
// through). Format version 1:
//
//	offset  size  field
//	0       1     format version (MarkRecordVersion)
//	1       8     token (not 0)
//	9       8     seq (not 0)
//	17      8     when the mark was written, unix milliseconds (signed; 0: unknown)
//	25      1     holder length h (at most MaxHolderLen)
//	26      h     holder, UTF-8
//	26+h    1     command id length i (at most MaxIDLen)
//	27+h    i     command id, UTF-8
//	27+h+i  4     CRC-32C (Castagnoli) of all preceding bytes
//
// The encoding is canonical: UnmarshalBinary accepts exactly the bytes
// MarshalBinary writes, and fails with an error wrapping
// ErrMarkRecordCorrupt on anything else (a checksum that does not match,
// another version, a length that does not add up, a zero mark). A fence
// point that meets such a record fails closed for that device: it refuses
// its commands rather than decide from a mark it cannot trust.
//
// A version byte of 1 is never the first byte of a CBOR map (0xa0–0xbf),
// nor is any single-bit flip of it, so a reader may tell this record from
// an older CBOR one by its first byte (the shim does, for files it wrote
// before this record existed).
type MarkRecord struct {
	Mark   Mark      // highest token accepted, last seq under it
	At     time.Time // fence point's clock when the mark was written (information only; stored to the millisecond)
	Holder string    // holder named by the command that set the mark
	ID     string    // id of the command that set the mark
}

// MarkRecordVersion is the format version MarshalBinary writes.
const MarkRecordVersion = 1

// markRecordMin is the size of a record with empty holder and id.
const markRecordMin = 31

// ErrMarkRecordCorrupt means a stored mark record failed its checksum or
// does not parse. Callers test it with errors.Is.
var ErrMarkRecordCorrupt = errors.New("fence: mark record corrupt")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// AppendBinary appends the record's encoding to b. It fails, wrapping
// ErrInvalid, for a record that cannot be stored: a zero token or seq, a
// holder or id too long or not UTF-8.
func (r MarkRecord) AppendBinary(b []byte) ([]byte, error) {
	switch {
	case r.Mark.Token == 0 || r.Mark.Seq == 0:
		return b, invalidf("mark record: mark %v: only accepted marks are stored", r.Mark)
	case len(r.Holder) > MaxHolderLen || !utf8.ValidString(r.Holder):
		return b, invalidf("mark record: holder: not valid UTF-8 of at most %d bytes", MaxHolderLen)
	case len(r.ID) > MaxIDLen || !utf8.ValidString(r.ID):
		return b, invalidf("mark record: id: not valid UTF-8 of at most %d bytes", MaxIDLen)
	}
	var at int64
	if !r.At.IsZero() {
		at = r.At.UnixMilli()
	}
	start := len(b)
	b = slices.Grow(b, markRecordMin+len(r.Holder)+len(r.ID))
	b = append(b, MarkRecordVersion)
	b = binary.BigEndian.AppendUint64(b, uint64(r.Mark.Token))
	b = binary.BigEndian.AppendUint64(b, r.Mark.Seq)
	b = binary.BigEndian.AppendUint64(b, uint64(at))
	b = append(b, byte(len(r.Holder)))
	b = append(b, r.Holder...)
	b = append(b, byte(len(r.ID)))
	b = append(b, r.ID...)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b[start:], castagnoli)), nil
}

// MarshalBinary encodes the record (see AppendBinary).
func (r MarkRecord) MarshalBinary() ([]byte, error) { return r.AppendBinary(nil) }

// UnmarshalBinary decodes a stored record. Every failure wraps
// ErrMarkRecordCorrupt and leaves r unchanged; it never panics. A stored
// time of 0 reads as the zero time.
func (r *MarkRecord) UnmarshalBinary(data []byte) error {
	m, at, holder, id, err := parseMarkRecord(data)
	if err != nil {
		return err
	}
	*r = MarkRecord{Mark: m, Holder: string(holder), ID: string(id)}
	if at != 0 {
		r.At = time.UnixMilli(at)
	}
	return nil
}

// parseMarkRecord checks a stored record and splits it into its fields,
// which alias v. Every failure wraps ErrMarkRecordCorrupt.
func parseMarkRecord(v []byte) (m Mark, at int64, holder, id []byte, err error) {
	if len(v) < markRecordMin {
		return Mark{}, 0, nil, nil, recordCorruptf("%d bytes, at least %d expected", len(v), markRecordMin)
	}
	body, sum := v[:len(v)-4], binary.BigEndian.Uint32(v[len(v)-4:])
	if got := crc32.Checksum(body, castagnoli); got != sum {
		return Mark{}, 0, nil, nil, recordCorruptf("checksum %08x, stored %08x", got, sum)
	}
	if body[0] != MarkRecordVersion {
		return Mark{}, 0, nil, nil, recordCorruptf("format %d, want %d", body[0], MarkRecordVersion)
	}
	m = Mark{Token: Token(binary.BigEndian.Uint64(body[1:])), Seq: binary.BigEndian.Uint64(body[9:])}
	at = int64(binary.BigEndian.Uint64(body[17:]))
	holder, rest, ok := lenPrefixed(body[25:], MaxHolderLen)
	if !ok {
		return Mark{}, 0, nil, nil, recordCorruptf("holder length")
	}
	id, rest, ok = lenPrefixed(rest, MaxIDLen)
	if !ok || len(rest) != 0 {
		return Mark{}, 0, nil, nil, recordCorruptf("command id length")
	}
	switch {
	case m.Token == 0 || m.Seq == 0:
		return Mark{}, 0, nil, nil, recordCorruptf("holds mark %v: only accepted marks are stored", m)
	case !utf8.Valid(holder) || !utf8.Valid(id):
		return Mark{}, 0, nil, nil, recordCorruptf("holder or command id is not UTF-8")
	}
	return m, at, holder, id, nil
}

// lenPrefixed splits a one-byte length and that many bytes (at most max)
// off the front of b.
func lenPrefixed(b []byte, max int) (field, rest []byte, ok bool) {
	if len(b) < 1 {
		return nil, nil, false
	}
	n := int(b[0])
	if n > max || len(b) < 1+n {
		return nil, nil, false
	}
	return b[1 : 1+n], b[1+n:], true
}

func recordCorruptf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMarkRecordCorrupt, fmt.Sprintf(format, args...))
}

// corruptf is an error of the table's own data (the unapplied bucket).
func corruptf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrTableCorrupt, fmt.Sprintf(format, args...))
}
