package serial

import (
	"errors"
	"io/fs"
	"strconv"
	"syscall"
	"unsafe"
)

// portLock is a descriptor of our own on the device, held as long as the
// Port is open. It carries an exclusive flock(2) (tarm/serial opens without
// any exclusion; an advisory lock also works for root, unlike TIOCEXCL),
// and lets Read ask the tty whether it was hung up, which tarm's *os.File
// hides.
type portLock struct {
	fd int
}

func lockPort(path string) (*portLock, error) {
	fd, err := syscall.Open(path, syscall.O_RDWR|syscall.O_NOCTTY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, &PortError{Op: "open", Path: path, Kind: openErrKind(err), Err: err}
	}
	if err := syscall.Flock(fd, syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		syscall.Close(fd)
		kind := error(nil)
		if errors.Is(err, syscall.EWOULDBLOCK) {
			kind = ErrPortBusy
		}
		return nil, &PortError{Op: "open", Path: path, Kind: kind, Err: err}
	}
	return &portLock{fd: fd}, nil
}

// name is a path that opens the locked device itself.
func (l *portLock) name() string { return "/proc/self/fd/" + strconv.Itoa(l.fd) }

// hungUp returns an error if the tty can no longer be used. After a hangup
// (the adapter was unplugged, or a pty's master closed) every descriptor of
// the tty reads 0 bytes at once and fails ioctls with EIO.
func (l *portLock) hungUp() error {
	var t syscall.Termios
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, uintptr(l.fd), syscall.TCGETS, uintptr(unsafe.Pointer(&t)))
	if errno != 0 {
		return errno
	}
	return nil
}

func (l *portLock) close() { syscall.Close(l.fd) }

// isMissing reports whether an open error means the device is not there:
// no such file (a dangling udev or test symlink), or a node without its
// hardware.
func isMissing(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENXIO) || errors.Is(err, syscall.ENODEV)
}
