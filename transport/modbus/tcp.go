package modbus

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/edgefence/edgefence/internal/backoff"
)

// Redial delays of a TCP bus (full jitter, internal/backoff).
const (
	tcpMinBackoff = 100 * time.Millisecond
	tcpMaxBackoff = 5 * time.Second
)

// tcpLine is a Modbus TCP endpoint: one connection, MBAP transaction ids,
// redialled with backoff after it breaks. A reader goroutine per
// connection delivers ADUs (and the error that ends it), so a connection
// the server closed while the bus was idle is noticed, and redialled,
// before the next request is written to it.
type tcpLine struct {
	addr    string
	timeout time.Duration
	log     *slog.Logger
	st      *counters

	conn   *tcpConn // nil while down
	tx     uint16
	redial backoff.Backoff
	fails  int           // failed dials since the last success
	wake   chan struct{} // closed when the next dial is due (while down)
	timer  *time.Timer
	down   error // why conn is nil
}

// tcpConn is one connection and its reader.
type tcpConn struct {
	c      net.Conn
	frames chan tcpFrame
	dead   chan struct{} // closed when the reader stops
	err    error         // why it stopped, set before dead is closed
	wg     sync.WaitGroup
}

type tcpFrame struct {
	h   MBAP
	adu []byte
}

func openTCP(addr string, timeout time.Duration, log *slog.Logger, st *counters) (*tcpLine, error) {
	l := &tcpLine{addr: addr, timeout: timeout, log: log.With("endpoint", addr), st: st,
		redial: backoff.Backoff{Min: tcpMinBackoff, Max: tcpMaxBackoff}}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return l, l.dial(ctx)
}

