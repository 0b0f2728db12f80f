package mqtt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	pahopackets "github.com/eclipse/paho.golang/packets"
	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/shadow"
)

// publishHeader is the start of a PUBLISH with no properties whose payload
// (payload bytes) follows: fixed header, topic, packet id (QoS 1, 2),
// property length 0.
func publishHeader(topic string, qos byte, id uint16, payload int) []byte {
	var vh []byte
	vh = binary.BigEndian.AppendUint16(vh, uint16(len(topic)))
	vh = append(vh, topic...)
	if qos > 0 {
		vh = binary.BigEndian.AppendUint16(vh, id)
	}
	vh = append(vh, 0) // properties: none
	return append(fixedHeader(0x30|qos<<1, len(vh)+payload), vh...)
}

// fixedHeader encodes a fixed header: the first byte and the Remaining
// Length.
func fixedHeader(first byte, rem int) []byte {
	h := []byte{first}
	for {
		b := byte(rem % 128)
		if rem /= 128; rem > 0 {
			b |= 0x80
		}
		h = append(h, b)
		if rem == 0 {
			return h
		}
	}
}

// zeros is a stream of n zero bytes, made as they are read.
type zeros struct{ n int64 }

func (z *zeros) Read(p []byte) (int, error) {
	if z.n == 0 {
		return 0, io.EOF
	}
	n := int(min(int64(len(p)), z.n))
	clear(p[:n])
	z.n -= int64(n)
	return n, nil
}

// sink records what the guard writes.
type sink struct {
	sync.Mutex
	bytes.Buffer
}

// newGuard returns a guard over r with limit, the writes it makes, and the
// oversize packets it reports.
func newGuard(r io.Reader, limit int) (*packetGuard, *sink, *[]oversize) {
	w, seen := &sink{}, &[]oversize{}
	return &packetGuard{r: r, w: w, limit: limit, onOversize: func(o oversize) { *seen = append(*seen, o) }}, w, seen
}

// smallPublish is a whole QoS 1 PUBLISH of a few bytes.
func smallPublish(t *testing.T) []byte {
	t.Helper()
	var b bytes.Buffer
	cp := &pahopackets.ControlPacket{FixedHeader: pahopackets.FixedHeader{Type: pahopackets.PUBLISH, Flags: 2},
		Content: &pahopackets.Publish{Topic: "after", QoS: 1, PacketID: 9, Payload: []byte("ok"), Properties: &pahopackets.Properties{}}}
	if _, err := cp.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestPacketGuardDropsOversizePublish: paho reads a packet by allocating its
// Remaining Length up front; the guard reads a too-big PUBLISH off the
// stream and throws it away, acknowledges it with reason 0x97 at QoS 1 and
// 2 (so that the broker does not send it again), reports it, and hands paho
// the next packet. 200 MB go through without the heap growing by more than
// a MiB.
func TestPacketGuardDropsOversizePublish(t *testing.T) {
	for _, tc := range []struct {
		name    string
		qos     byte
		payload int64
		ack     []byte
	}{
		{"qos0", 0, 10 << 10, nil},
		{"qos1 200MB", 1, 200 << 20, []byte{0x40, 3, 0x12, 0x34, 0x97}},
		{"qos2", 2, 10 << 10, []byte{0x50, 3, 0x12, 0x34, 0x97}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next := smallPublish(t)
			in := io.MultiReader(bytes.NewReader(publishHeader("big/topic", tc.qos, 0x1234, int(tc.payload))),
				&zeros{tc.payload}, bytes.NewReader(next))
			g, w, seen := newGuard(in, 4<<10)

			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			cp, err := pahopackets.ReadPacket(g)
			runtime.ReadMemStats(&after)
			if err != nil {
				t.Fatal(err)
			}
			if p, ok := cp.Content.(*pahopackets.Publish); !ok || p.Topic != "after" || string(p.Payload) != "ok" {
				t.Fatalf("paho read %v, want the small PUBLISH after the big one", cp)
			}
			if !bytes.Equal(w.Bytes(), tc.ack) {
				t.Errorf("guard wrote % x, want % x", w.Bytes(), tc.ack)
			}
			if len(*seen) != 1 || (*seen)[0].topic != "big/topic" || (*seen)[0].qos != tc.qos || (*seen)[0].kind != typePublish {
				t.Errorf("reported %+v", *seen)
			}
			if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
				t.Errorf("reading past a %d-byte PUBLISH allocated %d bytes", tc.payload, grew)
			}
			if _, err := pahopackets.ReadPacket(g); !errors.Is(err, io.EOF) {
				t.Errorf("after the last packet: %v, want EOF", err)
			}
		})
	}
}

