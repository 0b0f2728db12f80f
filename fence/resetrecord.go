package fence

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"time"
)

// ErrReplayedReset means an operator's fence reset carries a reset counter
// not above the one the fence point stored with its last reset of the
// device: a replay (or an older reset delivered late). It is refused,
// wrapping ErrInvalid, with the mark unchanged. fence/auth names the same
// error auth.ErrReplayedReset.
var ErrReplayedReset = errors.New("fence: reset counter not above the last reset's (replay)")

// ResetRecord is what a fence point keeps of the last authorised reset of a
// device's mark (fence/auth's reset statement): its counter, which the next
// reset must exceed, its id and when it was applied. It is stored next to
// the device's mark record, written in the same transaction.
//
// Encoding, big-endian, checksummed like a MarkRecord (a flipped bit that
// lowered the counter would let a reset be replayed):
//
//	offset  size  field
//	0       1     format version (ResetRecordVersion)
//	1       8     reset counter (not 0)
//	9       8     when the reset was applied, unix milliseconds (0: unknown)
//	17      1     reset id length i (at most MaxIDLen)
//	18      i     reset id
//	18+i    4     CRC-32C (Castagnoli) of all preceding bytes
type ResetRecord struct {
	Counter uint64
	ID      string
	At      time.Time
}

// ResetRecordVersion is the format version MarshalBinary writes.
const ResetRecordVersion = 1

// MarshalBinary encodes the record.
func (r ResetRecord) MarshalBinary() ([]byte, error) {
	if r.Counter == 0 || len(r.ID) > MaxIDLen {
		return nil, invalidf("reset record: counter %d, id of %d bytes", r.Counter, len(r.ID))
	}
	var at int64
	if !r.At.IsZero() {
		at = r.At.UnixMilli()
	}
	b := make([]byte, 0, 22+len(r.ID))
	b = append(b, ResetRecordVersion)
	b = binary.BigEndian.AppendUint64(b, r.Counter)
	b = binary.BigEndian.AppendUint64(b, uint64(at))
	b = append(b, byte(len(r.ID)))
	b = append(b, r.ID...)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli)), nil
}

// UnmarshalBinary decodes a stored record; every failure wraps
// ErrMarkRecordCorrupt (the fence point fails closed for the device's
// resets: none is applied until the record is repaired).
func (r *ResetRecord) UnmarshalBinary(v []byte) error {
	if len(v) < 22 {
		return recordCorruptf("reset record of %d bytes", len(v))
	}
	body, sum := v[:len(v)-4], binary.BigEndian.Uint32(v[len(v)-4:])
	if got := crc32.Checksum(body, castagnoli); got != sum {
		return recordCorruptf("reset record checksum %08x, stored %08x", got, sum)
	}
	if body[0] != ResetRecordVersion {
		return recordCorruptf("reset record format %d", body[0])
	}
	id, rest, ok := lenPrefixed(body[17:], MaxIDLen)
	counter := binary.BigEndian.Uint64(body[1:])
	if !ok || len(rest) != 0 || counter == 0 {
		return recordCorruptf("reset record: counter %d, id length", counter)
	}
	*r = ResetRecord{Counter: counter, ID: string(id)}
	if at := int64(binary.BigEndian.Uint64(body[9:])); at != 0 {
		r.At = time.UnixMilli(at)
	}
	return nil
}

// CheckReset returns nil if a reset with counter may follow the stored
// record last (the zero record: none yet), and otherwise an error wrapping
// ErrInvalid and ErrReplayedReset.
func CheckReset(last ResetRecord, counter uint64) error {
	if counter <= last.Counter {
		return fmt.Errorf("%w: %w: counter %d, the last reset (%s) had %d", ErrInvalid, ErrReplayedReset, counter, last.ID, last.Counter)
	}
	return nil
}
