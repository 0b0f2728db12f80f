package serial

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"testing"
	"time"
)

// Frame encode and decode cost, per frame.

var benchSizes = []int{16, 256, 1024}

func benchPayload(n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(i * 7) // a zero every 256 bytes or so
	}
	return p
}

func BenchmarkEncode(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("payload=%d", n), func(b *testing.B) {
			p := benchPayload(n)
			b.SetBytes(int64(n))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Encode(p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// cycleReader returns buf over and over.
type cycleReader struct {
	buf []byte
	off int
}

func (r *cycleReader) Read(p []byte) (int, error) {
	n := copy(p, r.buf[r.off:])
	r.off = (r.off + n) % len(r.buf)
	return n, nil
}

func BenchmarkDecode(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("payload=%d", n), func(b *testing.B) {
			f, err := Encode(benchPayload(n))
			if err != nil {
				b.Fatal(err)
			}
			d, err := NewDecoder(&cycleReader{buf: bytes.Repeat(f, 64)}, n)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(n))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := d.Next(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// Command throughput over a pty: a Link over a Conn (the gateway's
// production path) to a Responder on the pty master, one command at a
// time. A pty ignores the baud rate, so the line's capacity at 115200 8N1
// is computed from the bytes each command puts on the wire (request and
// response frames, delimiters included) at 10 bits a byte, and
// line_rate_fraction is commands/s over that capacity: above 1 means the
// software would saturate a real 115200 line.
//
// BenchmarkLinkDo runs the pty at full speed. BenchmarkLinkDoPaced also
// holds every frame for its transmission time at 115200 baud, each
// direction on its own clock, so it measures what a real line would give:
// the fraction lost is the turnaround (wake-ups, decoding, the handler)
// between one frame's last byte and the next frame's first.

const lineBaud = 115200

func BenchmarkLinkDo(b *testing.B) {
	for _, n := range []int{8, 64} {
		b.Run(fmt.Sprintf("body=%d", n), func(b *testing.B) { benchLink(b, n, false) })
	}
}

func BenchmarkLinkDoPaced(b *testing.B) {
	for _, n := range []int{8, 64} {
		b.Run(fmt.Sprintf("body=%d", n), func(b *testing.B) { benchLink(b, n, true) })
	}
}

func benchLink(b *testing.B, bodyLen int, paced bool) {
	a := newAdapter(b)
	m := a.Plug()
	handler := func(req []byte) []byte { return req } // response as long as the request
	var dev io.ReadWriter = m
	if paced {
		dev = &pacedFile{File: m}
	}
	startDevice(b, &Responder{Handler: handler}, dev)
	conn, err := OpenConn(ConnConfig{Port: PortConfig{Path: a.Path}})
	if err != nil {
		b.Fatal(err)
	}
	var rwc io.ReadWriteCloser = conn
	if paced {
		rwc = &pacedConn{Conn: conn}
	}
	l, err := NewLink(rwc, LinkConfig{Timeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()

	req := bytes.Repeat([]byte{0x5A}, bodyLen)
	ctx := context.Background()
	f, _ := encodeMessage(header{typ: typeRequest}, req)
	wire := 2 * len(f) // the response has the same length
	for b.Loop() {
		if _, err := l.Do(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
	cmds := float64(b.N) / b.Elapsed().Seconds()
	capacity := float64(lineBaud) / float64(10*wire)
	b.ReportMetric(cmds, "cmds/s")
	b.ReportMetric(float64(wire), "wire_bytes/cmd")
	b.ReportMetric(cmds/capacity, "line_rate_fraction")
	if s := l.Stats(); s.Retries != 0 {
		b.Errorf("%d retries", s.Retries)
	}
}

// lineClock paces one direction of a serial line: a write of n bytes
// completes when the line has shifted them out at 10 bits a byte.
type lineClock struct {
	free time.Time // when the line finishes what was written before
}

func (c *lineClock) transmit(n int) {
	start := time.Now()
	if c.free.After(start) {
		start = c.free
	}
	c.free = start.Add(time.Duration(n) * 10 * time.Second / lineBaud)
	// Sleep most of the way, then spin: time.Sleep overshoots by a few
	// hundred microseconds, about a fifth of a short frame.
	if d := time.Until(c.free) - time.Millisecond; d > 0 {
		time.Sleep(d)
	}
	for time.Now().Before(c.free) {
		runtime.Gosched()
	}
}

type pacedConn struct {
	*Conn
	line lineClock
}

func (p *pacedConn) Write(b []byte) (int, error) {
	p.line.transmit(len(b))
	return p.Conn.Write(b)
}

type pacedFile struct {
	*os.File
	line lineClock
}

func (p *pacedFile) Write(b []byte) (int, error) {
	p.line.transmit(len(b))
	return p.File.Write(b)
}
