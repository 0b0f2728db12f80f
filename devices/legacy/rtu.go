package legacy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/edgefence/edgefence/internal/hrtimer"
	"github.com/edgefence/edgefence/transport/modbus"
)

// MinSilence is the shortest silence inside a frame that drops it. The
// standard's t3.5 (modbus.TimingFor) is under 2 ms above 19,200 baud, and
// a pty on a busy machine delivers one frame in bursts further apart than
// that (tens of milliseconds were seen with the load at 8 on 2 cores): a
// slave that dropped frames on scheduling gaps would measure the machine,
// not the master. Frames are delimited by their length, so the silence
// only decides when an unfinished frame is given up; it matches the
// silence transport/modbus's bus waits for after a bad answer.
const MinSilence = 100 * time.Millisecond

// idlePoll bounds a read between frames: a missed cancel costs at most
// this long.
const idlePoll = time.Second

// Port is a serial port whose reads can time out: a tty opened with
// os.OpenFile, or a pty master from internal/sandbox.OpenPty. A pty master
// from creack/pty's Open is not one (its Fd call leaves it blocking):
// ServeRTU refuses it with ErrBlockingPort.
type Port interface {
	io.ReadWriter
	SetReadDeadline(time.Time) error
}

// ServeRTU answers Modbus RTU requests on port until ctx ends (nil) or the
// port fails. A request frame is delimited by its length, known from the
// function code (0x0F and 0x10 from their byte count); the line going
// silent for max(t3.5, MinSilence) inside a frame drops it. A frame that
// fails its CRC is dropped, and the slave resynchronises on the next
// whole frame with a good CRC, at any offset, or after a silence. Each answer leaves t3.5 after the
// request's last byte arrived; a frame to unit 0 is applied by every unit
// and answered by none; frames to other units are ignored.
func (s *Slave) ServeRTU(ctx context.Context, port Port) error {
	baud := s.Baud
	if baud == 0 {
		baud = 19200
	}
	t, err := modbus.TimingFor(baud)
	if err != nil {
		return fmt.Errorf("legacy: rtu: %w", err)
	}
	if err := checkDeadlines(port); err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { _ = port.SetReadDeadline(time.Unix(1, 0)) })
	defer port.SetReadDeadline(time.Time{})
	defer stop()
	r := &rtuServer{s: s, port: port, log: s.logger(), t35: t.T35, silence: max(t.T35, MinSilence), hr: hrtimer.New()}
	defer r.hr.Close()
	if r.hr.Err != nil {
		r.log.Warn("modbus slave: turnarounds timed by Go's timers, up to 1 ms late", "err", r.hr.Err)
	}
	return r.run(ctx)
}

// checkDeadlines refuses a file whose descriptor is blocking: Go's poller
// does not wait on it, so its read deadlines are silently ignored.
func checkDeadlines(port Port) error {
	sc, ok := port.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return fmt.Errorf("legacy: rtu port: %w", err)
	}
	var flags int
	var ferr error
	if err := rc.Control(func(fd uintptr) { flags, ferr = unix.FcntlInt(fd, unix.F_GETFL, 0) }); err != nil {
		return fmt.Errorf("legacy: rtu port: %w", err)
	}
	if ferr != nil {
		return fmt.Errorf("legacy: rtu port: %w", ferr)
	}
	if flags&unix.O_NONBLOCK == 0 {
		return ErrBlockingPort
	}
	return nil
}

// rtuServer is one ServeRTU's state.
type rtuServer struct {
	s            *Slave
	port         Port
	log          *slog.Logger
	t35, silence time.Duration
	hr           *hrtimer.Timer // times the turnaround: t3.5 to the byte

	pending []byte    // bytes heard, not yet a whole frame
	heard   time.Time // when the last read returned: the end of a frame it completes
	resync  bool      // a bad frame was dropped: looking for the next good one
}

func (r *rtuServer) run(ctx context.Context) error {
	buf := make([]byte, modbus.MaxRTUFrame)
	for {
		wait := idlePoll
		if len(r.pending) > 0 {
			wait = r.silence
		}
		if err := r.port.SetReadDeadline(time.Now().Add(wait)); err != nil {
			return fmt.Errorf("legacy: rtu: %w", err)
		}
		if ctx.Err() != nil { // checked after the deadline is set: a cancel cannot be overwritten
			return nil
		}
		n, err := r.port.Read(buf)
		r.heard = time.Now()
		if ctx.Err() != nil {
			return nil
		}
		if n > 0 {
			r.pending = append(r.pending, buf[:n]...)
			r.frames(ctx)
		}
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded) && r.pendingInput():
			// Bytes waiting: the deadline passed while this goroutine
			// was not running, not while the line was silent.
		case errors.Is(err, os.ErrDeadlineExceeded):
			if len(r.pending) > 0 && !r.resync {
				r.s.dropped(r.log, "silence inside a frame", r.pending)
			}
			r.pending, r.resync = r.pending[:0], false
		case err != nil:
			return fmt.Errorf("legacy: rtu read: %w", err)
		}
	}
}

