package modbus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgefence/edgefence/transport/serial"
)

// DefaultTimeout is a transaction's response timeout when BusConfig leaves
// it 0.
const DefaultTimeout = time.Second

// Sentinel errors of a Bus. An error of Transact tells the caller what it
// may do next: ErrNotSent, retry at will; ErrTimeout (and ErrCRC, ErrFrame,
// which come wrapped with it), the request may have been applied; an
// *ExceptionError, the device refused it.
var (
	// ErrTimeout means no valid answer came in time after the request went
	// out: the device may have applied it (fate unknown). A corrupt or
	// foreign answer (ErrCRC, ErrFrame), a connection broken
	// mid-transaction and a context cancelled after sending wrap it too.
	ErrTimeout = errors.New("modbus: no valid answer (fate unknown)")
	// ErrNotSent means the request never reached the line or connection
	// (port down, connection refused, context ended while queued): a retry
	// is always safe.
	ErrNotSent = errors.New("modbus: request not sent")
	// ErrBroadcast refuses a write to unit 0: a broadcast is answered by
	// nobody, so its fate could never be known.
	ErrBroadcast = errors.New("modbus: broadcast write refused")
	// ErrClosed means the Bus is closed.
	ErrClosed = errors.New("modbus: bus closed")
	// ErrConfig means a BusConfig cannot be used; the message names the
	// field.
	ErrConfig = errors.New("modbus: invalid bus config")
)

// BusConfig configures a Bus: exactly one of RTU and TCP.
type BusConfig struct {
	Name    string             // for logs and metrics
	RTU     *serial.PortConfig // a serial line: Modbus RTU
	TCP     string             // host:port: Modbus TCP
	Timeout time.Duration      // response timeout of one transaction; default 1s
	Logger  *slog.Logger       // port and connection losses and recoveries; nil discards
}

// BusStats counts a Bus's transactions. Every transaction that went out is
// counted in Transactions, and ends answered (perhaps with an exception,
// Exceptions) or with ErrTimeout (Timeouts, whatever the cause); a request
// that never went out is counted in NotSent only. CRCErrors and
// FrameErrors count the bad frames seen, corrupt or foreign (on TCP also a
// late answer to an earlier transaction, dropped).
type BusStats struct {
	Transactions, Timeouts, CRCErrors, FrameErrors, Exceptions, NotSent uint64
	// Busy is the time the line was held by transactions: frames, the
	// silences around them and the waits for answers, timeouts included.
	// Its growth over a period, divided by the period, is the bus's
	// utilisation.
	Busy time.Duration
}

type counters struct {
	transactions, timeouts, crcErrors, frameErrors, exceptions, notSent atomic.Uint64
	busy                                                                atomic.Int64
}

// line is one physical bus as the Bus's goroutine drives it: an RTU serial
// line or a TCP connection.
type line interface {
	// transact sends the request PDU to unit and returns the answer's PDU
	// and how long it held the line. Errors wrap ErrNotSent or ErrTimeout.
	transact(ctx context.Context, unit byte, q *Request, pdu []byte) ([]byte, time.Duration, error)
	// idle is a channel that becomes ready when the line needs tend called
	// between transactions (bytes on a quiet RTU line, a TCP connection
	// lost or due to be redialled); nil if none.
	idle() <-chan struct{}
	tend()
	close() error
}

// A Bus is one Modbus master on one RS-485 line or one TCP endpoint, with
// any number of units behind it. One goroutine owns the port or
// connection and runs the transactions of all callers one at a time, in
// the order they called Transact.
type Bus struct {
	cfg  BusConfig
	log  *slog.Logger
	line line
	st   *counters

	queue     chan *call
	closing   chan struct{}
	done      chan struct{}
	closeOnce sync.Once
	closeErr  error
}

type call struct {
	ctx  context.Context
	unit byte
	q    *Request
	pdu  []byte
	done chan result // buffered 1
}

type result struct {
	r   *Response
	err error
}

// OpenBus validates cfg and opens the bus. A bad config gives a nil Bus and
// an error wrapping ErrConfig. Otherwise the Bus is returned, usable, even
// if the port or endpoint is absent: the error then says why, and the Bus
// keeps trying (a serial port reopens, a connection is redialled with
// backoff) while its transactions fail with ErrNotSent.
func OpenBus(cfg BusConfig) (*Bus, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	b := &Bus{
		cfg:     cfg,
		log:     cfg.Logger.With("bus", cfg.Name),
		st:      &counters{},
		queue:   make(chan *call),
		closing: make(chan struct{}),
		done:    make(chan struct{}),
	}
	var openErr error
	if cfg.RTU != nil {
		b.line, openErr = openRTU(*cfg.RTU, cfg.Timeout, b.log, b.st)
	} else {
		b.line, openErr = openTCP(cfg.TCP, cfg.Timeout, b.log, b.st)
	}
	if b.line == nil {
		return nil, openErr
	}
	go b.run()
	if openErr != nil {
		return b, fmt.Errorf("modbus: bus %s: %w", cfg.Name, openErr)
	}
	return b, nil
}