// TestPacketGuardPassesWithinLimit: packets up to the limit reach paho byte
// for byte, whatever the reads' sizes.
func TestPacketGuardPassesWithinLimit(t *testing.T) {
	const limit = 1 << 10
	var stream []byte
	for _, n := range []int{0, 1, 100, 127, 128, 500} {
		stream = append(stream, publishHeader("t", 1, uint16(n), n)...)
		stream = append(stream, bytes.Repeat([]byte{byte(n)}, n)...)
	}
	// Exactly limit bytes: 7 of header (type, Remaining Length in 2, topic
	// "t" in 3, no properties) and the payload.
	stream = append(stream, publishHeader("t", 0, 0, limit-7)...)
	stream = append(stream, make([]byte, limit-7)...)
	stream = append(stream, 0xC0, 0) // PINGREQ: no body
	for _, chunk := range []int{1, 3, 4096} {
		g, w, seen := newGuard(bytes.NewReader(stream), limit)
		var out []byte
		buf := make([]byte, chunk)
		for {
			n, err := g.Read(buf)
			out = append(out, buf[:n]...)
			if err != nil && (n == 0 || !errors.Is(err, io.EOF)) { // io.EOF with bytes: a body's end
				break
			}
		}
		if !bytes.Equal(out, stream) || w.Len() != 0 || len(*seen) != 0 {
			t.Errorf("chunk %d: passed %d of %d bytes, wrote %d, reported %v", chunk, len(out), len(stream), w.Len(), *seen)
		}
	}
}

// TestPacketGuardEndsBodies: the read that ends a packet's body says so
// (io.EOF with its last bytes), and paho reads packet after packet through
// the guard intact, the first byte of each after the io.EOF of the one
// before; a bytes.Buffer grown to the body takes no second growth.
func TestPacketGuardEndsBodies(t *testing.T) {
	var stream []byte
	sizes := []int{0, 1, 100, 300, 5000}
	for _, n := range sizes {
		stream = append(stream, publishHeader("t", 1, uint16(n+1), n)...)
		stream = append(stream, bytes.Repeat([]byte{byte(n)}, n)...)
	}
	stream = append(stream, 0x40, 2, 0x12, 0x34) // PUBACK
	g, _, _ := newGuard(bytes.NewReader(stream), 1<<20)
	for _, n := range sizes {
		cp, err := pahopackets.ReadPacket(g)
		if err != nil {
			t.Fatalf("PUBLISH of %d bytes: %v", n, err)
		}
		p, ok := cp.Content.(*pahopackets.Publish)
		if !ok || p.PacketID != uint16(n+1) || !bytes.Equal(p.Payload, bytes.Repeat([]byte{byte(n)}, n)) {
			t.Fatalf("PUBLISH of %d bytes read as %+v", n, cp.Content)
		}
	}
	if cp, err := pahopackets.ReadPacket(g); err != nil || cp.Type != pahopackets.PUBACK || cp.Content.(*pahopackets.Puback).PacketID != 0x1234 {
		t.Fatalf("PUBACK read as %v, %v", cp, err)
	}
	if _, err := pahopackets.ReadPacket(g); !errors.Is(err, io.EOF) {
		t.Errorf("after the last packet: %v, want EOF", err)
	}

	// A 106-byte body read as paho reads it, through the guard and through
	// a reader that does not tell the end: one growth of the Buffer fewer.
	one := append(publishHeader("t", 1, 7, 100), make([]byte, 100)...)
	r := bytes.NewReader(one)
	g, _, _ = newGuard(r, 1<<20)
	body := func(src io.Reader) {
		var b bytes.Buffer
		b.Grow(106)
		if _, err := io.CopyN(&b, src, 106); err != nil || b.Len() != 106 {
			t.Fatalf("body: %d bytes, %v", b.Len(), err)
		}
	}
	hdr := make([]byte, 2) // type, Remaining Length
	guarded := testing.AllocsPerRun(100, func() {
		r.Reset(one)
		g.pend, g.body = nil, 0
		if _, err := io.ReadFull(g, hdr); err != nil {
			t.Fatal(err)
		}
		body(g)
	})
	plain := testing.AllocsPerRun(100, func() {
		r.Reset(one[2:])
		body(r)
	})
	if guarded >= plain {
		t.Errorf("a 106-byte body read into a bytes.Buffer: %v allocations through the guard, %v without it; want fewer", guarded, plain)
	}
}

