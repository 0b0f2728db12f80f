package modbus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/edgefence/edgefence/internal/hrtimer"
	"github.com/edgefence/edgefence/transport/serial"
)

// rtuLine is a Modbus RTU line over a serial.Conn, which reopens the port
// after an unplug. A reader goroutine reads the port all the time (that
// drives the Conn's reopening, and stamps each chunk with its arrival);
// the bus's goroutine writes requests and takes the chunks.
//
// tarm/serial's read timeout counts tenths of a second, far coarser than
// t1.5 and t3.5, so an answer is delimited by its length, known from the
// request and the function code that comes back (an exception is 5 bytes),
// never by timing. Silence is kept before each request: no byte for t3.5
// (TimingFor the baud rate), which also drains the rest of a bad frame.
// The silence is waited on an hrtimer.Timer: Go's timers wake up to a
// millisecond late, as long as t3.5 itself above 19,200 baud.
type rtuLine struct {
	conn    *serial.Conn
	hr      *hrtimer.Timer // the bus goroutine's
	timing  RTUTiming
	timeout time.Duration
	log     *slog.Logger
	st      *counters

	rx   chan chunk
	stop chan struct{}
	wg   sync.WaitGroup

	last time.Time // the last byte heard or sent: silence counts from here
	// dirty is set after a bad or missing answer: the frames' bounds are
	// unknown, so the next request waits for drainQuiet of silence rather
	// than t3.5 (a USB adapter delivers a frame in bursts up to its
	// latency timer apart, 16 ms by default).
	dirty      bool
	drainQuiet time.Duration
}

// drainQuiet is the silence that ends a drain after a bad frame: a tick of
// tarm/serial's read timeout.
const drainQuiet = 100 * time.Millisecond

type chunk struct {
	b  []byte
	at time.Time
}

func openRTU(port serial.PortConfig, timeout time.Duration, log *slog.Logger, st *counters) (*rtuLine, error) {
	baud := port.Baud
	if baud == 0 {
		baud = serial.DefaultBaud
	}
	timing, err := TimingFor(baud)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	conn, openErr := serial.OpenConn(serial.ConnConfig{Port: port, Logger: log})
	if conn == nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, openErr)
	}
	l := &rtuLine{conn: conn, hr: hrtimer.New(), timing: timing, timeout: timeout, log: log, st: st,
		rx: make(chan chunk, 64), stop: make(chan struct{}), drainQuiet: drainQuiet}
	if l.hr.Err != nil {
		log.Warn("modbus RTU: silences timed by Go's timers, up to 1 ms late", "err", l.hr.Err)
	}
	l.wg.Add(1)
	go l.read()
	return l, openErr
}

// read passes what the port delivers to the bus's goroutine until close.
func (l *rtuLine) read() {
	defer l.wg.Done()
	buf := make([]byte, MaxRTUFrame)
	for {
		n, err := l.conn.Read(buf)
		if n > 0 {
			select {
			case l.rx <- chunk{b: append([]byte(nil), buf[:n]...), at: time.Now()}:
			case <-l.stop:
				return
			}
		}
		if errors.Is(err, serial.ErrClosed) {
			return
		}
	}
}

func (l *rtuLine) idle() <-chan struct{} { return nil }

// tend is never called: bytes that arrive between transactions wait in rx
// and are drained by the next request's silence.
func (l *rtuLine) tend() {}

func (l *rtuLine) close() error {
	close(l.stop)
	err := l.conn.Close()
	l.wg.Wait()
	return errors.Join(err, l.hr.Close())
}

