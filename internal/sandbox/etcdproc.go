package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Where Debian's packages install etcd: etcd-server and etcd-client
// (3.4.23 on Debian 12).
const (
	EtcdBinPath  = "/usr/bin/etcd"
	EtcdctlPath  = "/usr/bin/etcdctl"
	etcdProcWait = 30 * time.Second // readiness, as DefaultStartTimeout
)

// EtcdProcConfig configures an etcd run from its binary. Dir is required.
type EtcdProcConfig struct {
	// Dir is the data dir; Restart keeps it, Wipe empties it.
	Dir string
	// Bin is the etcd binary; "" means EtcdBinPath, else etcd in PATH.
	Bin string
	// Fast: heartbeat 10 ms, election 100 ms, as EtcdConfig.Fast.
	Fast bool
	// ClientAddr is the client listen address, "HOST:PORT"; "" picks
	// 127.0.0.1 and a free port.
	ClientAddr string
}

// EtcdProc is a single-node etcd run from a binary — Debian's etcd-server,
// another version than the embedded one — as a subprocess on loopback. Its
// endpoint stays the same across Restart and Wipe. Close stops it; the
// death of the test process does too (Linux).
type EtcdProc struct {
	cfg        EtcdProcConfig
	bin        string
	life       context.Context
	clientAddr string
	peerAddr   string

	mu     sync.Mutex
	proc   *childProc // nil while stopped
	closed bool
}

// StartEtcdProc starts etcd and returns once it serves requests. ctx bounds
// the life of the process, as with exec.CommandContext. It returns an error
// wrapping ErrNoEtcd when the binary is not installed.
func StartEtcdProc(ctx context.Context, cfg EtcdProcConfig) (*EtcdProc, error) {
	if cfg.Dir == "" {
		return nil, errors.New("sandbox: etcd process: Dir is required")
	}
	bin, err := findEtcd(cfg.Bin)
	if err != nil {
		return nil, err
	}
	var lastErr error
	for range 3 {
		clientAddr, clientPicked, err := resolveAddr(cfg.ClientAddr)
		if err != nil {
			return nil, err
		}
		peerAddr, _, err := resolveAddr("")
		if err != nil {
			return nil, err
		}
		e := &EtcdProc{cfg: cfg, bin: bin, life: ctx, clientAddr: clientAddr, peerAddr: peerAddr}
		e.mu.Lock()
		err = e.startLocked(ctx)
		e.mu.Unlock()
		if err == nil {
			return e, nil
		}
		lastErr = err
		if !addrInUse(err) || (!clientPicked && strings.Contains(err.Error(), clientAddr)) {
			break
		}
	}
	return nil, lastErr
}

// findEtcd returns bin, or EtcdBinPath if it exists, else etcd from PATH.
func findEtcd(bin string) (string, error) {
	if bin != "" {
		return bin, nil
	}
	if _, err := os.Stat(EtcdBinPath); err == nil {
		return EtcdBinPath, nil
	}
	if p, err := exec.LookPath("etcd"); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("%w (apt-get install etcd-server; looked for %s and in PATH)", ErrNoEtcd, EtcdBinPath)
}

// FindEtcdctl returns EtcdctlPath if it exists, else etcdctl from PATH, or
// an error wrapping ErrNoEtcd.
func FindEtcdctl() (string, error) {
	if _, err := os.Stat(EtcdctlPath); err == nil {
		return EtcdctlPath, nil
	}
	if p, err := exec.LookPath("etcdctl"); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("%w: no etcdctl (apt-get install etcd-client; looked for %s and in PATH)", ErrNoEtcd, EtcdctlPath)
}

// Endpoint returns the client URL, "http://127.0.0.1:PORT".
func (e *EtcdProc) Endpoint() string { return "http://" + e.clientAddr }

// Endpoints returns Endpoint as a slice, for clientv3.Config.Endpoints.
func (e *EtcdProc) Endpoints() []string { return []string{e.Endpoint()} }

// Dir returns the data dir.
func (e *EtcdProc) Dir() string { return e.cfg.Dir }

