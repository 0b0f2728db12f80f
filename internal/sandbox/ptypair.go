package sandbox

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"

	"github.com/creack/pty"
)

// PtyPair is a null-modem cable made of two real pseudo-terminals: bytes
// written to one end's path come out of the other's, like socat's
// `pty,raw,echo=0 pty,raw,echo=0`. Each end is a tty path a program opens as
// its serial port (the gateway one end, the device simulator the other).
type PtyPair struct {
	A, B string // the two ends' tty paths

	masters [2]*os.File
	slaves  [2]*os.File
	wg      sync.WaitGroup
	once    sync.Once
}

// NewPtyPair opens two ptys and relays between their masters until Close.
func NewPtyPair() (*PtyPair, error) {
	p := &PtyPair{}
	for i := range 2 {
		m, s, err := OpenPty()
		if err != nil {
			p.Close()
			return nil, err
		}
		p.masters[i] = m
		// Keep the slave open: with no opener the master reads EIO, and the
		// ends come and go as programs open and close their ports.
		p.slaves[i] = s
	}
	p.A, p.B = p.slaves[0].Name(), p.slaves[1].Name()
	p.relay(p.masters[0], p.masters[1])
	p.relay(p.masters[1], p.masters[0])
	return p, nil
}

func (p *PtyPair) relay(from, to *os.File) {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		_, _ = io.Copy(to, from) // ends when Close closes the masters
	}()
}

// Close stops the relay and closes both ptys. Programs with an end open see
// their port hang up.
func (p *PtyPair) Close() error {
	p.once.Do(func() {
		for _, f := range p.masters {
			if f != nil {
				f.Close()
			}
		}
		p.wg.Wait()
		for _, f := range p.slaves {
			if f != nil {
				f.Close()
			}
		}
	})
	return nil
}

// OpenPty opens a pseudo-terminal: its master as a pollable file (so that
// Close and read deadlines interrupt a pending Read) and its slave, in raw
// mode, whose Name() is the tty path a program opens as its serial port.
// The caller closes both.
func OpenPty() (master, slave *os.File, err error) {
	m, s, err := pty.Open()
	if err != nil {
		return nil, nil, fmt.Errorf("sandbox: pty: %w", err)
	}
	if err := makeRaw(s); err != nil {
		m.Close()
		s.Close()
		return nil, nil, err
	}
	fd, err := syscall.Dup(int(m.Fd()))
	if err == nil {
		syscall.CloseOnExec(fd)
		if err = syscall.SetNonblock(fd, true); err != nil {
			syscall.Close(fd)
		}
	}
	m.Close()
	if err != nil {
		s.Close()
		return nil, nil, fmt.Errorf("sandbox: pty master: %w", err)
	}
	return os.NewFile(uintptr(fd), "ptmx"), s, nil
}

// makeRaw puts a tty in raw mode (cfmakeraw): nothing echoed or translated.
func makeRaw(f *os.File) error {
	t, err := tcget(f)
	if err != nil {
		return err
	}
	t.Iflag &^= syscall.IGNBRK | syscall.BRKINT | syscall.PARMRK | syscall.ISTRIP | syscall.INLCR | syscall.IGNCR | syscall.ICRNL | syscall.IXON
	t.Oflag &^= syscall.OPOST
	t.Lflag &^= syscall.ECHO | syscall.ECHONL | syscall.ICANON | syscall.ISIG | syscall.IEXTEN
	t.Cflag &^= syscall.CSIZE | syscall.PARENB
	t.Cflag |= syscall.CS8
	return tcset(f, t)
}

var errTermios = errors.New("sandbox: termios")