func (c BusConfig) withDefaults() (BusConfig, error) {
	bad := func(format string, args ...any) (BusConfig, error) {
		return BusConfig{}, fmt.Errorf("%w: bus %q: %s", ErrConfig, c.Name, fmt.Sprintf(format, args...))
	}
	if (c.RTU == nil) == (c.TCP == "") {
		return bad("exactly one of RTU and TCP")
	}
	if c.TCP != "" {
		host, port, err := net.SplitHostPort(c.TCP)
		if n, perr := strconv.Atoi(port); err != nil || perr != nil || host == "" || n < 1 || n > 65535 {
			return bad("TCP %q is not host:port", c.TCP)
		}
	}
	if c.RTU != nil {
		if err := c.RTU.Validate(); err != nil {
			return bad("RTU: %v", err)
		}
	}
	switch {
	case c.Timeout < 0:
		return bad("negative Timeout %v", c.Timeout)
	case c.Timeout == 0:
		c.Timeout = DefaultTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// Transact sends q to unit and returns the answer, once: it never retries
// (the caller knows which requests are safe to repeat). Unit 0 (broadcast)
// is refused for writes (ErrBroadcast); units above 247 and invalid
// requests are refused (ErrFrame, ErrPDU) before anything is queued.
//
// An exception answer returns the Response and an *ExceptionError. Other
// errors wrap ErrNotSent (nothing went out: ctx ended while queued, port or
// connection down), ErrTimeout (fate unknown, see there) or ErrClosed.
func (b *Bus) Transact(ctx context.Context, unit byte, q *Request) (*Response, error) {
	if unit > MaxUnit {
		return nil, fmt.Errorf("%w: unit %d not in 0..%d", ErrFrame, unit, MaxUnit)
	}
	if unit == UnitBroadcast && q.IsWrite() {
		return nil, fmt.Errorf("%w: function 0x%02x to unit 0", ErrBroadcast, q.Func)
	}
	pdu, err := q.Encode()
	if err != nil {
		return nil, err
	}
	c := &call{ctx: ctx, unit: unit, q: q, pdu: pdu, done: make(chan result, 1)}
	select {
	case b.queue <- c:
	case <-ctx.Done():
		b.st.notSent.Add(1)
		return nil, fmt.Errorf("%w: bus %s: queued: %w", ErrNotSent, b.cfg.Name, ctx.Err())
	case <-b.closing:
		return nil, ErrClosed
	}
	res := <-c.done // the bus's goroutine answers every call it takes
	return res.r, res.err
}

// Stats returns the bus's counters.
func (b *Bus) Stats() BusStats {
	return BusStats{
		Transactions: b.st.transactions.Load(),
		Timeouts:     b.st.timeouts.Load(),
		CRCErrors:    b.st.crcErrors.Load(),
		FrameErrors:  b.st.frameErrors.Load(),
		Exceptions:   b.st.exceptions.Load(),
		NotSent:      b.st.notSent.Load(),
		Busy:         time.Duration(b.st.busy.Load()),
	}
}

// Close stops the bus's goroutine, after the transaction in progress, and
// closes the port or connection. Callers still queued get ErrClosed.
func (b *Bus) Close() error {
	b.closeOnce.Do(func() {
		close(b.closing)
		<-b.done
	})
	return b.closeErr
}

// run is the bus's goroutine: it owns the line.
func (b *Bus) run() {
	defer close(b.done)
	for {
		select {
		case c := <-b.queue:
			c.done <- b.do(c)
		case <-b.line.idle():
			b.line.tend()
		case <-b.closing:
			b.closeErr = b.line.close()
			return
		}
	}
}

// do runs one call on the line and counts it.
func (b *Bus) do(c *call) result {
	if err := c.ctx.Err(); err != nil {
		b.st.notSent.Add(1)
		return result{err: fmt.Errorf("%w: bus %s: %w", ErrNotSent, b.cfg.Name, err)}
	}
	pdu, busy, err := b.line.transact(c.ctx, c.unit, c.q, c.pdu)
	b.st.busy.Add(int64(busy))
	if errors.Is(err, ErrNotSent) {
		b.st.notSent.Add(1)
		return result{err: fmt.Errorf("bus %s: unit %d: %w", b.cfg.Name, c.unit, err)}
	}
	b.st.transactions.Add(1)
	if err == nil {
		var r *Response
		if r, err = DecodeResponse(c.q, pdu); err == nil {
			if err = r.Err(); err != nil {
				b.st.exceptions.Add(1)
			}
			return result{r: r, err: err}
		}
		b.st.frameErrors.Add(1)
		err = fmt.Errorf("%w: %w: %w", ErrTimeout, ErrFrame, err)
	}
	b.st.timeouts.Add(1)
	b.log.Debug("modbus transaction failed", "unit", c.unit, "func", c.q.Func, "addr", c.q.Addr, "err", err)
	return result{err: fmt.Errorf("modbus: bus %s: unit %d: %w", b.cfg.Name, c.unit, err)}
}