// Version returns what `etcd --version` says its version is ("3.4.23").
func (e *EtcdProc) Version() (string, error) {
	out, err := exec.Command(e.bin, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("sandbox: %s --version: %w", e.bin, err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(line, "etcd Version:"); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("sandbox: %s --version: no version in %q", e.bin, out)
}

// Client returns a new etcd client for this server with a silent logger and
// a 5 s dial timeout. The caller closes it.
func (e *EtcdProc) Client() (*clientv3.Client, error) {
	c, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("sandbox: etcd client: %w", err)
	}
	return c, nil
}

// Restart stops etcd and starts it again on the same ports and data dir.
func (e *EtcdProc) Restart(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return restartServer(ctx, e.closed, e.stopLocked, e.startLocked, "")
}

// Wipe stops etcd, empties its data dir and starts a new cluster on the
// same ports: every key and lease is gone and revisions start again at 1,
// as after a rebuild from nothing.
func (e *EtcdProc) Wipe(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return restartServer(ctx, e.closed, e.stopLocked, e.startLocked, e.cfg.Dir)
}

// Close stops etcd (SIGTERM, then SIGKILL) and waits for it; idempotent.
// The data dir stays.
func (e *EtcdProc) Close() error {
	if e == nil {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	e.stopLocked()
	return nil
}

func (e *EtcdProc) stopLocked() {
	if e.proc != nil {
		stopProc(e.proc)
		e.proc = nil
	}
}

func (e *EtcdProc) startLocked(ctx context.Context) error {
	client, peer := "http://"+e.clientAddr, "http://"+e.peerAddr
	args := []string{
		"--name", "sandbox", "--data-dir", e.cfg.Dir,
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "sandbox=" + peer, "--initial-cluster-token", "edgefence-sandbox",
		"--logger", "zap", "--log-level", "warn",
	}
	if e.cfg.Fast {
		args = append(args, "--heartbeat-interval", "10", "--election-timeout", "100")
	}
	// etcd 3.4 refuses to start on arm64 and others unless told so.
	p, err := startChild(e.life, "", []string{"ETCD_UNSUPPORTED_ARCH=" + runtime.GOARCH}, e.bin, args...)
	if err != nil {
		return fmt.Errorf("sandbox: start etcd %s: %w", e.bin, err)
	}
	if err := e.waitReady(ctx, p); err != nil {
		stopProc(p)
		out := strings.TrimSpace(p.stderr.String()) // "address already in use" for addrInUse
		return fmt.Errorf("sandbox: start etcd %s on %s: %w; etcd said: %s", e.bin, e.clientAddr, err, out)
	}
	e.proc = p
	return nil
}

// waitReady waits until etcd answers a linearizable read: it listens and
// has elected itself leader.
func (e *EtcdProc) waitReady(ctx context.Context, p *childProc) error {
	ctx, cancel := context.WithTimeout(ctx, etcdProcWait)
	defer cancel()
	if err := waitListening(ctx, e.clientAddr, p.done); err != nil {
		return err
	}
	cli, err := e.Client()
	if err != nil {
		return err
	}
	defer cli.Close()
	return awaitRead(ctx, cli, p.done)
}

// awaitRead waits, within ctx, until cli answers a linearizable read
// (etcd listens and has a leader). A close of exited (nil: never) ends the
// wait: the process died.
func awaitRead(ctx context.Context, cli *clientv3.Client, exited <-chan struct{}) error {
	for {
		rctx, rcancel := context.WithTimeout(ctx, time.Second)
		_, err := cli.Get(rctx, "health")
		rcancel()
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return errors.New("exited before ready")
		case <-ctx.Done():
			return fmt.Errorf("not ready: %w", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// NewEtcdProc starts an etcd from its binary for a test (cfg.Dir defaults
// to a temp dir) and closes it at the test's cleanup. Without the binary it
// skips the test, unless CI=true, where it fails: `make deps` installs it.
func NewEtcdProc(t testing.TB, cfg EtcdProcConfig) *EtcdProc {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	e, err := StartEtcdProc(t.Context(), cfg)
	if errors.Is(err, ErrNoEtcd) {
		missingBinary(t, err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// NeedEtcd returns the path of Debian's etcd (or etcd from PATH) for a
// test; without it, it skips the test, unless CI=true, where it fails.
func NeedEtcd(t testing.TB) string {
	t.Helper()
	p, err := findEtcd("")
	if err != nil {
		missingBinary(t, err)
	}
	return p
}

// NeedEtcdctl returns the path of etcdctl for a test; without it, it skips
// the test, unless CI=true, where it fails.
func NeedEtcdctl(t testing.TB) string {
	t.Helper()
	p, err := FindEtcdctl()
	if err != nil {
		missingBinary(t, err)
	}
	return p
}

func missingBinary(t testing.TB, err error) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("required under CI=true (make deps installs it): %v", err)
	}
	t.Skipf("skipped: %v (make deps installs it)", err)
}
