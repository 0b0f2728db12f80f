package modbustest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// PtyPair is a null-modem cable of two ptys made by socat (`socat -d -d
// pty,raw,echo=0,link=A pty,raw,echo=0,link=B`): what is written to A comes
// out of B and back. Either end may be closed and opened again (a slave
// restarted) without breaking the pair. A pty ignores the baud rate.
//
// Unplug ends socat, as pulling a USB adapter does: both ends hang up and
// their paths disappear; Replug makes a new pair at the same paths.
type PtyPair struct {
	A, B string // the two ends' paths (symlinks to /dev/pts/N)

	mu  sync.Mutex
	cmd *exec.Cmd
}

// NewPtyPair starts socat; it is killed when the test ends.
func NewPtyPair(t testing.TB) *PtyPair {
	t.Helper()
	Require(t)
	dir := t.TempDir()
	p := &PtyPair{A: filepath.Join(dir, "ptyA"), B: filepath.Join(dir, "ptyB")}
	p.Replug(t)
	t.Cleanup(p.Unplug)
	return p
}

// Unplug ends the pair: programs with an end open see it hang up, and the
// paths are gone until Replug.
func (p *PtyPair) Unplug() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM) // socat removes its links
	_ = p.cmd.Wait()
	_ = os.Remove(p.A)
	_ = os.Remove(p.B)
	p.cmd = nil
}

// Replug starts socat (again) with ends at A and B.
func (p *PtyPair) Replug(t testing.TB) {
	t.Helper()
	p.Unplug()
	cmd := exec.Command("socat", "-d", "-d", "pty,raw,echo=0,link="+p.A, "pty,raw,echo=0,link="+p.B)
	stderr := &Buffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("modbustest: socat: %v", err)
	}
	// The links appear before socat has set the ptys raw: a port opened
	// in between gets its termios (tarm/serial's VMIN 0, VTIME n) replaced
	// by raw's (VMIN 1, VTIME 0), and its reads then block for ever. socat
	// says when both ends are set up: it starts its transfer loop.
	deadline := time.Now().Add(startWait)
	for {
		_, errA := os.Stat(p.A)
		_, errB := os.Stat(p.B)
		if errA == nil && errB == nil && stderr.contains("starting data transfer loop") {
			break
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("modbustest: socat made no pty pair in %v: %s", startWait, stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	p.mu.Lock()
	p.cmd = cmd
	p.mu.Unlock()
}

// Buffer is a bytes.Buffer that one side may write while another reads
// it: socat's stderr here, a bus's log in transport/modbus's tests.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *Buffer) contains(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return bytes.Contains(l.b.Bytes(), []byte(s))
}

func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
