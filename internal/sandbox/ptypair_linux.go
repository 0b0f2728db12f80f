package sandbox

import (
	"fmt"
	"os"
	"syscall"
	"unsafe"
)

func tcget(f *os.File) (*syscall.Termios, error) {
	var t syscall.Termios
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), syscall.TCGETS, uintptr(unsafe.Pointer(&t))); e != 0 {
		return nil, fmt.Errorf("%w: get: %v", errTermios, e)
	}
	return &t, nil
}

func tcset(f *os.File, t *syscall.Termios) error {
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), syscall.TCSETS, uintptr(unsafe.Pointer(t))); e != 0 {
		return fmt.Errorf("%w: set: %v", errTermios, e)
	}
	return nil
}
