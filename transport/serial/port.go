package serial

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	tarm "github.com/tarm/serial"
)

// Port defaults, applied to zero PortConfig fields.
const (
	DefaultBaud        = 115200
	DefaultDataBits    = 8
	DefaultParity      = "N"
	DefaultStopBits    = 1
	DefaultReadTimeout = 100 * time.Millisecond
)

// tarm/serial expresses the read timeout in tenths of a second (termios
// VTIME), from 1 to 255.
const (
	readTimeoutUnit = 100 * time.Millisecond
	maxReadTimeout  = 255 * readTimeoutUnit
)

// bauds are the rates tarm/serial accepts on Linux.
var bauds = []int{
	50, 75, 110, 134, 150, 200, 300, 600, 1200, 1800, 2400, 4800, 9600,
	19200, 38400, 57600, 115200, 230400, 460800, 500000, 576000, 921600,
	1000000, 1152000, 1500000, 2000000, 2500000, 3000000, 3500000, 4000000,
}

// PortConfig describes one serial port. The zero value of every field but
// Path means its default: 115200 8N1 with a 100 ms read timeout.
type PortConfig struct {
	// Path is the device, for example /dev/ttyUSB0 or a stable udev link
	// under /dev/serial/by-id/. Required.
	Path string

	// Baud is the line rate in bits per second. Default 115200.
	Baud int

	// DataBits is 5, 6, 7 or 8. Default 8.
	DataBits int

	// Parity is "N" (none, default), "E" (even) or "O" (odd).
	Parity string

	// StopBits is 1 (default) or 2.
	StopBits int

	// ReadTimeout bounds one Read: when no byte arrives within it, Read
	// returns ErrReadTimeout. It is also how long Close may wait for a
	// pending Read. tarm/serial counts it in tenths of a second, so it must
	// be a multiple of 100ms between 100ms and 25.5s. Default 100ms.
	ReadTimeout time.Duration
}

// Validate reports whether c can be opened, naming the first bad field.
func (c PortConfig) Validate() error {
	_, err := c.withDefaults()
	return err
}

func (c PortConfig) withDefaults() (PortConfig, error) {
	invalid := func(format string, args ...any) (PortConfig, error) {
		return PortConfig{}, fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	if c.Path == "" {
		return invalid("Path is empty")
	}
	if c.Baud == 0 {
		c.Baud = DefaultBaud
	}
	if !slices.Contains(bauds, c.Baud) {
		return invalid("Baud %d not supported (one of %v)", c.Baud, bauds)
	}
	if c.DataBits == 0 {
		c.DataBits = DefaultDataBits
	}
	if c.DataBits < 5 || c.DataBits > 8 {
		return invalid("DataBits %d not in 5..8", c.DataBits)
	}
	if c.Parity == "" {
		c.Parity = DefaultParity
	}
	if c.Parity != "N" && c.Parity != "E" && c.Parity != "O" {
		return invalid("Parity %q not one of \"N\", \"E\", \"O\"", c.Parity)
	}
	if c.StopBits == 0 {
		c.StopBits = DefaultStopBits
	}
	if c.StopBits != 1 && c.StopBits != 2 {
		return invalid("StopBits %d not 1 or 2", c.StopBits)
	}
	if c.ReadTimeout == 0 {
		c.ReadTimeout = DefaultReadTimeout
	}
	if c.ReadTimeout < readTimeoutUnit || c.ReadTimeout > maxReadTimeout || c.ReadTimeout%readTimeoutUnit != 0 {
		return invalid("ReadTimeout %v not a multiple of 100ms in 100ms..25.5s (tarm/serial counts tenths of a second)", c.ReadTimeout)
	}
	return c, nil
}

// A Port is one open serial port (tarm/serial underneath) with its traps
// handled: Read reports a timeout as ErrReadTimeout and a hung-up tty as
// ErrPortGone instead of (0, io.EOF); Close never runs while a Read is
// blocked; and the device is locked against a second opener. One goroutine
// may Read while another Writes or Closes.
type Port struct {
	path string
	sp   *tarm.Port
	lk   *portLock

	readMu    sync.Mutex // held by Read; Close takes it so as not to race a Read
	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

// OpenPort validates cfg and opens the port. A path that does not exist
// gives an error wrapping ErrPortMissing; a port another Port holds,
// ErrPortBusy. The error is a *PortError unless the config is invalid.
func OpenPort(cfg PortConfig) (*Port, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	lk, err := lockPort(cfg.Path)
	if err != nil {
		return nil, err
	}
	sp, err := tarm.OpenPort(&tarm.Config{
		// The lock's descriptor, reopened: the very device we locked, even
		// if Path is a symlink that was just replaced.
		Name:        lk.name(),
		Baud:        cfg.Baud,
		ReadTimeout: cfg.ReadTimeout, // never 0: see Close
		Size:        byte(cfg.DataBits),
		Parity:      tarm.Parity(cfg.Parity[0]),
		StopBits:    tarm.StopBits(cfg.StopBits),
	})
	if err != nil {
		lk.close()
		return nil, &PortError{Op: "open", Path: cfg.Path, Kind: openErrKind(err), Err: err}
	}
	return &Port{path: cfg.Path, sp: sp, lk: lk}, nil
}

// Read reads at least one byte, or returns ErrReadTimeout if none arrived
// within the ReadTimeout, an error wrapping ErrPortGone if the tty was hung
// up or failed, or ErrClosed.
func (p *Port) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	p.readMu.Lock()
	defer p.readMu.Unlock()
	if p.closed.Load() {
		return 0, ErrClosed
	}
	n, err := p.sp.Read(b)
	if n > 0 {
		return n, nil
	}
	if err == nil || err == io.EOF {
		// tarm/serial returns (0, io.EOF) both when VTIME expired and,
		// at once, when the tty was hung up. Ask the tty which it was.
		if herr := p.lk.hungUp(); herr != nil {
			return 0, &PortError{Op: "read", Path: p.path, Kind: ErrPortGone, Err: herr}
		}
		return 0, ErrReadTimeout
	}
	if p.closed.Load() {
		return 0, ErrClosed
	}
	return 0, &PortError{Op: "read", Path: p.path, Kind: ErrPortGone, Err: err}
}

// Write writes b. A failure wraps ErrPortGone: on a tty it means the port
// was hung up or the device failed.
func (p *Port) Write(b []byte) (int, error) {
	if p.closed.Load() {
		return 0, ErrClosed
	}
	n, err := p.sp.Write(b)
	if err != nil {
		if p.closed.Load() {
			return n, ErrClosed
		}
		return n, &PortError{Op: "write", Path: p.path, Kind: ErrPortGone, Err: err}
	}
	return n, nil
}

// Close closes the port. It may be called from any goroutine, any number of
// times. It waits for a pending Read to return (at most the ReadTimeout),
// so tarm's Close, which hangs while a Read is blocked, never runs during
// one; the pending Read returns its data or ErrReadTimeout, and later Reads
// return ErrClosed.
func (p *Port) Close() error {
	p.closeOnce.Do(func() {
		p.closed.Store(true)
		p.readMu.Lock()
		defer p.readMu.Unlock()
		p.closeErr = p.sp.Close()
		p.lk.close()
	})
	return p.closeErr
}

// Path returns the configured path of the port.
func (p *Port) Path() string { return p.path }

// openErrKind classifies an error from opening a device.
func openErrKind(err error) error {
	switch {
	case errors.Is(err, ErrPortBusy):
		return ErrPortBusy
	case isMissing(err):
		return ErrPortMissing
	}
	return nil
}
