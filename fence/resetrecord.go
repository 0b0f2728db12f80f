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
// reset must exceed, its epoch, which the next must exceed too (AdmitEpoch:
// no command of an earlier epoch is admitted after it), its id and when it
// was applied. It is stored next to the device's mark record, written in
// the same transaction.
//
// Encoding, big-endian, checksummed like a MarkRecord (a flipped bit that
// lowered the counter or the epoch would let a reset be replayed). Format
// version 1 holds a reset of epoch 0 (written before resets had epochs):
//
//	offset  size  field
//	0       1     format version (1)
//	1       8     reset counter (not 0)
//	9       8     when the reset was applied, unix milliseconds (0: unknown)
//	17      1     reset id length i (at most MaxIDLen)
//	18      i     reset id
//	18+i    4     CRC-32C (Castagnoli) of all preceding bytes
//
// Format version 2 holds a reset of a later epoch: the same, with the epoch
// (8 bytes, not 0) after the counter, every later field 8 bytes on.
type ResetRecord struct {
	Counter uint64
	Epoch   uint64
	ID      string
	At      time.Time
}

// ResetRecordVersion is the format version MarshalBinary writes for a
// reset of epoch 0; ResetRecordEpochVersion the one for a later epoch.
const (
	ResetRecordVersion      = 1
	ResetRecordEpochVersion = 2
)

// MarshalBinary encodes the record.
func (r ResetRecord) MarshalBinary() ([]byte, error) {
	if r.Counter == 0 || len(r.ID) > MaxIDLen {
		return nil, invalidf("reset record: counter %d, id of %d bytes", r.Counter, len(r.ID))
	}
	var at int64
	if !r.At.IsZero() {
		at = r.At.UnixMilli()
	}
	b := make([]byte, 0, 30+len(r.ID))
	if r.Epoch == 0 {
		b = append(b, ResetRecordVersion)
		b = binary.BigEndian.AppendUint64(b, r.Counter)
	} else {
		b = append(b, ResetRecordEpochVersion)
		b = binary.BigEndian.AppendUint64(b, r.Counter)
		b = binary.BigEndian.AppendUint64(b, r.Epoch)
	}
	b = binary.BigEndian.AppendUint64(b, uint64(at))
	b = append(b, byte(len(r.ID)))
	b = append(b, r.ID...)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli)), nil
}

// UnmarshalBinary decodes a stored record; every failure wraps
// ErrMarkRecordCorrupt (the fence point fails closed for the device: none
// of its resets, nor of its commands, is decided until the record is
// repaired).
func (r *ResetRecord) UnmarshalBinary(v []byte) error {
	if len(v) < 22 {
		return recordCorruptf("reset record of %d bytes", len(v))
	}
	body, sum := v[:len(v)-4], binary.BigEndian.Uint32(v[len(v)-4:])
	if got := crc32.Checksum(body, castagnoli); got != sum {
		return recordCorruptf("reset record checksum %08x, stored %08x", got, sum)
	}
	counter := binary.BigEndian.Uint64(body[1:])
	f := body[9:] // the fields after the counter (and the epoch)
	var epoch uint64
	switch body[0] {
	case ResetRecordVersion:
	case ResetRecordEpochVersion:
		if len(v) < 30 {
			return recordCorruptf("reset record of %d bytes", len(v))
		}
		if epoch = binary.BigEndian.Uint64(f); epoch == 0 {
			return recordCorruptf("reset record format %d of epoch 0", ResetRecordEpochVersion)
		}
		f = f[8:]
	default:
		return recordCorruptf("reset record format %d", body[0])
	}
	id, rest, ok := lenPrefixed(f[8:], MaxIDLen)
	if !ok || len(rest) != 0 || counter == 0 {
		return recordCorruptf("reset record: counter %d, id length", counter)
	}
	*r = ResetRecord{Counter: counter, Epoch: epoch, ID: string(id)}
	if at := int64(binary.BigEndian.Uint64(f)); at != 0 {
		r.At = time.UnixMilli(at)
	}
	return nil
}

// CheckReset returns nil if a reset with counter and epoch may follow the
// stored record last (the zero record: none yet) at a fence point whose
// epoch for the device is e (State.At: the fleet epoch it holds for a
// device whose commands must be signed, the last reset's, the stored
// mark's). Otherwise it returns an error wrapping ErrInvalid and
// ErrReplayedReset: the counter must be above the last reset's, and the
// epoch above e, so that a reset replayed, or issued before an epoch the
// fence point holds, changes nothing.
func CheckReset(last ResetRecord, e, counter, epoch uint64) error {
	switch {
	case counter <= last.Counter:
		return fmt.Errorf("%w: %w: counter %d, the last reset (%s) had %d", ErrInvalid, ErrReplayedReset, counter, last.ID, last.Counter)
	case epoch <= e:
		return fmt.Errorf("%w: %w: epoch %d, the device is at epoch %d", ErrInvalid, ErrReplayedReset, epoch, e)
	}
	return nil
}
