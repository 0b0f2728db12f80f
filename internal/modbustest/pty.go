package modbustest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// PtyPair is a null-modem cable of two ptys made by socat (`socat -d -d
// pty,raw,echo=0,link=A pty,raw,echo=0,link=B`): what is written to A comes
// out of B and back. Either end may be closed and opened again (a slave
// restarted) without breaking the pair. A pty ignores the baud rate.
type PtyPair struct {
	A, B string // the two ends' paths (symlinks to /dev/pts/N)
}

// NewPtyPair starts socat; it is killed when the test ends.
func NewPtyPair(t testing.TB) *PtyPair {
	t.Helper()
	Require(t)
	dir := t.TempDir()
	p := &PtyPair{A: filepath.Join(dir, "ptyA"), B: filepath.Join(dir, "ptyB")}
	cmd := exec.Command("socat", "-d", "-d", "pty,raw,echo=0,link="+p.A, "pty,raw,echo=0,link="+p.B)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("modbustest: socat: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	deadline := time.Now().Add(startWait)
	for {
		_, errA := os.Stat(p.A)
		_, errB := os.Stat(p.B)
		if errA == nil && errB == nil {
			return p
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("modbustest: socat made no pty pair in %v: %s", startWait, stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
