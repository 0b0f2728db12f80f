package serial

import (
	"errors"
	"io/fs"
	"strings"
)

// Sentinel errors. Errors returned by this package wrap them; test with
// errors.Is.
var (
	// ErrInvalidConfig means a PortConfig, ConnConfig or LinkConfig cannot
	// be used; the message names the field.
	ErrInvalidConfig = errors.New("serial: invalid config")

	// ErrPortMissing means the port's path does not exist (no such file, or
	// a device node without its hardware): the USB-serial adapter is
	// unplugged or the udev symlink is gone. A Conn keeps trying.
	ErrPortMissing = errors.New("serial: port missing")

	// ErrPortBusy means another Port (in this process or another) holds the
	// port's lock. tarm/serial opens ports without exclusion; OpenPort
	// takes an advisory flock(2) on the device so that two agents never
	// interleave frames on one line.
	ErrPortBusy = errors.New("serial: port busy")

	// ErrPortGone means an open port failed: the tty was hung up (the
	// adapter was unplugged, or the other end of a pty closed) or an I/O
	// error occurred. The Port is useless; a Conn closes it and reopens the
	// path.
	ErrPortGone = errors.New("serial: port gone")

	// ErrPortDown means a Conn has no open port at the moment (it is
	// reopening it). The error also wraps the reason, for example
	// ErrPortMissing. Nothing was written.
	ErrPortDown = errors.New("serial: port down")

	// ErrReadTimeout is returned by Port.Read and Conn.Read when no byte
	// arrived within the ReadTimeout. It is not a failure: read again. It
	// replaces tarm/serial's (0, io.EOF), which would end a bufio.Reader or
	// io.Copy.
	ErrReadTimeout = errors.New("serial: read timeout (no data yet)")

	// ErrClosed means the Port, Conn or Link was closed.
	ErrClosed = errors.New("serial: closed")

	// ErrTimeout means Link.Do got no response after all its attempts. The
	// outcome is unknown: the device may have applied the request. Retrying
	// with a new Do is a new transaction (a new txid), which a device's
	// duplicate detection does not recognise.
	ErrTimeout = errors.New("serial: no response")

	// ErrFrameSize means a payload is empty or larger than the frame size
	// limit. Nothing was sent.
	ErrFrameSize = errors.New("serial: frame payload size out of range")
)

// PortError reports a failed operation on a port: which operation, which
// path, the kind of failure (one of the sentinels above, or nil) and the
// underlying error. errors.Is matches both Kind and Err, so an unplugged
// adapter at open matches ErrPortMissing and fs.ErrNotExist.
type PortError struct {
	Op   string // "open", "read", "write"
	Path string
	Kind error // ErrPortMissing, ErrPortBusy, ErrPortGone or nil
	Err  error
}

func (e *PortError) Error() string {
	var b strings.Builder
	b.WriteString("serial: ")
	b.WriteString(e.Op)
	b.WriteString(" ")
	b.WriteString(e.Path)
	if e.Kind != nil {
		b.WriteString(": ")
		b.WriteString(strings.TrimPrefix(e.Kind.Error(), "serial: "))
	}
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(errText(e.Err))
	}
	return b.String()
}

// Unwrap returns Kind and Err for errors.Is and errors.As.
func (e *PortError) Unwrap() []error {
	var errs []error
	if e.Kind != nil {
		errs = append(errs, e.Kind)
	}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}

// errText shortens an *fs.PathError to its cause, since PortError already
// names the operation and the path.
func errText(err error) string {
	if pe, ok := err.(*fs.PathError); ok {
		return pe.Err.Error()
	}
	return err.Error()
}
