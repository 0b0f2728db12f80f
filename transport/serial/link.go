package serial

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// Link defaults, applied to zero LinkConfig fields.
const (
	DefaultTimeout = 500 * time.Millisecond
	DefaultRetries = 3
)

// LinkConfig configures a Link. The zero value means the defaults.
type LinkConfig struct {
	// Timeout is how long one attempt waits for the response before the
	// request is sent again. Default 500ms. At 115200 baud a 1 KiB frame
	// takes 90ms each way; slow devices need more.
	Timeout time.Duration

	// Retries is how many times a request is sent again after a timeout,
	// each time with the same txid. Default 3; negative means none. An
	// attempt that could not be written because a Conn's port was down is
	// not counted: the request waits for the port instead.
	Retries int

	// MaxPayload is the largest frame payload sent or accepted, header
	// included; requests and responses are at most MaxPayload-6 bytes.
	// Default DefaultMaxPayload (1 KiB). The device must accept as much.
	MaxPayload int

	// Logger receives retries and dropped responses at Debug and requests
	// that ran out of attempts at Warn. nil discards them.
	Logger *slog.Logger
}

func (c LinkConfig) withDefaults() (LinkConfig, error) {
	switch {
	case c.Timeout < 0:
		return c, fmt.Errorf("%w: negative Timeout %v", ErrInvalidConfig, c.Timeout)
	case c.Timeout == 0:
		c.Timeout = DefaultTimeout
	}
	switch {
	case c.Retries < 0:
		c.Retries = 0
	case c.Retries == 0:
		c.Retries = DefaultRetries
	}
	switch {
	case c.MaxPayload == 0:
		c.MaxPayload = DefaultMaxPayload
	case c.MaxPayload <= headerLen || c.MaxPayload > MaxPayloadLimit:
		return c, fmt.Errorf("%w: MaxPayload %d not in %d..%d", ErrInvalidConfig, c.MaxPayload, headerLen+1, MaxPayloadLimit)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// LinkStats counts a Link's traffic.
type LinkStats struct {
	Requests    uint64 // Do calls that sent a request
	Responses   uint64 // responses delivered to Do
	Retries     uint64 // requests sent again after a timeout (same txid)
	Timeouts    uint64 // Do calls that ran out of attempts (ErrTimeout)
	UnknownTxid uint64 // responses dropped: no request waiting with that txid
	BadMessages uint64 // frames dropped: bad header, or a request
	Frames      FrameStats
	LastTxid    uint32 // txid of the latest request
}

// A Link sends requests to one device over a byte stream and returns the
// device's responses, one transaction at a time (stop-and-wait, as a
// device that remembers only its last transaction requires).
//
// Each request carries a transaction id (txid); the device's response
// echoes it. When no response arrives within the Timeout the identical
// frame, same txid, is sent again, up to Retries times, so a device that
// remembers its last txid and response (see Responder) answers a retry
// without applying the request twice. Responses whose txid is not the one
// awaited (late answers to a finished request, noise that passed the CRC)
// are dropped and counted.
//
// A Link owns one goroutine, which reads the stream; Close stops it.
type Link struct {
	cfg LinkConfig
	log *slog.Logger
	rwc io.ReadWriteCloser
	dec *Decoder

	turn chan struct{} // holds a token while a transaction runs
	next uint32        // next txid, under turn

	mu      sync.Mutex
	pending *transaction // the transaction awaiting its response, or nil

	closing   chan struct{}
	closeOnce sync.Once
	closeErr  error
	done      chan struct{}
	err       error // why the reader stopped, set before done is closed

	frames                                                   frameCounters
	requests, responses, retries, timeouts, unknown, badMsgs atomic.Uint64
	lastTxid                                                 atomic.Uint32
}

type transaction struct {
	txid     uint32
	resp     chan []byte // buffered 1
	answered bool        // under Link.mu: a response was delivered
}

// awaiter is implemented by streams that come back after a failure (Conn):
// while Write fails with ErrPortDown, Do waits in AwaitUp instead of giving
// up.
type awaiter interface {
	AwaitUp(ctx context.Context) error
}

// NewLink starts a Link over rwc, usually a *Conn (which survives
// unplugging) or a *Port. The Link owns rwc from now on and closes it in
// Close. rwc's Read must return now and then (a Port or Conn returns
// within its ReadTimeout) or be unblocked by its Close.
//
// The first txid is random, so that after a restart of the gateway a new
// request is unlikely to carry the txid the device remembers.
func NewLink(rwc io.ReadWriteCloser, cfg LinkConfig) (*Link, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	l := &Link{
		cfg:     cfg,
		log:     cfg.Logger,
		rwc:     rwc,
		turn:    make(chan struct{}, 1),
		next:    rand.Uint32(),
		closing: make(chan struct{}),
		done:    make(chan struct{}),
	}
	l.dec = newDecoder(rwc, cfg.MaxPayload, &l.frames)
	go l.readLoop()
	return l, nil
}

// Do sends req and returns the device's response. Calls are queued and
// run one at a time, in no particular order.
//
// Errors: ErrFrameSize if req does not fit a frame (nothing sent);
// ErrTimeout after the last attempt timed out; ctx.Err() if ctx ends (while
// queued, while waiting for a Conn's port, wrapping the port's state, or
// while waiting for the response); ErrClosed if the Link is closed or its
// stream failed. Once a request was sent, any error leaves the outcome
// unknown: the device may have applied it.
func (l *Link) Do(ctx context.Context, req []byte) ([]byte, error) {
	if len(req) > l.cfg.MaxPayload-headerLen {
		return nil, fmt.Errorf("%w: request of %d bytes, limit %d", ErrFrameSize, len(req), l.cfg.MaxPayload-headerLen)
	}
	select {
	case l.turn <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-l.done:
		return nil, l.stopped()
	}
	defer func() { <-l.turn }()

	tx := &transaction{txid: l.next, resp: make(chan []byte, 1)}
	l.next++
	frame, err := encodeMessage(header{typ: typeRequest, txid: tx.txid}, req)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.pending = tx
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.pending = nil
		l.mu.Unlock()
	}()
	l.requests.Add(1)
	l.lastTxid.Store(tx.txid)

	timer := time.NewTimer(0)
	defer timer.Stop()
	for attempt := 0; ; attempt++ {
		if err := l.send(ctx, frame); err != nil {
			return nil, fmt.Errorf("serial: request txid %d: %w", tx.txid, err)
		}
		timer.Reset(l.cfg.Timeout)
		select {
		case resp := <-tx.resp:
			l.responses.Add(1)
			return resp, nil
		case <-timer.C:
			if attempt >= l.cfg.Retries {
				l.timeouts.Add(1)
				l.log.Warn("serial request unanswered", "txid", tx.txid, "attempts", attempt+1)
				return nil, fmt.Errorf("%w: txid %d, %d attempts of %v", ErrTimeout, tx.txid, attempt+1, l.cfg.Timeout)
			}
			l.retries.Add(1)
			l.log.Debug("serial request retried", "txid", tx.txid, "attempt", attempt+2)
		case <-ctx.Done():
			return nil, fmt.Errorf("serial: request txid %d: %w", tx.txid, ctx.Err())
		case <-l.done:
			return nil, fmt.Errorf("serial: request txid %d: %w", tx.txid, l.stopped())
		}
	}
}

// send writes frame, waiting for the port while a Conn reports it down.
func (l *Link) send(ctx context.Context, frame []byte) error {
	for {
		_, err := l.rwc.Write(frame)
		if err == nil {
			return nil
		}
		aw, ok := l.rwc.(awaiter)
		if !ok || !errors.Is(err, ErrPortDown) {
			if errors.Is(err, ErrClosed) {
				return l.stopped()
			}
			return err
		}
		if err := aw.AwaitUp(ctx); err != nil {
			if errors.Is(err, ErrClosed) {
				return l.stopped()
			}
			return err
		}
	}
}

// readLoop delivers responses to the waiting transaction until Close or a
// stream failure.
func (l *Link) readLoop() {
	defer close(l.done)
	for {
		select {
		case <-l.closing:
			l.err = ErrClosed
			return
		default:
		}
		p, err := l.dec.Next()
		if err != nil {
			if isTimeout(err) {
				continue
			}
			select {
			case <-l.closing:
				l.err = ErrClosed
			default:
				l.err = fmt.Errorf("%w: read: %w", ErrClosed, err)
				l.log.Warn("serial link stopped", "err", err)
			}
			return
		}
		h, body, err := parseMessage(p)
		if err != nil || h.typ != typeResponse {
			l.badMsgs.Add(1)
			continue
		}
		l.mu.Lock()
		tx := l.pending
		ok := tx != nil && tx.txid == h.txid && !tx.answered
		if ok {
			tx.answered = true
			tx.resp <- body // buffered: never blocks
		}
		l.mu.Unlock()
		if !ok {
			l.unknown.Add(1)
			l.log.Debug("serial response dropped: no request waiting for its txid", "txid", h.txid)
		}
	}
}

// stopped returns the error for a Link whose reader has stopped or is
// stopping.
func (l *Link) stopped() error {
	select {
	case <-l.done:
		return l.err
	default:
		return ErrClosed
	}
}

// Stats returns the Link's counters.
func (l *Link) Stats() LinkStats {
	return LinkStats{
		Requests:    l.requests.Load(),
		Responses:   l.responses.Load(),
		Retries:     l.retries.Load(),
		Timeouts:    l.timeouts.Load(),
		UnknownTxid: l.unknown.Load(),
		BadMessages: l.badMsgs.Load(),
		Frames:      l.frames.snapshot(),
		LastTxid:    l.lastTxid.Load(),
	}
}

// Done is closed when the Link's goroutine has stopped: after Close, or
// when the stream failed (see Err).
func (l *Link) Done() <-chan struct{} { return l.done }

// Err returns nil while the Link runs, ErrClosed after Close, and an error
// wrapping ErrClosed and the cause if the stream failed.
func (l *Link) Err() error {
	select {
	case <-l.done:
		return l.err
	default:
		return nil
	}
}

// Close stops the Link, closes its stream and waits for its goroutine. Do
// calls in progress return ErrClosed.
func (l *Link) Close() error {
	l.closeOnce.Do(func() {
		close(l.closing)
		l.closeErr = l.rwc.Close()
	})
	<-l.done
	return l.closeErr
}
