package serial

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/creack/pty"
)

// Tests run against real pseudo-terminals: the gateway side opens the
// slave through tarm/serial, as it would /dev/ttyUSB0, and the simulated
// device reads and writes the master.

// testDeadline bounds every wait in these tests. It only keeps a broken
// test from hanging; nothing is asserted about durations.
const testDeadline = 30 * time.Second

// openPTY returns a new pty's master, pollable so that Close and read
// deadlines interrupt a pending Read, and its slave, in raw mode and held
// open so that the master does not read EIO while no port is open.
func openPTY(t testing.TB) (master, slave *os.File) {
	t.Helper()
	m, s, err := pty.Open()
	if err != nil {
		t.Fatalf("pty.Open: %v", err)
	}
	makeRaw(t, s)
	fd, err := syscall.Dup(int(m.Fd()))
	if err != nil {
		t.Fatalf("dup: %v", err)
	}
	syscall.CloseOnExec(fd)
	if err := syscall.SetNonblock(fd, true); err != nil {
		t.Fatalf("nonblock: %v", err)
	}
	master = os.NewFile(uintptr(fd), m.Name())
	m.Close()
	return master, s
}

// makeRaw puts a tty in raw mode (cfmakeraw), so that nothing is echoed or
// translated before the gateway opens it.
func makeRaw(t testing.TB, f *os.File) {
	t.Helper()
	var tio syscall.Termios
	ioctl := func(req uintptr) {
		if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), req, uintptr(unsafe.Pointer(&tio))); e != 0 {
			t.Fatalf("ioctl %#x: %v", req, e)
		}
	}
	ioctl(syscall.TCGETS)
	tio.Iflag &^= syscall.IGNBRK | syscall.BRKINT | syscall.PARMRK | syscall.ISTRIP | syscall.INLCR | syscall.IGNCR | syscall.ICRNL | syscall.IXON
	tio.Oflag &^= syscall.OPOST
	tio.Lflag &^= syscall.ECHO | syscall.ECHONL | syscall.ICANON | syscall.ISIG | syscall.IEXTEN
	tio.Cflag &^= syscall.CSIZE | syscall.PARENB
	tio.Cflag |= syscall.CS8
	tio.Cc[syscall.VMIN], tio.Cc[syscall.VTIME] = 1, 0
	ioctl(syscall.TCSETS)
}

// adapter simulates a USB-serial adapter that can be unplugged: Path is a
// symlink we control (as udev's /dev/serial/by-id links are), pointing at
// the current pty's slave. Plug creates a new pty and swings the link to it
// atomically (rename of a new symlink); Unplug closes the pty, leaving the
// link dangling, so opening Path fails with ENOENT.
type adapter struct {
	t    testing.TB
	Path string

	mu            sync.Mutex
	master, slave *os.File
	n             int
}

func newAdapter(t testing.TB) *adapter {
	a := &adapter{t: t, Path: filepath.Join(t.TempDir(), "ttyUSB0")}
	t.Cleanup(a.Unplug)
	return a
}

// Plug connects a new pty and returns its master (the device's end).
func (a *adapter) Plug() *os.File {
	a.t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.master != nil {
		a.t.Fatal("adapter already plugged")
	}
	a.master, a.slave = openPTY(a.t)
	a.n++
	tmp := a.Path + ".new"
	_ = os.Remove(tmp)
	if err := os.Symlink(a.slave.Name(), tmp); err != nil {
		a.t.Fatalf("symlink: %v", err)
	}
	if err := os.Rename(tmp, a.Path); err != nil {
		a.t.Fatalf("rename: %v", err)
	}
	return a.master
}

// Unplug closes the current pty: the gateway's port is hung up.
func (a *adapter) Unplug() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.master == nil {
		return
	}
	a.master.Close()
	a.slave.Close()
	a.master, a.slave = nil, nil
}

// device runs a Responder on pty masters, one after another, as a device
// whose adapter is unplugged and plugged again: each master given to Serve
// is served until it is closed, and the Responder's memory carries over.
type device struct {
	R       *Responder
	masters chan *os.File
	cancel  context.CancelFunc
	done    chan struct{}
	mu      sync.Mutex
	errs    []error
}

func startDevice(t testing.TB, r *Responder, first io.ReadWriter) *device {
	ctx, cancel := context.WithCancel(context.Background())
	d := &device{R: r, masters: make(chan *os.File, 8), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(d.done)
		port := first
		for {
			err := r.Serve(ctx, port)
			if ctx.Err() != nil {
				return
			}
			if err != nil && !errors.Is(err, os.ErrClosed) && !errors.Is(err, syscall.EIO) {
				d.mu.Lock()
				d.errs = append(d.errs, err)
				d.mu.Unlock()
			}
			select {
			case m := <-d.masters:
				port = m
			case <-ctx.Done():
				return
			}
		}
	}()
	t.Cleanup(func() { d.Stop(t) })
	return d
}

// Serve hands the device the master of a replugged adapter.
func (d *device) Serve(m *os.File) { d.masters <- m }

// Stop stops the device and fails the test on unexpected Serve errors.
func (d *device) Stop(t testing.TB) {
	d.cancel()
	select {
	case <-d.done:
	case <-time.After(testDeadline):
		t.Fatal("device did not stop")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, err := range d.errs {
		t.Errorf("device Serve: %v", err)
	}
	d.errs = nil
}

// waitFor polls cond until it holds, failing the test at testDeadline.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testDeadline)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	t.Cleanup(cancel)
	return ctx
}
