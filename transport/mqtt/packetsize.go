package mqtt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// The MQTT v5 Maximum Packet Size (§3.1.2.11.4) of a Client: sent in
// CONNECT, so that a conforming broker drops a bigger message for this
// client instead of sending it, and enforced here against a broker that
// ignores it. paho reads a packet by growing a buffer to the Remaining Length
// the fixed header announces (packets.ReadPacket: content.Grow, up to 256
// MiB) before it reads a byte of it, so the bound has to hold before paho
// sees the header: packetGuard reads each fixed header off the connection
// first and hands paho only the packets within the limit.

// Limits of Config.MaxPacketSize, bytes.
const (
	// DefaultMaxPacketSize fits the largest packet edgefence sends, with
	// room to spare. That packet (LargestPacket) is an envelope
	// (fence.MaxEnvelopeSize) or a state report (shadow.DefaultMaxSize),
	// both 65,536, plus 1,024 for a signature outside the payload
	// (fence.MaxAuthSize), plus at most 2,048 of MQTT: fixed header 4,
	// topic 2+len, packet id 2, properties (correlation data 3+64, response
	// topic 3+len, subscription id, expiry) with topics of a 128-byte device
	// id under a prefix of up to 256 bytes (~400 each). 65,536 + 1,024 +
	// 2,048 = 68,608 = LargestPacket; TestLargestPacket measures the real
	// one through paho's encoder (67,428) and gets it through a broker at
	// that limit. The next power of two, with 60 KiB to spare: 128 KiB.
	DefaultMaxPacketSize = 128 << 10

	// LargestPacket is the bound on edgefence's own packets worked out
	// above: the least Maximum Packet Size with which an agent or a device
	// still receives every legitimate message (the floor of the agent's
	// mqtt.max_packet_size).
	LargestPacket = 65_536 + 1_024 + 2_048

	// MinMaxPacketSize is the least Config.MaxPacketSize: a CONNACK or a
	// SUBACK with a reason string must fit.
	MinMaxPacketSize = 512

	// MaxMaxPacketSize is MQTT's largest packet (fixed header 1 + 4, and
	// the largest Remaining Length): as a Config.MaxPacketSize, no bound.
	MaxMaxPacketSize = 1 + 4 + maxPacketLen
)

// ErrPacketTooLarge means the broker sent a packet other than a PUBLISH
// larger than Config.MaxPacketSize: a protocol error (MQTT v5 §4.13), so the
// client sends DISCONNECT 0x95 (packet too large) and reconnects. An
// oversize PUBLISH is dropped without ending the connection.
var ErrPacketTooLarge = errors.New("mqtt: packet too large")

// MQTT v5 packet types and reason codes the guard writes or reads.
const (
	typePublish    = 3
	reasonQuota    = 0x97 // quota exceeded: "an implementation or administrative imposed limit"
	reasonTooLarge = 0x95 // packet too large
	headerPuback   = 0x40
	headerPubrec   = 0x50
	headerDisconn  = 0xE0
)

// oversizeLogEvery is the least time between two log lines about packets
// over the limit; the next line says how many were left out meanwhile.
const oversizeLogEvery = 10 * time.Second

// packetGuard is the connection's Read as paho sees it: it reads each fixed
// header itself and passes a packet through only when it is within limit. A
// bigger PUBLISH is read off the wire and thrown away in io.Discard's small
// pieces (the heap does not grow with it), then acknowledged with reason
// 0x97 (PUBACK for QoS 1, PUBREC for QoS 2) so that the broker does not
// send it again; any other packet that big ends the connection with
// DISCONNECT 0x95. Both are reported to onOversize. Only paho's reading
// goroutine calls Read.
//
// The read that ends a packet's body returns io.EOF with its last bytes.
// paho reads a body with io.CopyN into a bytes.Buffer grown to the body's
// length, and bytes.Buffer.ReadFrom grows the buffer by 512 bytes before
// every read, the one that would only find the end included: 1 KiB more
// for each packet under 512 bytes (a device's ack, PUBACK and state
// report), a tenth of the agent's allocations in a 10,000-device fan-out
// (BENCHMARKS §XX). Told of the end with the last bytes, ReadFrom stops
// there (its io.EOF is the end of what CopyN's LimitedReader lets
// through, not an error: CopyN counts the bytes), and the next Read
// starts the next packet's fixed header as before.
type packetGuard struct {
	r     io.Reader // the connection's own reads
	w     lockedWriter
	limit int
	// onOversize is called for each packet over limit, before it is
	// dropped or the connection is ended.
	onOversize func(oversize)

	hdr  [5]byte
	pend []byte // the fixed header read and not yet returned to paho
	body int    // bytes of the passed packet's body paho has yet to read
}

// lockedWriter writes whole packets between paho's: paho locks a
// sync.Locker connection around each packet it writes.
type lockedWriter interface {
	io.Writer
	sync.Locker
}