func (l *rtuLine) transact(ctx context.Context, unit byte, q *Request, pdu []byte) ([]byte, time.Duration, error) {
	start := time.Now()
	frame, err := EncodeRTU(unit, pdu)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: %w", ErrNotSent, err)
	}
	waited, err := l.quiet(ctx)
	if err != nil {
		return nil, time.Since(start), fmt.Errorf("%w: %w", ErrNotSent, err)
	}
	silence := time.Duration(0)
	if !waited {
		silence = l.timing.T35 // the line was quiet already; the standard still spends it
	}
	n, err := l.conn.Write(frame)
	sent := time.Now()
	l.last = sent.Add(time.Duration(len(frame)) * l.timing.Char)
	if err != nil {
		if n == 0 {
			return nil, time.Since(start), fmt.Errorf("%w: %w", ErrNotSent, err)
		}
		return nil, time.Since(start), fmt.Errorf("%w: %d of %d bytes written: %w", ErrTimeout, n, len(frame), err)
	}
	rsp, err := l.answer(ctx, unit, q, sent.Add(l.timing.FrameTime(len(frame))+l.timeout))
	l.dirty = err != nil
	return rsp, time.Since(start) + silence, err
}

// quiet waits until the line has been silent for t3.5 (drainQuiet after
// a bad answer), dropping whatever arrives meanwhile (the rest of a bad
// frame, a late answer). It reports whether it had to wait, and fails if
// ctx ends or the line is not quiet within the timeout. Bytes arriving
// during a wait carry their arrival time: after it the silence is counted
// again from the last of them.
func (l *rtuLine) quiet(ctx context.Context) (bool, error) {
	silence := l.timing.T35
	if l.dirty {
		silence = max(silence, l.drainQuiet)
	}
	limit := time.Now().Add(l.timeout + silence)
	waited, dropped := false, 0
	for {
		for heard := true; heard; {
			select {
			case c := <-l.rx:
				l.last, dropped, waited = c.at, dropped+len(c.b), true
			default:
				heard = false
			}
		}
		wait := time.Until(l.last.Add(silence))
		if wait <= 0 {
			if dropped > 0 {
				l.log.Debug("modbus RTU line drained before a request", "bytes", dropped)
			}
			l.dirty = false
			return waited, nil
		}
		if time.Now().After(limit) {
			return waited, fmt.Errorf("line not quiet for %v within %v (%d bytes dropped)", silence, l.timeout, dropped)
		}
		waited = true
		if err := l.hr.Wait(ctx, wait); err != nil {
			return waited, err
		}
	}
}

// answer collects unit's answer to q, delimited by its length, until
// deadline.
func (l *rtuLine) answer(ctx context.Context, unit byte, q *Request, deadline time.Time) ([]byte, error) {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	var buf []byte
	for {
		select {
		case c := <-l.rx:
			buf = append(buf, c.b...)
			l.last = c.at
		case <-t.C:
			if len(buf) == 0 {
				return nil, fmt.Errorf("%w: unit %d silent for %v", ErrTimeout, unit, l.timeout)
			}
			l.st.frameErrors.Add(1)
			return nil, fmt.Errorf("%w: %w: %d bytes of an answer (% x), then silence", ErrTimeout, ErrFrame, len(buf), buf)
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: after sending: %w", ErrTimeout, ctx.Err())
		}
		if len(buf) < 2 {
			continue
		}
		want := 0
		switch {
		case buf[0] != unit:
			l.st.frameErrors.Add(1)
			return nil, fmt.Errorf("%w: %w: answer from unit %d, asked unit %d", ErrTimeout, ErrFrame, buf[0], unit)
		case buf[1] == q.Func:
			want = 3 + ResponseLen(q)
		case buf[1] == q.Func|ExceptionFlag:
			want = 5
		default:
			l.st.frameErrors.Add(1)
			return nil, fmt.Errorf("%w: %w: answer with function 0x%02x to 0x%02x", ErrTimeout, ErrFrame, buf[1], q.Func)
		}
		if len(buf) < want {
			continue
		}
		pdu, err := DecodeRTU(buf[:want], unit)
		if err != nil {
			if errors.Is(err, ErrCRC) {
				l.st.crcErrors.Add(1)
			} else {
				l.st.frameErrors.Add(1)
			}
			return nil, fmt.Errorf("%w: %w", ErrTimeout, err)
		}
		return pdu, nil
	}
}
