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
// through). Format version 1 holds a mark of epoch 0:
//
//	offset  size  field
//	0       1     format version (1)
//	1       8     token (not 0)
//	9       8     seq (not 0)
//	17      8     when the mark was written, unix milliseconds (signed; 0: unknown)
//	25      1     holder length h (at most MaxHolderLen)
//	26      h     holder, UTF-8
//	26+h    1     command id length i (at most MaxIDLen)
//	27+h    i     command id, UTF-8
//	27+h+i  4     CRC-32C (Castagnoli) of all preceding bytes
//
// Format version 2 holds a mark of a later epoch: the same, with the epoch
// (8 bytes, not 0) after the version byte, every later field 8 bytes on.
// A record of epoch 0 is always written as version 1, so the files and
// flash slots of fence points that never had an epoch keep their bytes.
//
// The encoding is canonical: UnmarshalBinary accepts exactly the bytes
// MarshalBinary writes, and fails with an error wrapping
// ErrMarkRecordCorrupt on anything else (a checksum that does not match,
// another version, a length that does not add up, a zero mark, a version 2
// record of epoch 0). A fence point that meets such a record fails closed
// for that device: it refuses its commands rather than decide from a mark
// it cannot trust.
//
// A version byte of 1 or 2 is never the first byte of a CBOR map
// (0xa0–0xbf), nor is any single-bit flip of it, so a reader may tell this
// record from an older CBOR one by its first byte (the shim does, for files
// it wrote before this record existed).
type MarkRecord struct {
	Epoch  uint64    // the epoch the mark was accepted in (AdmitEpoch)
	Mark   Mark      // highest token accepted, last seq under it
	At     time.Time // fence point's clock when the mark was written (information only; stored to the millisecond)
	Holder string    // holder named by the command that set the mark
	ID     string    // id of the command that set the mark
}

// MarkRecordVersion is the format version MarshalBinary writes for a
// record of epoch 0; MarkRecordEpochVersion the one for a later epoch.
const (
	MarkRecordVersion      = 1
	MarkRecordEpochVersion = 2
)

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
	b = slices.Grow(b, markRecordMin+8+len(r.Holder)+len(r.ID))
	if r.Epoch == 0 {
		b = append(b, MarkRecordVersion)
	} else {
		b = append(b, MarkRecordEpochVersion)
		b = binary.BigEndian.AppendUint64(b, r.Epoch)
	}
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
	st, at, holder, id, err := parseMarkRecord(data)
	if err != nil {
		return err
	}
	*r = MarkRecord{Epoch: st.Epoch, Mark: st.Mark, Holder: string(holder), ID: string(id)}
	if at != 0 {
		r.At = time.UnixMilli(at)
	}
	return nil
}

// State returns the record's epoch and mark.
func (r MarkRecord) State() State { return State{Epoch: r.Epoch, Mark: r.Mark} }

// parseMarkRecord checks a stored record and splits it into its fields,
// which alias v. Every failure wraps ErrMarkRecordCorrupt.
func parseMarkRecord(v []byte) (st State, at int64, holder, id []byte, err error) {
	if len(v) < markRecordMin {
		return State{}, 0, nil, nil, recordCorruptf("%d bytes, at least %d expected", len(v), markRecordMin)
	}
	body, sum := v[:len(v)-4], binary.BigEndian.Uint32(v[len(v)-4:])
	if got := crc32.Checksum(body, castagnoli); got != sum {
		return State{}, 0, nil, nil, recordCorruptf("checksum %08x, stored %08x", got, sum)
	}
	f := body[1:] // the fields after the version (and the epoch)
	switch body[0] {
	case MarkRecordVersion:
	case MarkRecordEpochVersion:
		if len(v) < markRecordMin+8 {
			return State{}, 0, nil, nil, recordCorruptf("%d bytes, at least %d expected", len(v), markRecordMin+8)
		}
		if st.Epoch = binary.BigEndian.Uint64(f); st.Epoch == 0 {
			return State{}, 0, nil, nil, recordCorruptf("format %d of epoch 0", MarkRecordEpochVersion)
		}
		f = f[8:]
	default:
		return State{}, 0, nil, nil, recordCorruptf("format %d, want %d or %d", body[0], MarkRecordVersion, MarkRecordEpochVersion)
	}
	st.Mark = Mark{Token: Token(binary.BigEndian.Uint64(f)), Seq: binary.BigEndian.Uint64(f[8:])}
	at = int64(binary.BigEndian.Uint64(f[16:]))
	holder, rest, ok := lenPrefixed(f[24:], MaxHolderLen)
	if !ok {
		return State{}, 0, nil, nil, recordCorruptf("holder length")
	}
	id, rest, ok = lenPrefixed(rest, MaxIDLen)
	if !ok || len(rest) != 0 {
		return State{}, 0, nil, nil, recordCorruptf("command id length")
	}
	switch {
	case st.Mark.Token == 0 || st.Mark.Seq == 0:
		return State{}, 0, nil, nil, recordCorruptf("holds mark %v: only accepted marks are stored", st.Mark)
	case !utf8.Valid(holder) || !utf8.Valid(id):
		return State{}, 0, nil, nil, recordCorruptf("holder or command id is not UTF-8")
	}
	return st, at, holder, id, nil
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