// dial connects, or schedules the next attempt.
func (l *tcpLine) dial(ctx context.Context) error {
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", l.addr)
	if err != nil {
		delay := l.redial.Delay(l.fails)
		level := slog.LevelDebug
		if l.fails == 0 {
			level = slog.LevelWarn
		}
		l.fails++
		l.down = err
		l.log.Log(context.Background(), level, "modbus connection not open; retrying", "err", err, "attempt", l.fails, "retry_in", delay)
		l.schedule(delay)
		return fmt.Errorf("modbus: connect %s (retrying in %v): %w", l.addr, delay, err)
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	l.fails, l.down = 0, nil
	l.conn = &tcpConn{c: c, frames: make(chan tcpFrame, 16), dead: make(chan struct{})}
	l.conn.wg.Add(1)
	go l.conn.read()
	l.log.Info("modbus connection open")
	return nil
}

func (l *tcpLine) schedule(delay time.Duration) {
	if l.timer != nil {
		l.timer.Stop()
	}
	wake := make(chan struct{})
	l.wake = wake
	l.timer = time.AfterFunc(delay, func() { close(wake) })
}

// lost drops a broken connection and schedules a redial.
func (l *tcpLine) lost(err error) {
	l.conn.close()
	l.conn = nil
	l.down = err
	l.log.Warn("modbus connection lost; reconnecting", "err", err)
	l.schedule(l.redial.Delay(0))
}

// read delivers ADUs until the connection fails or is closed.
func (c *tcpConn) read() {
	defer c.wg.Done()
	defer close(c.dead)
	for {
		hdr := make([]byte, MBAPLen, MaxTCPFrame)
		if _, err := io.ReadFull(c.c, hdr); err != nil {
			c.err = err
			return
		}
		h, n, err := DecodeMBAP(hdr)
		if err != nil {
			c.err = err // the stream is out of step: only a new connection helps
			return
		}
		adu := hdr[:MBAPLen+n]
		if _, err := io.ReadFull(c.c, adu[MBAPLen:]); err != nil {
			c.err = err
			return
		}
		select {
		case c.frames <- tcpFrame{h: h, adu: adu}:
		default: // nobody waits for so many: late answers, dropped
		}
	}
}

func (c *tcpConn) close() {
	c.c.Close()
	c.wg.Wait()
}

func (l *tcpLine) idle() <-chan struct{} {
	if l.conn != nil {
		return l.conn.dead
	}
	return l.wake
}

// tend handles what happened between transactions: the connection died,
// or a redial is due.
func (l *tcpLine) tend() {
	if l.conn != nil {
		l.lost(l.conn.err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
	defer cancel()
	_ = l.dial(ctx)
}

func (l *tcpLine) close() error {
	if l.timer != nil {
		l.timer.Stop()
	}
	if l.conn != nil {
		l.conn.close()
		l.conn = nil
	}
	return nil
}

// ready makes sure a live connection exists, dialling if one is due.
func (l *tcpLine) ready(ctx context.Context) error {
	if l.conn != nil {
		select {
		case <-l.conn.dead:
			l.lost(l.conn.err) // and dial at once: the server may be back
		default:
			return nil
		}
	} else {
		select {
		case <-l.wake:
		default:
			return fmt.Errorf("%w: connection to %s down (%w); reconnecting", ErrNotSent, l.addr, l.down)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	if err := l.dial(ctx); err != nil {
		return fmt.Errorf("%w: %w", ErrNotSent, err)
	}
	return nil
}

func (l *tcpLine) transact(ctx context.Context, unit byte, q *Request, pdu []byte) ([]byte, time.Duration, error) {
	start := time.Now()
	if err := l.ready(ctx); err != nil {
		return nil, time.Since(start), err
	}
	l.tx++
	want := MBAP{Transaction: l.tx, Unit: unit}
	adu, err := EncodeTCP(want, pdu)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: %w", ErrNotSent, err)
	}
	_ = l.conn.c.SetWriteDeadline(time.Now().Add(l.timeout))
	if n, err := l.conn.c.Write(adu); err != nil {
		l.lost(err)
		if n == 0 {
			return nil, time.Since(start), fmt.Errorf("%w: %w", ErrNotSent, err)
		}
		return nil, time.Since(start), fmt.Errorf("%w: %d of %d bytes written: %w", ErrTimeout, n, len(adu), err)
	}
	rsp, err := l.answer(ctx, want)
	return rsp, time.Since(start), err
}

// answer waits for the ADU answering want, dropping late answers to
// earlier transactions.
func (l *tcpLine) answer(ctx context.Context, want MBAP) ([]byte, error) {
	t := time.NewTimer(l.timeout)
	defer t.Stop()
	for {
		select {
		case f := <-l.conn.frames:
			if pdu, ok, err := l.match(f, want); ok {
				return pdu, err
			}
		case <-l.conn.dead:
			for len(l.conn.frames) > 0 { // answers read before the end come first
				if pdu, ok, err := l.match(<-l.conn.frames, want); ok {
					return pdu, err
				}
			}
			err := l.conn.err
			l.lost(err)
			return nil, fmt.Errorf("%w: connection to %s broken mid-transaction: %w", ErrTimeout, l.addr, err)
		case <-t.C:
			return nil, fmt.Errorf("%w: unit %d silent for %v", ErrTimeout, want.Unit, l.timeout)
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: after sending: %w", ErrTimeout, ctx.Err())
		}
	}
}

// match reports whether f answers want (ok) and, if so, its PDU or why it
// is no good. A late answer to an earlier transaction is dropped.
func (l *tcpLine) match(f tcpFrame, want MBAP) (pdu []byte, ok bool, err error) {
	if f.h.Transaction != want.Transaction {
		l.st.frameErrors.Add(1)
		l.log.Debug("modbus late answer dropped", "transaction", f.h.Transaction, "awaiting", want.Transaction)
		return nil, false, nil
	}
	pdu, err = DecodeTCP(f.adu, want)
	if err != nil {
		l.st.frameErrors.Add(1)
		return nil, true, fmt.Errorf("%w: %w", ErrTimeout, err)
	}
	return pdu, true, nil
}
