package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// MosquittoPath is where Debian's mosquitto package installs the broker.
const MosquittoPath = "/usr/sbin/mosquitto"

const (
	mosquittoReadyTimeout = 10 * time.Second
	mosquittoStopGrace    = 5 * time.Second
)

// Mosquitto is the Debian mosquitto broker run as a subprocess on a free
// 127.0.0.1 port (never 1883) with a generated config: anonymous clients
// allowed, no persistence, and TCP_NODELAY (without it Nagle's algorithm
// and delayed ACKs add ~40 ms to a QoS 1 publish→receive). Its address stays the same across Stop/Start and
// Restart.
type Mosquitto struct {
	bin     string
	life    context.Context // bounds every process, as exec.CommandContext does
	dir     string
	tempDir bool // dir was created here and is removed by Close
	addr    string
	conf    string
	sec     string // the security lines of the config

	mu     sync.Mutex
	proc   *childProc // nil while stopped
	closed bool
}

// childProc is a server run as a subprocess (mosquitto, etcd).
type childProc struct {
	cmd    *exec.Cmd
	stderr *tailBuffer   // its stdout and stderr, the last 4 KiB
	done   chan struct{} // closed when the process has exited and been reaped
	err    error         // cmd.Wait's result, valid after done
}

// startChild starts bin in dir with env added to ours; cancelling life
// terminates it (SIGTERM, SIGKILL after mosquittoStopGrace), and so does
// the death of this process (Linux).
func startChild(life context.Context, dir string, env []string, bin string, args ...string) (*childProc, error) {
	cmd := exec.CommandContext(life, bin, args...)
	cmd.Dir = dir
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = mosquittoStopGrace
	setParentDeathSignal(cmd)
	p := &childProc{cmd: cmd, stderr: &tailBuffer{max: 4096}, done: make(chan struct{})}
	cmd.Stdout = p.stderr
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// StartMosquitto writes a config into dir (a new temp dir if dir is "") and
// runs mosquitto with it, returning once the port accepts connections. ctx
// bounds the life of the process, as with exec.CommandContext: cancelling it
// terminates the broker. It returns an error wrapping ErrNoMosquitto when the
// binary is not installed.
func StartMosquitto(ctx context.Context, dir string) (*Mosquitto, error) {
	return StartMosquittoConfig(ctx, MosquittoConfig{Dir: dir})
}

// MosquittoConfig configures StartMosquittoConfig.
type MosquittoConfig struct {
	// Dir holds the generated config; "" means a new temp dir, removed by
	// Close.
	Dir string
	// Security replaces the generated config's "allow_anonymous true" with
	// these lines, e.g. deploy/mosquitto/edgefence.conf's allow_anonymous,
	// password_file and acl_file. The broker then keeps the user it was
	// started as ("user root" when that is root: Mosquitto would otherwise
	// switch to user mosquitto, which cannot read the files in a test's
	// private temp dir).
	Security string
}

// StartMosquittoConfig is StartMosquitto with cfg.
func StartMosquittoConfig(ctx context.Context, cfg MosquittoConfig) (*Mosquitto, error) {
	bin, err := findMosquitto(MosquittoPath)
	if err != nil {
		return nil, err
	}
	dir := cfg.Dir
	sec := cfg.Security
	if sec == "" {
		sec = "allow_anonymous true\n"
	} else if os.Geteuid() == 0 {
		sec = "user root\n" + sec
	}
	m := &Mosquitto{bin: bin, life: ctx, dir: dir, sec: strings.TrimSuffix(sec, "\n") + "\n"}
	if m.dir == "" {
		if m.dir, err = os.MkdirTemp("", "sandbox-mosquitto-"); err != nil {
			return nil, fmt.Errorf("sandbox: mosquitto dir: %w", err)
		}
		m.tempDir = true
	}
	m.conf = filepath.Join(m.dir, "mosquitto.conf")
	for range 3 {
		if err = m.pickPort(); err != nil {
			break
		}
		m.mu.Lock()
		err = m.startLocked(ctx)
		m.mu.Unlock()
		if err == nil {
			return m, nil
		}
		if !addrInUse(err) {
			break
		}
	}
	m.Close()
	return nil, err
}

// MosquittoPasswdPath is where Debian's mosquitto package installs
// mosquitto_passwd.
const MosquittoPasswdPath = "/usr/bin/mosquitto_passwd"

// HashMosquittoPasswords hashes a plain-text "user:password" file in place
// (mosquitto_passwd -U), making it a Mosquitto password_file. It returns an
// error wrapping ErrNoMosquitto when mosquitto_passwd is not installed.
func HashMosquittoPasswords(ctx context.Context, path string) error {
	bin := MosquittoPasswdPath
	if _, err := os.Stat(bin); err != nil {
		if bin, err = exec.LookPath("mosquitto_passwd"); err != nil {
			return fmt.Errorf("%w (apt-get install mosquitto; looked for %s and in PATH)", ErrNoMosquitto, MosquittoPasswdPath)
		}
	}
	if out, err := exec.CommandContext(ctx, bin, "-U", path).CombinedOutput(); err != nil {
		return fmt.Errorf("sandbox: mosquitto_passwd -U %s: %w: %s", path, err, bytes.TrimSpace(out))
	}
	return nil
}

// findMosquitto returns path if it exists, else mosquitto from PATH.
func findMosquitto(path string) (string, error) {
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	if p, err := exec.LookPath("mosquitto"); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("%w (apt-get install mosquitto; looked for %s and in PATH)", ErrNoMosquitto, path)
}

// pickPort chooses a free port other than 1883 and writes the config for it.
func (m *Mosquitto) pickPort() error {
	port := 1883
	for port == 1883 {
		var err error
		if port, err = FreePort(); err != nil {
			return err
		}
	}
	m.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	conf := fmt.Sprintf(`# generated by edgefence internal/sandbox
listener %d 127.0.0.1
persistence false
set_tcp_nodelay true
log_dest stderr
log_type error
log_type warning
log_type notice
%s`, port, m.sec)
	if err := os.WriteFile(m.conf, []byte(conf), 0o644); err != nil {
		return fmt.Errorf("sandbox: mosquitto config: %w", err)
	}
	return nil
}

// Addr returns the listen address, "127.0.0.1:PORT".
func (m *Mosquitto) Addr() string { return m.addr }

// URL returns the broker URL, "mqtt://127.0.0.1:PORT".
func (m *Mosquitto) URL() string { return "mqtt://" + m.addr }

// Start starts a stopped broker again on the same port, returning once the
// port accepts connections or ctx is done. It is a no-op while running and
// returns ErrClosed after Close.
func (m *Mosquitto) Start(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	if m.proc != nil {
		return nil
	}
	return m.startLocked(ctx)
}

// Stop terminates the broker (SIGTERM, then SIGKILL after 5 s) and waits
// for it. Stop on a stopped broker is a no-op.
func (m *Mosquitto) Stop() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stopLocked()
	return nil
}