// TestPacketGuardRefuses: any other packet over the limit is a protocol
// error: DISCONNECT 0x95 and ErrPacketTooLarge; malformed headers are
// errors, never a panic, and leave nothing written.
func TestPacketGuardRefuses(t *testing.T) {
	suback := append(fixedHeader(0x90, 8<<10), make([]byte, 8<<10)...)
	for _, tc := range []struct {
		name   string
		in     []byte
		want   error
		writes []byte
	}{
		{"big suback", suback, ErrPacketTooLarge, []byte{0xE0, 1, 0x95}},
		{"5-byte remaining length", []byte{0x30, 0xff, 0xff, 0xff, 0xff, 0x01}, nil, nil},
		{"topic longer than the packet", append(fixedHeader(0x32, 5<<10), 0xff, 0xff), nil, nil},
		{"cut in the header", []byte{0x30, 0x80}, io.ErrUnexpectedEOF, nil},
		{"cut in the topic", append(publishHeader("abc", 1, 1, 8<<10)[:6], 'a'), io.ErrUnexpectedEOF, nil},
		{"cut in the payload", publishHeader("abc", 1, 1, 8<<10), io.ErrUnexpectedEOF, nil},
	} {
		g, w, _ := newGuard(bytes.NewReader(tc.in), 4<<10)
		_, err := pahopackets.ReadPacket(g)
		if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
		if !bytes.Equal(w.Bytes(), tc.writes) {
			t.Errorf("%s: wrote % x, want % x", tc.name, w.Bytes(), tc.writes)
		}
	}
}

// FuzzPacketGuard: whatever the broker sends, the guard does not panic and
// passes on only whole packets within the limit.
func FuzzPacketGuard(f *testing.F) {
	f.Add(publishHeader("a/b", 1, 7, 0), uint16(64))
	f.Add(append(publishHeader("a/b", 2, 7, 100), make([]byte, 100)...), uint16(64))
	f.Add([]byte{0xC0, 0, 0x30, 0xff, 0xff, 0xff, 0xff, 0x01}, uint16(512))
	f.Add(append(fixedHeader(0x90, 300), make([]byte, 300)...), uint16(100))
	f.Fuzz(func(t *testing.T, in []byte, limit uint16) {
		g, _, _ := newGuard(bytes.NewReader(in), max(int(limit), 2))
		out, _ := io.ReadAll(g)
		// out is whole packets, each within the limit, and perhaps the
		// first part of one more (the input ended).
		for len(out) > 0 {
			rem, n, ok := 0, 1, false
			for shift := 0; n < len(out) && n <= 4; shift += 7 {
				rem |= int(out[n]&0x7f) << shift
				n++
				if out[n-1]&0x80 == 0 {
					ok = true
					break
				}
			}
			if !ok {
				t.Fatalf("guard passed a bad fixed header % x", out[:n])
			}
			if n+rem > max(int(limit), 2) {
				t.Fatalf("guard passed a %d-byte packet, limit %d", n+rem, limit)
			}
			out = out[min(n+rem, len(out)):]
		}
	})
}

