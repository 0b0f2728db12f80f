package serial

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgefence/edgefence/internal/backoff"
)

// Conn defaults, applied to zero ConnConfig fields.
const (
	DefaultMinBackoff = 100 * time.Millisecond
	DefaultMaxBackoff = 5 * time.Second
)

// ConnConfig configures a Conn. The zero value of every field except
// Port.Path means its default.
type ConnConfig struct {
	// Port is the port to keep open.
	Port PortConfig

	// MinBackoff and MaxBackoff bound the delay between attempts to reopen
	// the port (exponential with jitter). Defaults 100ms and 5s.
	MinBackoff, MaxBackoff time.Duration

	// Logger receives port events: open at Info, lost and first failed
	// reopen at Warn, further failed reopens at Debug. nil discards them.
	Logger *slog.Logger
}

func (c ConnConfig) withDefaults() (ConnConfig, error) {
	port, err := c.Port.withDefaults()
	if err != nil {
		return ConnConfig{}, err
	}
	c.Port = port
	if c.MinBackoff < 0 || c.MaxBackoff < 0 {
		return ConnConfig{}, fmt.Errorf("%w: negative MinBackoff or MaxBackoff", ErrInvalidConfig)
	}
	if c.MinBackoff == 0 {
		c.MinBackoff = DefaultMinBackoff
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = max(DefaultMaxBackoff, c.MinBackoff)
	}
	if c.MaxBackoff < c.MinBackoff {
		return ConnConfig{}, fmt.Errorf("%w: MaxBackoff %v below MinBackoff %v", ErrInvalidConfig, c.MaxBackoff, c.MinBackoff)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// ConnStats counts a Conn's port events.
type ConnStats struct {
	Opens        uint64 // successful opens, the first included
	OpenFailures uint64 // failed open attempts
	Losses       uint64 // open ports lost (hangup, I/O error)
}

// A Conn is a serial port that survives its adapter disappearing and coming
// back. When a Read or Write fails, the port is closed and the same path is
// reopened with backoff; meanwhile Write fails fast with ErrPortDown and
// AwaitUp waits for the port. A Link over a Conn therefore resends its
// pending request (same txid) once the port is back: no request is lost,
// and the device's duplicate detection keeps any from being applied twice.
//
// Reopening is driven by Read, so a Conn needs a reader, as every Link and
// Serve has: Read returns within about the ReadTimeout, with data,
// ErrReadTimeout (also while the port is down) or ErrClosed. Read never
// returns a port failure: that is the Conn's to handle. One goroutine
// reads; others may Write, AwaitUp and Close.
type Conn struct {
	cfg ConnConfig
	log *slog.Logger

	closing   chan struct{}
	closeOnce sync.Once

	// The reader's state, under readMu: the port it reads from (possibly
	// already marked down by a writer) and the reopening schedule.
	readMu  sync.Mutex
	rport   *Port
	attempt int
	nextTry time.Time
	// reopen draws the delay before attempt n from [MinBackoff,
	// min(MinBackoff·2^(n+1), MaxBackoff)] (full jitter above a floor), so
	// that the gateways of a site whose hub lost power do not retry in
	// lockstep.
	reopen backoff.Backoff

	wmu sync.Mutex // serialises writes, so frames never interleave

	// What writers see, under mu: the usable port or nil, a channel closed
	// while the port is up, and why it is down.
	mu      sync.Mutex
	port    *Port
	up      chan struct{}
	downErr error

	opens, openFailures, losses atomic.Uint64
}

// OpenConn validates cfg and opens the port. An invalid config gives a nil
// Conn and an error wrapping ErrInvalidConfig. Otherwise the Conn is
// returned, and usable, even if the port could not be opened: the error
// then says why (wrapping ErrPortMissing when the path does not exist, or
// ErrPortBusy) and the Conn keeps trying from Read, so a missing adapter at
// start does not stop an agent from serving its other devices. Close the
// Conn when done with it.
func OpenConn(cfg ConnConfig) (*Conn, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	c := &Conn{
		cfg:     cfg,
		log:     cfg.Logger.With("port", cfg.Port.Path),
		closing: make(chan struct{}),
		up:      make(chan struct{}),
		reopen:  backoff.Backoff{Min: cfg.MinBackoff, Max: cfg.MaxBackoff},
	}
	c.readMu.Lock()
	defer c.readMu.Unlock()
	if err := c.open(); err != nil {
		return c, fmt.Errorf("serial: port %s not open, retrying in the background: %w", cfg.Port.Path, err)
	}
	return c, nil
}

// Read reads from the port. See Conn for what it returns.
func (c *Conn) Read(b []byte) (int, error) {
	c.readMu.Lock()
	defer c.readMu.Unlock()
	for {
		if c.isClosing() {
			return 0, ErrClosed
		}
		if c.rport != nil && !c.isCurrent(c.rport) {
			// A writer found the port broken; close it here, between reads.
			c.drop()
		}
		if c.rport == nil {
			if !c.waitRetry() || c.open() != nil {
				return 0, ErrReadTimeout
			}
		}
		n, err := c.rport.Read(b)
		if n > 0 || err == nil || errors.Is(err, ErrReadTimeout) {
			c.attempt = 0 // the port works: the next loss starts the backoff afresh
			if n == 0 && err == nil {
				err = ErrReadTimeout
			}
			return n, err
		}
		if c.isClosing() {
			return 0, ErrClosed
		}
		c.setDown(c.rport, err)
		c.drop()
	}
}

// drop closes the reader's port after a failure and schedules the next
// attempt to reopen it; the caller holds readMu. The backoff applies from
// the first attempt, and grows until a Read succeeds, so that a device node
// that opens but hangs up at once is not reopened in a tight loop.
func (c *Conn) drop() {
	c.rport.Close()
	c.rport = nil
	c.schedule()
}

// schedule sets the time of the next attempt to open the port.
func (c *Conn) schedule() time.Duration {
	delay := c.reopen.Delay(c.attempt)
	c.nextTry = time.Now().Add(delay)
	c.attempt++
	return delay
}

// Write writes b to the port. While the port is down it fails at once with
// an error wrapping ErrPortDown and the reason (for example
// ErrPortMissing); a write that fails marks the port down and wraps both
// ErrPortDown and ErrPortGone. Writes are serialised.
func (c *Conn) Write(b []byte) (int, error) {
	c.mu.Lock()
	p, down := c.port, c.downErr
	c.mu.Unlock()
	if c.isClosing() {
		return 0, ErrClosed
	}
	if p == nil {
		return 0, fmt.Errorf("%w: %w", ErrPortDown, down)
	}
	c.wmu.Lock()
	n, err := p.Write(b)
	c.wmu.Unlock()
	if err != nil {
		if errors.Is(err, ErrClosed) && c.isClosing() {
			return n, ErrClosed
		}
		c.setDown(p, err)
		return n, fmt.Errorf("%w: %w", ErrPortDown, err)
	}
	return n, nil
}

// AwaitUp waits until the port is open. It returns ErrClosed if the Conn is
// closed first, or, if ctx ends first, an error wrapping ctx.Err() and the
// reason the port is down (for example ErrPortMissing).
func (c *Conn) AwaitUp(ctx context.Context) error {
	for {
		c.mu.Lock()
		p, up, down := c.port, c.up, c.downErr
		c.mu.Unlock()
		if p != nil {
			return nil
		}
		select {
		case <-up:
		case <-c.closing:
			return ErrClosed
		case <-ctx.Done():
			if down == nil {
				down = ErrPortDown
			}
			return fmt.Errorf("serial: waiting for port %s: %w (%w)", c.cfg.Port.Path, ctx.Err(), down)
		}
	}
}

// Err returns nil while the port is open, and otherwise why it is not.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.isClosing() {
		return ErrClosed
	}
	return c.downErr
}

