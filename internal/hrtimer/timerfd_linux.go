package hrtimer

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// errUnsupported means the system has no timerfd.
var errUnsupported = errors.New("hrtimer: no timerfd on this system")

// timerfd waits by reading a non-blocking timerfd through the runtime's
// poller: os.NewFile registers a non-blocking descriptor with it, so a Read
// that would block parks the goroutine until epoll reports the expiry.
type timerfd struct {
	f   *os.File
	rc  syscall.RawConn
	buf [8]byte // the expiry count a read returns
	// closed is set by close: the file's own errors after it differ by
	// call (a RawConn's is not os.ErrClosed).
	closed atomic.Bool
}

func newTimerfd() (*timerfd, error) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("hrtimer: %w", os.NewSyscallError("timerfd_create", err))
	}
	f := os.NewFile(uintptr(fd), "timerfd")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("hrtimer: %w", err)
	}
	return &timerfd{f: f, rc: rc}, nil
}

// arm sets the timer to expire once after d (0 disarms it). Setting it
// also zeroes the count of expiries not yet read, so a tick left over from
// a cancelled wait never ends the next one early.
func (t *timerfd) arm(d time.Duration) error {
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(int64(d))}
	var serr error
	err := t.rc.Control(func(fd uintptr) { serr = unix.TimerfdSettime(int(fd), 0, &spec, nil) })
	switch {
	case err != nil && t.closed.Load():
		return ErrClosed
	case err != nil:
		return fmt.Errorf("hrtimer: %w", err)
	case serr != nil:
		return fmt.Errorf("hrtimer: %w", os.NewSyscallError("timerfd_settime", serr))
	}
	return nil
}

func (t *timerfd) wait(ctx context.Context, d time.Duration) error {
	if err := t.arm(d); err != nil {
		return err
	}
	if ctx.Done() != nil {
		// A cancel ends the Read through a deadline in the past; the
		// deadline is cleared again before the next wait.
		fired := make(chan struct{})
		stop := context.AfterFunc(ctx, func() {
			_ = t.f.SetReadDeadline(time.Unix(1, 0))
			close(fired)
		})
		defer func() {
			if !stop() {
				<-fired
				_ = t.f.SetReadDeadline(time.Time{})
			}
		}()
	}
	for {
		n, err := t.f.Read(t.buf[:])
		switch {
		case n == len(t.buf):
			return nil
		case errors.Is(err, os.ErrDeadlineExceeded):
			_ = t.arm(0)
			return ctx.Err()
		case errors.Is(err, os.ErrClosed) || (err != nil && t.closed.Load()):
			return ErrClosed
		case err != nil:
			return fmt.Errorf("hrtimer: read: %w", err)
		}
	}
}

func (t *timerfd) close() error {
	t.closed.Store(true)
	if err := t.f.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
		return fmt.Errorf("hrtimer: %w", err)
	}
	return nil
}