// Restart stops the broker and starts it again on the same port. Sessions
// and retained messages are lost (persistence is off).
func (m *Mosquitto) Restart(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	m.stopLocked()
	return m.startLocked(ctx)
}

// Close stops the broker and removes the temp dir if StartMosquitto made
// one. It is idempotent.
func (m *Mosquitto) Close() error {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	m.stopLocked()
	if m.tempDir {
		return os.RemoveAll(m.dir)
	}
	return nil
}

func (m *Mosquitto) startLocked(ctx context.Context) error {
	p, err := startChild(m.life, m.dir, nil, m.bin, "-c", m.conf)
	if err != nil {
		return fmt.Errorf("sandbox: start mosquitto: %w", err)
	}
	if err := waitListening(ctx, m.addr, p.done); err != nil {
		stopProc(p)
		out := strings.TrimSpace(p.stderr.String())
		if out != "" {
			err = fmt.Errorf("%w; mosquitto said: %s", err, out)
		}
		if strings.Contains(out, "Address already in use") {
			err = fmt.Errorf("%w (%w)", err, syscall.EADDRINUSE)
		}
		return fmt.Errorf("sandbox: start mosquitto: %w", err)
	}
	m.proc = p
	return nil
}

func (m *Mosquitto) stopLocked() {
	if m.proc == nil {
		return
	}
	stopProc(m.proc)
	m.proc = nil
}

func stopProc(p *childProc) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(mosquittoStopGrace)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// waitListening polls addr until it accepts a connection, the process exits
// (exited is closed), ctx is done or mosquittoReadyTimeout passes.
func waitListening(ctx context.Context, addr string, exited <-chan struct{}) error {
	deadline := time.NewTimer(mosquittoReadyTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	var d net.Dialer
	for {
		dctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		c, err := d.DialContext(dctx, "tcp", addr)
		cancel()
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-exited:
			return errors.New("exited before listening")
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-deadline.C:
			return fmt.Errorf("not listening on %s after %v", addr, mosquittoReadyTimeout)
		case <-tick.C:
		}
	}
}

// tailBuffer keeps the last max bytes written to it; safe for concurrent use.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   bytes.Buffer
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b.Write(p)
	if over := t.b.Len() - t.max; over > 0 {
		t.b.Next(over)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.b.String()
}
