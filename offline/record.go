package offline

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"slices"

	"github.com/edgefence/edgefence/fence"
)

// An entry record on disk (bucket entriesBucket, key the command id) is a
// fixed binary layout, big-endian, with a checksum, wrapping the original
// CBOR envelope and, once terminal, the CBOR ack:
//
//	offset  size  field
//	0       1     format version (recordVersion)
//	1       1     state: 0 pending, else the terminal fence.Verdict
//	2       8     position in the device's queue (from 1)
//	10      8     created, unix milliseconds (signed)
//	18      8     deadline (created + TTL), unix milliseconds
//	26      8     resolved, unix milliseconds (0 while pending)
//	34      4     envelope length n
//	38      n     envelope, as fence.MarshalEnvelope wrote it
//	38+n    2     ack length m (0: none, e.g. expired)
//	40+n    m     ack, as fence.MarshalAck wrote it
//	40+n+m  4     CRC-32C (Castagnoli) of all preceding bytes
const (
	recordVersion = 1
	recordMin     = 44
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// record is the decoded form of a stored entry.
type record struct {
	state    fence.Verdict // 0 while pending
	pos      uint64
	created  int64
	deadline int64
	resolved int64
	env      []byte // aliases the stored value inside a transaction
	ack      []byte
}

func (r *record) encode() []byte {
	b := make([]byte, 0, recordMin+len(r.env)+len(r.ack))
	b = append(b, recordVersion, byte(r.state))
	b = binary.BigEndian.AppendUint64(b, r.pos)
	b = binary.BigEndian.AppendUint64(b, uint64(r.created))
	b = binary.BigEndian.AppendUint64(b, uint64(r.deadline))
	b = binary.BigEndian.AppendUint64(b, uint64(r.resolved))
	b = binary.BigEndian.AppendUint32(b, uint32(len(r.env)))
	b = append(b, r.env...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(r.ack)))
	b = append(b, r.ack...)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// parseRecord checks a stored record and splits it into its fields, which
// alias v. Every failure wraps ErrCorrupt; it never panics.
func parseRecord(v []byte) (record, error) {
	if len(v) < recordMin {
		return record{}, corruptf("record is %d bytes, at least %d expected", len(v), recordMin)
	}
	body, sum := v[:len(v)-4], binary.BigEndian.Uint32(v[len(v)-4:])
	if got := crc32.Checksum(body, castagnoli); got != sum {
		return record{}, corruptf("record checksum %08x, stored %08x", got, sum)
	}
	if body[0] != recordVersion {
		return record{}, corruptf("record format %d, want %d", body[0], recordVersion)
	}
	r := record{
		state:    fence.Verdict(body[1]),
		pos:      binary.BigEndian.Uint64(body[2:]),
		created:  int64(binary.BigEndian.Uint64(body[10:])),
		deadline: int64(binary.BigEndian.Uint64(body[18:])),
		resolved: int64(binary.BigEndian.Uint64(body[26:])),
	}
	rest := body[34:]
	n := int(binary.BigEndian.Uint32(rest))
	rest = rest[4:]
	if n > len(rest)-2 || n > fence.MaxEnvelopeSize {
		return record{}, corruptf("record envelope length %d", n)
	}
	r.env, rest = rest[:n], rest[n:]
	m := int(binary.BigEndian.Uint16(rest))
	rest = rest[2:]
	if m != len(rest) || m > fence.MaxAckSize {
		return record{}, corruptf("record ack length %d", m)
	}
	r.ack = rest
	switch {
	case r.state != 0 && !r.state.Valid():
		return record{}, corruptf("record state %d", r.state)
	case r.pos == 0:
		return record{}, corruptf("record queue position 0")
	case (r.state == 0) != (r.resolved == 0):
		return record{}, corruptf("record state %v with resolved time %d", r.state, r.resolved)
	}
	return r, nil
}

// queueKey is the key of a pending entry in queueBucket: the device id, a
// zero byte (never part of a device id), and the position, so that a cursor
// walks one device's pending entries in order.
func queueKey(device string, pos uint64) []byte {
	b := make([]byte, 0, len(device)+9)
	b = append(b, device...)
	b = append(b, 0)
	return binary.BigEndian.AppendUint64(b, pos)
}

func queuePrefix(device string) []byte { return append([]byte(device), 0) }

// splitQueueKey is the inverse of queueKey.
func splitQueueKey(k []byte) (device string, pos uint64, ok bool) {
	i := slices.Index(k, 0)
	if i < 1 || len(k)-i-1 != 8 {
		return "", 0, false
	}
	return string(k[:i]), binary.BigEndian.Uint64(k[i+1:]), true
}

// doneKey is the key of a terminal entry in doneBucket: resolution time,
// then id, so that Compact walks the oldest first.
func doneKey(resolved int64, id string) []byte {
	b := make([]byte, 0, 8+len(id))
	b = binary.BigEndian.AppendUint64(b, uint64(resolved))
	return append(b, id...)
}

func corruptf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(format, args...))
}
