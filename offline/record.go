package offline

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"slices"

	"go.etcd.io/bbolt"

	"github.com/edgefence/edgefence/fence"
)

// An entry record on disk (bucket entriesBucket, key the command id) is a
// fixed binary layout, big-endian, with a checksum, wrapping the original
// CBOR envelope and, once terminal, the CBOR ack:
//
//	offset  size  field
//	0       1     format version: 1, or 2 for a record whose body was dropped
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
//
// Version 2 is written only for a terminal entry whose envelope's body was
// larger than KeepBodyMax: the envelope is then the sent one re-encoded
// without its body (every other field kept), and two fields follow the ack:
//
//	40+n+m  4     the dropped body's length b (1 to fence.MaxBodySize)
//	44+n+m  32    SHA-256 of the dropped body
//	76+n+m  4     CRC-32C (Castagnoli) of all preceding bytes
//
// The stub with the body put back, encoded by fence.MarshalEnvelope, is
// the envelope that was sent. Every other record, pending ones always, is
// version 1, as before version 2 existed; an outbox written by an older
// agent reads unchanged.
const (
	recordVersion        = 1
	recordVersionDropped = 2
	recordMin            = 44
	droppedTrailer       = 4 + sha256.Size // body length, SHA-256
)

// KeepBodyMax is the largest body, in encoded bytes, that an entry keeps
// once it is terminal. A larger body (a firmware chunk's data) is dropped
// in the transaction that records the terminal state: the entry keeps its
// envelope without the body, and the body's length and SHA-256 (Record's
// BodyBytes and BodySHA256). Pending entries always keep their whole
// envelope: they may still be sent.
const KeepBodyMax = 1024

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
	// dropped is the length of the body dropped from env when the entry
	// became terminal (version 2), 0 if env is whole; sum is its SHA-256.
	dropped uint32
	sum     [sha256.Size]byte
}

func (r *record) encode() []byte {
	version, size := byte(recordVersion), recordMin+len(r.env)+len(r.ack)
	if r.dropped != 0 {
		version, size = recordVersionDropped, size+droppedTrailer
	}
	b := make([]byte, 0, size)
	b = append(b, version, byte(r.state))
	b = binary.BigEndian.AppendUint64(b, r.pos)
	b = binary.BigEndian.AppendUint64(b, uint64(r.created))
	b = binary.BigEndian.AppendUint64(b, uint64(r.deadline))
	b = binary.BigEndian.AppendUint64(b, uint64(r.resolved))
	b = binary.BigEndian.AppendUint32(b, uint32(len(r.env)))
	b = append(b, r.env...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(r.ack)))
	b = append(b, r.ack...)
	if r.dropped != 0 {
		b = binary.BigEndian.AppendUint32(b, r.dropped)
		b = append(b, r.sum[:]...)
	}
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// parseRecord checks a stored record and splits it into its fields, which
// alias v. Every failure wraps ErrCorrupt; it never panics. It accepts only
// what encode writes: encode of its result gives v back.
func parseRecord(v []byte) (record, error) {
	if len(v) < recordMin {
		return record{}, corruptf("record is %d bytes, at least %d expected", len(v), recordMin)
	}
	body, sum := v[:len(v)-4], binary.BigEndian.Uint32(v[len(v)-4:])
	if got := crc32.Checksum(body, castagnoli); got != sum {
		return record{}, corruptf("record checksum %08x, stored %08x", got, sum)
	}
	trailer := 0
	switch body[0] {
	case recordVersion:
	case recordVersionDropped:
		trailer = droppedTrailer
	default:
		return record{}, corruptf("record format %d, want %d or %d", body[0], recordVersion, recordVersionDropped)
	}
	if len(body) < recordMin-4+trailer {
		return record{}, corruptf("record format %d is %d bytes, at least %d expected", body[0], len(v), recordMin+trailer)
	}
	r := record{
		state:    fence.Verdict(body[1]),
		pos:      binary.BigEndian.Uint64(body[2:]),
		created:  int64(binary.BigEndian.Uint64(body[10:])),
		deadline: int64(binary.BigEndian.Uint64(body[18:])),
		resolved: int64(binary.BigEndian.Uint64(body[26:])),
	}
	rest := body[34 : len(body)-trailer]
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
	if trailer != 0 {
		t := body[len(body)-trailer:]
		r.dropped = binary.BigEndian.Uint32(t)
		copy(r.sum[:], t[4:])
		if r.dropped == 0 {
			return record{}, corruptf("record format %d without a dropped body", body[0])
		}
	}
	if err := r.check(); err != nil {
		return record{}, err
	}
	return r, nil
}

// check is parseRecord's test of the fields' values.
func (r *record) check() error {
	switch {
	case r.state != 0 && !r.state.Valid():
		return corruptf("record state %d", r.state)
	case r.pos == 0:
		return corruptf("record queue position 0")
	case (r.state == 0) != (r.resolved == 0):
		return corruptf("record state %v with resolved time %d", r.state, r.resolved)
	case r.dropped != 0 && r.state == 0:
		return corruptf("pending record without its body")
	case r.dropped > fence.MaxBodySize:
		return corruptf("record dropped body length %d", r.dropped)
	}
	return nil
}

// dropBody replaces the envelope of r, a terminal entry, by env without its
// body if the body is larger than KeepBodyMax, records the body's length
// and SHA-256 (a version 2 record), and reports whether it did. A smaller
// body is kept.
func dropBody(r *record, env *fence.Envelope) bool {
	if len(env.Body) <= KeepBodyMax {
		return false
	}
	stub := *env
	stub.Body = nil
	raw, err := fence.MarshalEnvelope(&stub)
	if err != nil {
		// Cannot happen: env passed UnmarshalEnvelope's checks, and the
		// stub is env with less. Keeping the body loses nothing.
		return false
	}
	r.env, r.dropped, r.sum = raw, uint32(len(env.Body)), sha256.Sum256(env.Body)
	return true
}

// putTerminal stores r, a terminal record, over the pending one of id in
// entries. A record whose body was dropped is much smaller than the one it
// replaces, and a Put that shrinks a value leaves the B+tree leaf as sparse
// as the large value made it (a 30 KiB value gets a leaf of its own): bbolt
// rebalances leaves only after a Delete. Deleting the key first lets the
// commit merge that leaf with a neighbour, so that stubs fill their pages.
func putTerminal(entries *bbolt.Bucket, id []byte, r *record) error {
	if r.dropped != 0 {
		if err := entries.Delete(id); err != nil {
			return err
		}
	}
	return entries.Put(id, r.encode())
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
