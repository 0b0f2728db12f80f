package serial

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"sync/atomic"
)

// Frame size limits, in payload bytes (before the CRC and COBS).
const (
	// DefaultMaxPayload is the Decoder's and Link's limit when none is
	// configured.
	DefaultMaxPayload = 1024

	// MaxPayloadLimit is the largest payload Encode accepts and the largest
	// limit a Decoder can be given.
	MaxPayloadLimit = 64 * 1024
)

const (
	delimiter = 0x00
	crcLen    = 4
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Encode returns the wire form of one frame carrying payload:
//
//	0x00 | COBS(payload | CRC-32C(payload), big-endian) | 0x00
//
// The leading delimiter ends any noise the receiver may have buffered, so
// garbage on an idle line never spoils the next frame. The payload must
// hold 1 to MaxPayloadLimit bytes; an empty payload is refused because its
// CRC-32C is zero, which would make the noise 01 01 01 01 01 a valid frame.
func Encode(payload []byte) ([]byte, error) {
	if len(payload) == 0 || len(payload) > MaxPayloadLimit {
		return nil, fmt.Errorf("%w: %d bytes (1..%d)", ErrFrameSize, len(payload), MaxPayloadLimit)
	}
	return appendFrame(make([]byte, 0, encodedLen(len(payload))), payload), nil
}

// encodedLen is the largest wire length of a frame with n payload bytes.
func encodedLen(n int) int { return 2 + cobsMaxLen(n+crcLen) }

// appendFrame appends the wire form of payload to dst (see Encode).
func appendFrame(dst, payload []byte) []byte {
	// COBS-encode payload|crc without building payload|crc: the encoder
	// takes one slice, so copy into a small scratch when it fits the stack.
	var scratch [256]byte
	var buf []byte
	if len(payload)+crcLen <= len(scratch) {
		buf = scratch[:0]
	} else {
		buf = make([]byte, 0, len(payload)+crcLen)
	}
	buf = append(buf, payload...)
	buf = binary.BigEndian.AppendUint32(buf, crc32.Checksum(payload, castagnoli))
	dst = append(dst, delimiter)
	dst = appendCOBS(dst, buf)
	return append(dst, delimiter)
}

// FrameStats counts what a Decoder did with the bytes it read. Bytes are
// counted between delimiters (the delimiters themselves are not counted).
type FrameStats struct {
	FramesOK     uint64 // frames delivered (CRC correct, within the limit)
	CRCErrors    uint64 // frames dropped: valid COBS but CRC-32C mismatch
	Oversize     uint64 // frames dropped: payload over the limit
	Malformed    uint64 // frames dropped: invalid COBS or too short for a CRC
	GarbageBytes uint64 // bytes of all dropped frames
}

// frameCounters is the concurrency-safe form of FrameStats, shared by the
// Decoders a Link or Responder creates over its lifetime.
type frameCounters struct {
	ok, crc, oversize, malformed, garbage atomic.Uint64
}

func (c *frameCounters) snapshot() FrameStats {
	return FrameStats{
		FramesOK:     c.ok.Load(),
		CRCErrors:    c.crc.Load(),
		Oversize:     c.oversize.Load(),
		Malformed:    c.malformed.Load(),
		GarbageBytes: c.garbage.Load(),
	}
}

// A Decoder reads frames written by Encode from a byte stream. It never
// returns a frame whose CRC fails: damaged, truncated or oversize frames
// and noise are dropped and counted, and decoding resumes after the next
// delimiter. A Decoder is not safe for concurrent use, except Stats.
type Decoder struct {
	r          io.Reader
	maxPayload int
	maxEncoded int // longest COBS string that can hold maxPayload+crcLen
	c          *frameCounters

	rbuf       []byte
	rpos, rend int
	frame      []byte // encoded bytes of the frame being received
	discarding bool   // the current frame is oversize: drop to the delimiter
	err        error  // read error to return once the buffer is drained
}

// NewDecoder returns a Decoder reading from r that accepts payloads of up to
// maxPayload bytes (0 means DefaultMaxPayload; at most MaxPayloadLimit).
func NewDecoder(r io.Reader, maxPayload int) (*Decoder, error) {
	if maxPayload < 0 || maxPayload > MaxPayloadLimit {
		return nil, fmt.Errorf("%w: maxPayload %d (0..%d)", ErrInvalidConfig, maxPayload, MaxPayloadLimit)
	}
	return newDecoder(r, maxPayload, new(frameCounters)), nil
}

func newDecoder(r io.Reader, maxPayload int, c *frameCounters) *Decoder {
	if maxPayload == 0 {
		maxPayload = DefaultMaxPayload
	}
	return &Decoder{
		r:          r,
		maxPayload: maxPayload,
		maxEncoded: cobsMaxLen(maxPayload + crcLen),
		c:          c,
		rbuf:       make([]byte, 4096),
	}
}

// Stats returns the Decoder's counters. It is safe to call concurrently
// with Next.
func (d *Decoder) Stats() FrameStats { return d.c.snapshot() }

// Next returns the payload of the next intact frame. The slice is the
// caller's. An error from the underlying reader is returned as is, after the
// bytes read with it were processed; a partly received frame is kept, so
// after a timeout error (such as ErrReadTimeout) Next can simply be called
// again.
func (d *Decoder) Next() ([]byte, error) {
	for {
		if d.rpos == d.rend {
			if d.err != nil {
				err := d.err
				d.err = nil
				return nil, err
			}
			n, err := d.r.Read(d.rbuf)
			d.rpos, d.rend = 0, n
			if err != nil {
				if n == 0 {
					return nil, err
				}
				d.err = err
			}
			continue
		}
		chunk := d.rbuf[d.rpos:d.rend]
		i := bytes.IndexByte(chunk, delimiter)
		if i < 0 {
			d.accumulate(chunk)
			d.rpos = d.rend
			continue
		}
		d.accumulate(chunk[:i])
		d.rpos += i + 1
		if p := d.finish(); p != nil {
			return p, nil
		}
	}
}

// accumulate adds encoded bytes to the current frame, switching to discard
// mode as soon as the frame cannot fit the limit.
func (d *Decoder) accumulate(b []byte) {
	if d.discarding {
		d.c.garbage.Add(uint64(len(b)))
		return
	}
	if len(d.frame)+len(b) > d.maxEncoded {
		d.c.oversize.Add(1)
		d.c.garbage.Add(uint64(len(d.frame) + len(b)))
		d.frame = d.frame[:0]
		d.discarding = true
		return
	}
	d.frame = append(d.frame, b...)
}

// finish ends the current frame at a delimiter and returns its payload, or
// nil if there is none (an empty frame between two delimiters is idle fill,
// not an error).
func (d *Decoder) finish() []byte {
	if d.discarding {
		d.discarding = false
		return nil
	}
	enc := d.frame
	d.frame = d.frame[:0]
	if len(enc) == 0 {
		return nil
	}
	p, err := appendUncobs(make([]byte, 0, len(enc)), enc)
	switch {
	case err != nil || len(p) <= crcLen:
		d.c.malformed.Add(1)
	case len(p)-crcLen > d.maxPayload:
		d.c.oversize.Add(1)
	case binary.BigEndian.Uint32(p[len(p)-crcLen:]) != crc32.Checksum(p[:len(p)-crcLen], castagnoli):
		d.c.crc.Add(1)
	default:
		d.c.ok.Add(1)
		return p[: len(p)-crcLen : len(p)-crcLen]
	}
	d.c.garbage.Add(uint64(len(enc)))
	return nil
}

// isTimeout reports whether err means "no data yet" rather than a failure:
// ErrReadTimeout from a Port or Conn, or a passed read deadline.
func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.Is(err, ErrReadTimeout) || (errors.As(err, &t) && t.Timeout())
}