// forgetMaxPacketSize makes mochi forget the Maximum Packet Size a client
// sent in CONNECT, so that it sends packets of any size: a broker that
// ignores the limit. OnConnect runs on the client's read goroutine right
// after mochi parsed the CONNECT, before the CONNACK.
type forgetMaxPacketSize struct{ mochi.HookBase }

func (h *forgetMaxPacketSize) ID() string           { return "forget-max-packet-size" }
func (h *forgetMaxPacketSize) Provides(b byte) bool { return b == mochi.OnConnect }
func (h *forgetMaxPacketSize) OnConnect(cl *mochi.Client, _ packets.Packet) error {
	cl.Properties.Props.MaximumPacketSize = 0
	return nil
}

// TestMaxPacketSizeInConnect: the limit goes in every CONNECT.
func TestMaxPacketSizeInConnect(t *testing.T) {
	b := startBroker(t)
	for id, tc := range map[string]struct{ set, want int }{
		"mps-default": {0, DefaultMaxPacketSize},
		"mps-set":     {LargestPacket, LargestPacket},
	} {
		c := dial(t, b.url(), id, func(c *Config) { c.MaxPacketSize = tc.set })
		if err := c.AwaitConnection(timeout(t, 5*time.Second)); err != nil {
			t.Fatal(err)
		}
		b.mu.Lock()
		cl, ok := b.srv.Clients.Get(id)
		b.mu.Unlock()
		if !ok || cl.Properties.Props.MaximumPacketSize != uint32(tc.want) {
			t.Errorf("%s: broker has client %v with Maximum Packet Size %d, want %d", id, ok, cl.Properties.Props.MaximumPacketSize, tc.want)
		}
	}
}

// TestOversizeMessage: a 1 MiB message to a client with the default limit
// (128 KiB). mochi honours the client's Maximum Packet Size and drops it;
// mochi made to forget it sends it, and the client drops it unread, counts
// it and acknowledges it. Either way the client stays connected and the
// next message arrives.
func TestOversizeMessage(t *testing.T) {
	for _, tc := range []struct {
		name    string
		hooks   []mochi.Hook
		counted uint64
	}{
		{"broker drops", nil, 0},
		{"client drops", []mochi.Hook{new(forgetMaxPacketSize)}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := startBroker(t, tc.hooks...)
			got := make(chan Message, 2)
			sub := dial(t, b.url(), "os-sub", func(c *Config) {
				c.Subscriptions = []Subscription{{Filter: "os/#", Handler: func(m Message) { got <- m }}}
			})
			if err := sub.AwaitSubscribed(timeout(t, 5*time.Second)); err != nil {
				t.Fatal(err)
			}
			pub := dial(t, b.url(), "os-pub")
			if err := pub.AwaitConnection(timeout(t, 5*time.Second)); err != nil {
				t.Fatal(err)
			}
			for _, m := range []Message{{Topic: "os/big", Payload: make([]byte, 1<<20)}, {Topic: "os/small", Payload: []byte("ok")}} {
				if err := pub.Publish(timeout(t, 10*time.Second), m); err != nil {
					t.Fatal(err)
				}
			}
			select {
			case m := <-got:
				if m.Topic != "os/small" {
					t.Fatalf("received %s (%d bytes) first, want os/small", m.Topic, len(m.Payload))
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the message after the big one did not arrive")
			}
			if s := sub.Stats(); s.PacketsOversize != tc.counted || s.Received != 1 || s.Reconnects != 0 || !s.Connected {
				t.Errorf("subscriber stats %+v, want %d oversize, 1 received, connected, no reconnect", s, tc.counted)
			}
			if tc.counted > 0 { // the guard's PUBACK released the broker's in-flight slot
				waitFor(t, "the broker's in-flight messages for os-sub to drain", 10*time.Second, func() bool {
					b.mu.Lock()
					defer b.mu.Unlock()
					cl, ok := b.srv.Clients.Get("os-sub")
					return ok && cl.State.Inflight.Len() == 0
				})
			}
		})
	}
}