// Stats returns the Conn's counters.
func (c *Conn) Stats() ConnStats {
	return ConnStats{Opens: c.opens.Load(), OpenFailures: c.openFailures.Load(), Losses: c.losses.Load()}
}

// Close closes the Conn and its port. It waits for a pending Read to return
// (at most the ReadTimeout), so the port is closed between two reads.
func (c *Conn) Close() error {
	var err error
	c.closeOnce.Do(func() {
		close(c.closing)
		c.readMu.Lock()
		defer c.readMu.Unlock()
		c.mu.Lock()
		c.port = nil
		c.downErr = ErrClosed
		c.mu.Unlock()
		if c.rport != nil {
			err = c.rport.Close()
			c.rport = nil
		}
	})
	return err
}

func (c *Conn) isClosing() bool {
	select {
	case <-c.closing:
		return true
	default:
		return false
	}
}

func (c *Conn) isCurrent(p *Port) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.port == p
}

// open tries to open the port once; the caller holds readMu.
func (c *Conn) open() error {
	p, err := OpenPort(c.cfg.Port)
	if err != nil {
		c.openFailures.Add(1)
		level := slog.LevelDebug
		if c.attempt == 0 {
			level = slog.LevelWarn
		}
		delay := c.schedule()
		c.log.Log(context.Background(), level, "serial port not open; retrying", "err", err, "attempt", c.attempt, "retry_in", delay)
		c.mu.Lock()
		c.downErr = err
		c.mu.Unlock()
		return err
	}
	c.rport = p
	c.opens.Add(1)
	c.mu.Lock()
	c.port = p
	c.downErr = nil
	close(c.up)
	c.mu.Unlock()
	c.log.Info("serial port open")
	return nil
}

// waitRetry sleeps towards the next reopening attempt for at most one
// ReadTimeout, and reports whether that attempt is due.
func (c *Conn) waitRetry() bool {
	wait := time.Until(c.nextTry)
	if wait <= 0 {
		return true
	}
	t := time.NewTimer(min(wait, c.cfg.Port.ReadTimeout))
	defer t.Stop()
	select {
	case <-t.C:
	case <-c.closing:
		return false
	}
	return !time.Now().Before(c.nextTry)
}

// setDown marks p down because of err, unless it already is.
func (c *Conn) setDown(p *Port, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.port != p {
		return
	}
	c.port = nil
	c.downErr = err
	c.up = make(chan struct{})
	c.losses.Add(1)
	c.log.Warn("serial port lost; reopening", "err", err)
}