// pendingInput reports whether the port has bytes waiting to be read (a
// tty's TIOCINQ); false if it cannot tell.
func (r *rtuServer) pendingInput() bool {
	sc, ok := r.port.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	n := 0
	_ = rc.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.TIOCINQ) })
	return n > 0
}

// frames serves every whole frame in pending. After a bad frame it looks
// for the next whole frame with a good CRC at any offset (an unfinished
// one at an early offset, perhaps a bogus length, must not hold back a
// good one behind it), and keeps at most a frame's worth meanwhile.
func (r *rtuServer) frames(ctx context.Context) {
	b := r.pending
	for len(b) > 0 {
		if r.resync {
			i := findFrame(b)
			if i < 0 {
				b = b[max(0, len(b)-modbus.MaxRTUFrame):]
				break
			}
			b, r.resync = b[i:], false
		}
		frame, rest, bad := splitRTU(b)
		if bad {
			r.s.dropped(r.log, "CRC error or malformed frame", b[:min(len(b), modbus.MaxRTUFrame)])
			r.resync = true
			continue
		}
		if frame == nil {
			break
		}
		r.serve(ctx, frame)
		b = rest
	}
	r.pending = r.pending[:copy(r.pending, b)]
}

// findFrame returns the offset of the first whole request frame with a
// good CRC in b, or -1.
func findFrame(b []byte) int {
	for i := range b {
		if f, _, _ := splitRTU(b[i:]); f != nil {
			return i
		}
	}
	return -1
}

// splitRTU finds the request frame at the start of b by its length. It
// returns the frame and the bytes after it; nothing if b holds only part
// of one; bad if b does not start with a valid frame.
func splitRTU(b []byte) (frame, rest []byte, bad bool) {
	size := rtuRequestSize(b)
	switch {
	case size > modbus.MaxRTUFrame:
		return nil, nil, true
	case size == 0 || len(b) < size:
		return nil, nil, false
	}
	if binary.LittleEndian.Uint16(b[size-2:]) != modbus.CRC16(b[:size-2]) {
		return nil, nil, true
	}
	return b[:size], b[size:], false
}

// rtuRequestSize is the length of the request frame at the start of b
// (unit, PDU, CRC), or 0 if it cannot be known yet.
func rtuRequestSize(b []byte) int {
	if len(b) < 2 {
		return 0
	}
	switch b[1] {
	case modbus.FuncWriteCoils, modbus.FuncWriteMultiple: // unit, fc, addr, count, byte count, data, CRC
		if len(b) < 7 {
			return 0
		}
		return 9 + int(b[6])
	case 0x07, 0x0B, 0x0C, 0x11: // no data: exception status, comm event counter and log, server id
		return 4
	case 0x16: // mask write register
		return 10
	case 0x17: // read/write multiple registers
		if len(b) < 11 {
			return 0
		}
		return 13 + int(b[10])
	default: // 0x01..0x06 and anything else: 4 bytes of address and count or value
		return 8
	}
}

// serve answers one frame with a good CRC, t3.5 after it was heard.
func (r *rtuServer) serve(ctx context.Context, frame []byte) {
	unit, pdu := frame[0], frame[1:len(frame)-2]
	d := r.s.Units[unit]
	switch {
	case unit == modbus.UnitBroadcast:
		r.s.broadcast.Add(1)
		for _, d := range r.s.Units {
			d.Handle(pdu)
		}
		return
	case d == nil:
		r.s.foreign.Add(1)
		return
	}
	r.s.requests.Add(1)
	out, err := modbus.EncodeRTU(unit, d.Handle(pdu))
	if err != nil { // Handle's PDUs are 2..253 bytes: never
		r.log.Error("modbus slave: answer not encodable", "unit", unit, "err", err)
		return
	}
	if err := r.hr.Until(ctx, r.heard.Add(r.t35)); err != nil {
		return // ctx ended: ServeRTU returns
	}
	if _, err := r.port.Write(out); err != nil {
		r.log.Debug("modbus slave: answer not written", "unit", unit, "err", err)
	}
}