// TestLargestPacket measures the largest packet edgefence sends: a state
// report (or an envelope) at its size limit with room for a signature, on
// the topic of a device id at its length limit under a 256-byte prefix,
// with correlation data (a command id at its limit) and a response topic.
// It fits LargestPacket, and a client with that Maximum Packet Size gets
// it through mochi, which drops anything bigger than the client's limit.
func TestLargestPacket(t *testing.T) {
	topics := Topics{Prefix: strings.Repeat("p", 256)}
	dev := strings.Repeat("d", fence.MaxDeviceIDLen)
	m := Message{
		Topic:           topics.State(dev),
		Payload:         make([]byte, max(fence.MaxEnvelopeSize, shadow.DefaultMaxSize)+fence.MaxAuthSize),
		CorrelationData: []byte(strings.Repeat("i", fence.MaxIDLen)),
		ResponseTopic:   topics.Ack(dev),
	}
	var wire bytes.Buffer
	cp := &pahopackets.ControlPacket{FixedHeader: pahopackets.FixedHeader{Type: pahopackets.PUBLISH, Flags: 2},
		Content: &pahopackets.Publish{Topic: m.Topic, QoS: 1, PacketID: 1, Payload: m.Payload,
			Properties: &pahopackets.Properties{CorrelationData: m.CorrelationData, ResponseTopic: m.ResponseTopic}}}
	if _, err := cp.WriteTo(&wire); err != nil {
		t.Fatal(err)
	}
	t.Logf("largest packet: %d bytes (LargestPacket %d, DefaultMaxPacketSize %d)", wire.Len(), LargestPacket, DefaultMaxPacketSize)
	if wire.Len() > LargestPacket || LargestPacket > DefaultMaxPacketSize {
		t.Fatalf("largest packet %d bytes, LargestPacket %d, default %d", wire.Len(), LargestPacket, DefaultMaxPacketSize)
	}

	b := startBroker(t)
	got := make(chan Message, 1)
	sub := dial(t, b.url(), "lp-sub", func(c *Config) {
		c.MaxPacketSize = LargestPacket
		c.Subscriptions = []Subscription{{Filter: topics.State("+"), Handler: func(m Message) { got <- m }}}
	})
	if err := sub.AwaitSubscribed(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	pub := dial(t, b.url(), "lp-pub")
	if err := pub.AwaitConnection(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(timeout(t, 10*time.Second), m); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-got:
		if len(r.Payload) != len(m.Payload) || r.ResponseTopic != m.ResponseTopic {
			t.Errorf("received %d bytes, response topic %q", len(r.Payload), r.ResponseTopic)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the largest legitimate message did not arrive (oversize %d)", sub.Stats().PacketsOversize)
	}
}

// TestOversizeCountedAndLogged: every packet over the limit is counted, one
// log line per oversizeLogEvery says so, the next one how many it left out.
func TestOversizeCountedAndLogged(t *testing.T) {
	var logged bytes.Buffer
	c := &Client{cfg: Config{MaxPacketSize: 4 << 10}, log: slog.New(slog.NewTextHandler(&logged, nil))}
	for range 3 {
		c.packetTooLarge(oversize{kind: typePublish, size: 1 << 20, topic: "big", qos: 1})
	}
	c.oversizeLog.next.Store(0) // oversizeLogEvery has passed
	c.packetTooLarge(oversize{kind: 9, size: 1 << 20})
	lines := strings.Split(strings.TrimSpace(logged.String()), "\n")
	if c.Stats().PacketsOversize != 4 || len(lines) != 2 ||
		!strings.Contains(lines[0], "dropped") || !strings.Contains(lines[0], "topic=big") || !strings.Contains(lines[0], "suppressed=0") ||
		!strings.Contains(lines[1], "disconnecting") || !strings.Contains(lines[1], "suppressed=2") {
		t.Errorf("%d counted, logged:\n%s", c.Stats().PacketsOversize, logged.String())
	}
}
