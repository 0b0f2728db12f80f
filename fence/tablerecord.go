package fence

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"slices"
	"time"
	"unicode/utf8"
)

// A table record on disk is a fixed binary layout, big-endian, with a
// checksum, rather than CBOR: it is read inside the write transaction that
// every group commit runs one admit after the other, where its decoding cost
// is paid serially; and a flipped bit in a stored token must be detected,
// not obeyed (a token raised by corruption would refuse every real holder, a
// token lowered would let a stale one through).
//
//	offset  size  field
//	0       1     format version (recordVersion)
//	1       8     token
//	9       8     seq
//	17      8     when the mark was written, unix milliseconds (signed)
//	25      1     holder length h (at most MaxHolderLen)
//	26      h     holder, UTF-8
//	26+h    1     command id length i (at most MaxIDLen)
//	27+h    i     command id
//	27+h+i  4     CRC-32C (Castagnoli) of all preceding bytes
const (
	recordVersion = 1
	recordMin     = 31 // empty holder and id
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// appendRecord appends the encoding of a record to b. Holder and id longer
// than the format allows are cut (Envelope.Validate prevents that).
func appendRecord(b []byte, m Mark, at int64, holder, id string) []byte {
	if len(holder) > MaxHolderLen {
		holder = truncateUTF8(holder, MaxHolderLen)
	}
	if len(id) > MaxIDLen {
		id = truncateUTF8(id, MaxIDLen)
	}
	start := len(b)
	b = slices.Grow(b, recordMin+len(holder)+len(id))
	b = append(b, recordVersion)
	b = binary.BigEndian.AppendUint64(b, uint64(m.Token))
	b = binary.BigEndian.AppendUint64(b, m.Seq)
	b = binary.BigEndian.AppendUint64(b, uint64(at))
	b = append(b, byte(len(holder)))
	b = append(b, holder...)
	b = append(b, byte(len(id)))
	b = append(b, id...)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b[start:], castagnoli))
}

// decodeRecord decodes a stored record of device. Every failure wraps
// ErrTableCorrupt; it never panics.
func decodeRecord(device string, v []byte) (Record, error) {
	m, at, holder, id, err := parseRecord(v)
	if err != nil {
		return Record{}, err
	}
	return Record{Device: device, Mark: m, At: time.UnixMilli(at), Holder: string(holder), ID: string(id)}, nil
}

// parseRecord checks a stored record and splits it into its fields, which
// alias v. Every failure wraps ErrTableCorrupt.
func parseRecord(v []byte) (m Mark, at int64, holder, id []byte, err error) {
	if len(v) < recordMin {
		return Mark{}, 0, nil, nil, corruptf("record is %d bytes, at least %d expected", len(v), recordMin)
	}
	body, sum := v[:len(v)-4], binary.BigEndian.Uint32(v[len(v)-4:])
	if got := crc32.Checksum(body, castagnoli); got != sum {
		return Mark{}, 0, nil, nil, corruptf("record checksum %08x, stored %08x", got, sum)
	}
	if body[0] != recordVersion {
		return Mark{}, 0, nil, nil, corruptf("record format %d, want %d", body[0], recordVersion)
	}
	m = Mark{Token: Token(binary.BigEndian.Uint64(body[1:])), Seq: binary.BigEndian.Uint64(body[9:])}
	at = int64(binary.BigEndian.Uint64(body[17:]))
	holder, rest, ok := lenPrefixed(body[25:], MaxHolderLen)
	if !ok {
		return Mark{}, 0, nil, nil, corruptf("record holder length")
	}
	id, rest, ok = lenPrefixed(rest, MaxIDLen)
	if !ok || len(rest) != 0 {
		return Mark{}, 0, nil, nil, corruptf("record command id length")
	}
	switch {
	case m.Token == 0 || m.Seq == 0:
		return Mark{}, 0, nil, nil, corruptf("record holds mark %v: only accepted marks are stored", m)
	case !utf8.Valid(holder) || !utf8.Valid(id):
		return Mark{}, 0, nil, nil, corruptf("record holder or command id is not UTF-8")
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

func corruptf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrTableCorrupt, fmt.Sprintf(format, args...))
}
