package legacy

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/edgefence/edgefence/internal/hrtimer"
	"github.com/edgefence/edgefence/transport/modbus"
)

// recPort is a port that records what the slave answers, write by write.
type recPort struct{ writes *[][]byte }

func (p recPort) Read([]byte) (int, error) { return 0, io.EOF }

func (p recPort) Write(b []byte) (int, error) {
	*p.writes = append(*p.writes, slices.Clone(b))
	return len(b), nil
}

func (recPort) SetReadDeadline(time.Time) error { return nil }

// feed gives chunks to a fresh framer for unit 1 and returns its answers
// and the server, for its leftovers and counters.
func feed(chunks ...[]byte) ([][]byte, *rtuServer) {
	var out [][]byte
	r := &rtuServer{s: &Slave{Units: Units{1: NewRegisters("u1", 8, nil)}}, port: recPort{&out}, log: slog.New(slog.DiscardHandler), hr: hrtimer.New()}
	defer r.hr.Close()
	for _, c := range chunks {
		r.pending = append(r.pending, c...)
		r.frames(context.Background())
	}
	return out, r
}

func rtu(unit byte, pdu ...byte) []byte {
	f, _ := modbus.EncodeRTU(unit, pdu)
	return f
}

var (
	readReq = rtu(1, modbus.FuncReadHolding, 0, 3, 0, 1)
	readRsp = rtu(1, modbus.FuncReadHolding, 2, 0, 0)
)

// Garbage before a good frame, in one chunk or several: the good frame is
// answered, the garbage counted once.
var resyncCases = []struct {
	name   string
	chunks [][]byte
}{
	{"noise", [][]byte{{0xff, 0x03, 0x00}, readReq}},
	{"noise, one chunk", [][]byte{append([]byte{0xff, 0x03, 0x00}, readReq...)}},
	{"a long frame's start", [][]byte{append([]byte{1, modbus.FuncWriteMultiple, 0, 0, 0, 1, 2, 0}, readReq...)}},
	{"byte count beyond a frame", [][]byte{{1, modbus.FuncWriteCoils, 0, 0, 0, 1, 255}, readReq}},
	{"another unit's answer", [][]byte{rtu(2, modbus.FuncReadHolding, 2, 0, 0), readReq[:3], readReq[3:]}},
}

func TestFramesResync(t *testing.T) {
	for _, c := range resyncCases {
		out, r := feed(c.chunks...)
		if len(out) != 1 || !slices.Equal(out[0], readRsp) || len(r.pending) != 0 || r.s.Stats().Bad != 1 {
			t.Errorf("%s: answered % x, left % x, stats %+v", c.name, out, r.pending, r.s.Stats())
		}
	}
}

// FuzzFrames: any bytes, in any chunks, never panic; the slave answers
// only with whole frames of good CRC, and holds at most a frame's worth.
func FuzzFrames(f *testing.F) {
	for _, c := range resyncCases {
		f.Add(bytes.Join(c.chunks, nil), uint8(3))
	}
	f.Add(rtu(0, modbus.FuncWriteSingle, 0, 1, 0, 2), uint8(1))
	f.Add(rtu(1, modbus.FuncWriteMultiple, 0, 1, 0, 1, 2, 0, 9), uint8(0))
	f.Fuzz(func(t *testing.T, b []byte, cut uint8) {
		var chunks [][]byte
		for n := int(cut)%16 + 1; len(b) > 0; b = b[min(n, len(b)):] {
			chunks = append(chunks, b[:min(n, len(b))])
		}
		out, r := feed(chunks...)
		for _, a := range out {
			if _, err := modbus.DecodeRTU(a, 1); err != nil {
				t.Fatalf("answer % x: %v", a, err)
			}
		}
		if len(r.pending) > 2*modbus.MaxRTUFrame {
			t.Fatalf("%d bytes held", len(r.pending))
		}
	})
}
