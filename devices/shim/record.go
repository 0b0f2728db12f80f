package shim

import (
	"fmt"
	"time"

	"github.com/fxamacker/cbor/v2"
	"go.etcd.io/bbolt"

	"github.com/edgefence/edgefence/fence"
)

// Record is a device's stored high-water mark and who moved it there, when:
// the fence package's one mark record, stored in its checksummed binary
// encoding (fence.MarkRecord).
type Record = fence.MarkRecord

// getRecord reads device's record from b: the zero Record if it has none.
// A record that fails its checksum or does not parse is an error wrapping
// ErrStorage and fence.ErrMarkRecordCorrupt, never a zero mark.
//
// Files written before the shim stored fence.MarkRecord hold a CBOR map
// without a checksum (legacyRecord); such a record still reads, and the
// next write of the device's mark replaces it with a MarkRecord. The two
// are told apart by the first byte: a CBOR map starts with 0xa0–0xbf, a
// MarkRecord with its version, 1 (no single-bit flip of which is a CBOR map
// header).
func getRecord(b *bbolt.Bucket, device string) (Record, error) {
	if b == nil {
		return Record{}, fmt.Errorf("%w: bucket %s missing", ErrStorage, marksBucket)
	}
	v := b.Get([]byte(device))
	if v == nil {
		return Record{}, nil
	}
	var r Record
	var err error
	if v[0]>>5 == cborMajorMap {
		r, err = decodeLegacyRecord(v)
	} else {
		err = r.UnmarshalBinary(v)
	}
	if err != nil {
		return Record{}, fmt.Errorf("%w: device %s: %w", ErrStorage, device, err)
	}
	return r, nil
}

// getResetEpoch reads the epoch of device's last reset (0: none) from tx.
// An unreadable reset record is an error wrapping ErrStorage and
// fence.ErrMarkRecordCorrupt: the device fails closed, as with its mark.
func getResetEpoch(tx *bbolt.Tx, device string) (uint64, error) {
	r, err := getReset(tx, device)
	return r.Epoch, err
}

// getReset reads the record of device's last reset from tx (the zero
// record if none).
func getReset(tx *bbolt.Tx, device string) (fence.ResetRecord, error) {
	var r fence.ResetRecord
	rb := tx.Bucket(resetsBucket)
	if rb == nil {
		return r, nil
	}
	if v := rb.Get([]byte(device)); v != nil {
		if err := r.UnmarshalBinary(v); err != nil {
			return fence.ResetRecord{}, fmt.Errorf("%w: device %s: %w", ErrStorage, device, err)
		}
	}
	return r, nil
}

func putRecord(b *bbolt.Bucket, device string, r Record) error {
	v, err := r.MarshalBinary()
	if err != nil {
		return fmt.Errorf("%w: encode mark record: %w", ErrStorage, err)
	}
	return b.Put([]byte(device), v)
}

// cborMajorMap is the major type of a CBOR map (the top three bits of its
// first byte).
const cborMajorMap = 5

// legacyRecord is the record the shim stored before fence.MarkRecord: a
// CBOR map with small integer keys and no checksum. It is read, never
// written.
type legacyRecord struct {
	Mark   fence.Mark `cbor:"1,keyasint"`
	At     int64      `cbor:"2,keyasint,omitempty"` // unix milliseconds
	Holder string     `cbor:"3,keyasint,omitempty"`
	ID     string     `cbor:"4,keyasint,omitempty"`
}

// legacyDec is lenient on unknown fields, as the decoder that read these
// records was, and strict on everything that could hide corruption.
var legacyDec = func() cbor.DecMode {
	dec, err := (cbor.DecOptions{
		DupMapKey:   cbor.DupMapKeyEnforcedAPF,
		IndefLength: cbor.IndefLengthForbidden,
		TagsMd:      cbor.TagsForbidden,
		UTF8:        cbor.UTF8RejectInvalid,
		MaxMapPairs: 64,
	}).DecMode()
	if err != nil {
		panic(err) // static options
	}
	return dec
}()

// decodeLegacyRecord decodes a CBOR record. Every failure, and a zero mark
// (the shim never stored one), wraps fence.ErrMarkRecordCorrupt.
func decodeLegacyRecord(v []byte) (Record, error) {
	var rec legacyRecord
	if err := legacyDec.Unmarshal(v, &rec); err != nil {
		return Record{}, fmt.Errorf("%w: CBOR record (before the checksummed one): %v", fence.ErrMarkRecordCorrupt, err)
	}
	if rec.Mark.Token == 0 || rec.Mark.Seq == 0 {
		return Record{}, fmt.Errorf("%w: CBOR record holds mark %v: only accepted marks are stored", fence.ErrMarkRecordCorrupt, rec.Mark)
	}
	r := Record{Mark: rec.Mark, Holder: rec.Holder, ID: rec.ID}
	if rec.At != 0 {
		r.At = time.UnixMilli(rec.At)
	}
	return r, nil
}