// oversize describes a packet over the limit, for the report.
type oversize struct {
	kind  byte   // MQTT packet type
	size  int    // whole packet, bytes
	topic string // PUBLISH: its topic
	qos   byte   // PUBLISH: its QoS
}

func (g *packetGuard) Read(p []byte) (int, error) {
	for len(p) > 0 {
		switch {
		case len(g.pend) > 0:
			n := copy(p, g.pend)
			g.pend = g.pend[n:]
			return n, nil
		case g.body > 0:
			n, err := g.r.Read(p[:min(len(p), g.body)])
			g.body -= n
			if g.body == 0 && err == nil {
				err = io.EOF // the packet's end: see packetGuard
			}
			return n, err
		}
		if err := g.next(); err != nil {
			return 0, err
		}
	}
	return 0, nil
}

// next reads the next fixed header and either queues it for paho (the
// packet is within limit) or drops the packet.
func (g *packetGuard) next() error {
	n, rem, shift := 0, 0, 0
	for {
		// Into g.hdr: a local buffer would escape to the heap through
		// the io.Reader, one allocation per packet.
		if _, err := io.ReadFull(g.r, g.hdr[n:n+1]); err != nil {
			if n > 0 && errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
		n++
		if n == 1 {
			continue // the packet type and flags
		}
		b := g.hdr[n-1]
		rem |= int(b&0x7f) << shift
		if b&0x80 == 0 {
			break
		}
		if shift += 7; shift > 21 {
			return fmt.Errorf("mqtt: malformed packet: Remaining Length longer than 4 bytes")
		}
	}
	if size := n + rem; size > g.limit {
		return g.drop(g.hdr[0], rem, size)
	}
	g.pend, g.body = g.hdr[:n], rem
	return nil
}

// drop reads the body of an oversize packet (rem bytes) and throws it away;
// see packetGuard.
func (g *packetGuard) drop(first byte, rem, size int) error {
	o := oversize{kind: first >> 4, size: size, qos: (first >> 1) & 3}
	if o.kind != typePublish {
		g.onOversize(o)
		g.writePacket(headerDisconn, reasonTooLarge)
		return fmt.Errorf("%w: packet type %d, %d bytes, limit %d", ErrPacketTooLarge, o.kind, size, g.limit)
	}
	// Variable header: topic (2-byte length, then the name), then the
	// packet identifier at QoS 1 and 2.
	var n [2]byte
	if _, err := io.ReadFull(g.r, n[:]); err != nil {
		return unexpected(err)
	}
	topic := make([]byte, binary.BigEndian.Uint16(n[:]))
	head := 2 + len(topic)
	if o.qos > 0 {
		head += 2
	}
	if head > rem {
		return fmt.Errorf("mqtt: malformed PUBLISH: variable header of %d bytes in a body of %d", head, rem)
	}
	if _, err := io.ReadFull(g.r, topic); err != nil {
		return unexpected(err)
	}
	o.topic = string(topic)
	var id [2]byte
	if o.qos > 0 {
		if _, err := io.ReadFull(g.r, id[:]); err != nil {
			return unexpected(err)
		}
	}
	g.onOversize(o)
	if _, err := io.CopyN(io.Discard, g.r, int64(rem-head)); err != nil {
		return unexpected(err)
	}
	switch o.qos {
	case 1:
		g.writePacket(headerPuback, id[0], id[1], reasonQuota)
	case 2:
		g.writePacket(headerPubrec, id[0], id[1], reasonQuota)
	}
	return nil
}

// writePacket writes a packet of fixed header first and a short body (at
// most 127 bytes), whole, between paho's. An error is left to paho's next
// read or write to find.
func (g *packetGuard) writePacket(first byte, body ...byte) {
	g.w.Lock()
	defer g.w.Unlock()
	_, _ = g.w.Write(append([]byte{first, byte(len(body))}, body...))
}

// unexpected turns an EOF inside a packet into io.ErrUnexpectedEOF.
func unexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// oversizeLog rate-limits the log lines about packets over the limit.
type oversizeLog struct {
	next       atomic.Int64  // UnixNano before which no line is logged
	suppressed atomic.Uint64 // packets not logged since the last line
}

// packetTooLarge counts and logs (rate-limited) a packet over the limit.
func (c *Client) packetTooLarge(o oversize) {
	c.oversize.Add(1)
	l, now := &c.oversizeLog, time.Now().UnixNano()
	if next := l.next.Load(); now < next || !l.next.CompareAndSwap(next, now+int64(oversizeLogEvery)) {
		l.suppressed.Add(1)
		return
	}
	suppressed := l.suppressed.Swap(0)
	attrs := []any{"bytes", o.size, "limit", c.cfg.MaxPacketSize, "suppressed", suppressed}
	if o.kind != typePublish {
		c.log.Warn("mqtt broker sent a packet over the maximum packet size; disconnecting", append(attrs, "packet_type", o.kind)...)
		return
	}
	attrs = append(attrs, "topic", shorten(o.topic), "qos", o.qos)
	c.log.Warn("mqtt message over the maximum packet size; dropped", attrs...)
}
