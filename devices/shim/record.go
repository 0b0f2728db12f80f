package shim

import (
	"fmt"
	"time"

	"github.com/fxamacker/cbor/v2"

	"github.com/edgefence/edgefence/fence"
)

// Record is a device's stored high-water mark and who moved it there, when.
type Record struct {
	Mark   fence.Mark // highest token accepted, last seq under it
	At     time.Time  // fence point's clock when the mark was written (information only)
	Holder string     // holder named by the command that set the mark
	ID     string     // command id that set the mark
}

// record is Record on disk: a CBOR map with small integer keys.
type record struct {
	Mark   fence.Mark `cbor:"1,keyasint"`
	At     int64      `cbor:"2,keyasint,omitempty"` // unix milliseconds
	Holder string     `cbor:"3,keyasint,omitempty"`
	ID     string     `cbor:"4,keyasint,omitempty"`
}

var (
	recEnc cbor.EncMode
	recDec cbor.DecMode
)

func init() {
	var err error
	if recEnc, err = cbor.CoreDetEncOptions().EncMode(); err != nil {
		panic(err) // static options
	}
	// Lenient on unknown fields so a newer firmware's records still read;
	// strict on everything that could hide corruption.
	if recDec, err = (cbor.DecOptions{
		DupMapKey:   cbor.DupMapKeyEnforcedAPF,
		IndefLength: cbor.IndefLengthForbidden,
		TagsMd:      cbor.TagsForbidden,
		UTF8:        cbor.UTF8RejectInvalid,
		MaxMapPairs: 64,
	}).DecMode(); err != nil {
		panic(err)
	}
}

func (r Record) encode() ([]byte, error) {
	rec := record{Mark: r.Mark, Holder: r.Holder, ID: r.ID}
	if !r.At.IsZero() {
		rec.At = r.At.UnixMilli()
	}
	return recEnc.Marshal(rec)
}

func decodeRecord(b []byte) (Record, error) {
	var rec record
	if err := recDec.Unmarshal(b, &rec); err != nil {
		return Record{}, fmt.Errorf("%w: decode mark record: %v", ErrStorage, err)
	}
	r := Record{Mark: rec.Mark, Holder: rec.Holder, ID: rec.ID}
	if rec.At != 0 {
		r.At = time.UnixMilli(rec.At)
	}
	return r, nil
}
