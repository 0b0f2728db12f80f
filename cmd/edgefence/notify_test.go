package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgefence/edgefence/devices/sandbox"
)

// sdSocket is a NOTIFY_SOCKET the test listens on, as systemd would.
type sdSocket struct {
	path string
	conn *net.UnixConn
	msgs chan string
	done chan struct{}
}

func listenNotify(t *testing.T) *sdSocket {
	t.Helper()
	// sun_path is 108 bytes: t.TempDir() can be longer.
	dir, err := os.MkdirTemp("", "sd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	s := &sdSocket{path: path, conn: conn, msgs: make(chan string, 1024), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		buf := make([]byte, 64<<10)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				close(s.msgs)
				return
			}
			s.msgs <- string(buf[:n])
		}
	}()
	t.Cleanup(func() { conn.Close(); <-s.done })
	return s
}

// next returns the next message, failing the test after timeout.
func (s *sdSocket) next(t *testing.T, timeout time.Duration) string {
	t.Helper()
	select {
	case m, ok := <-s.msgs:
		if !ok {
			t.Fatal("notify socket closed")
		}
		return m
	case <-time.After(timeout):
		t.Fatalf("no notify message within %v", timeout)
		return ""
	}
}

// The agent under a fake systemd: READY=1 with a STATUS line, STATUS
// updates naming the devices held, WATCHDOG=1 pings at half WATCHDOG_USEC,
// and on SIGTERM STOPPING=1 and exit 0.
func TestSystemdNotify(t *testing.T) {
	e := newEnv(t, "dev-1", "dev-2", "dev-3")
	cfg, sock := e.config("gw-1", 10*time.Second)
	sd := listenNotify(t)
	env := append(subprocEnv(), "NOTIFY_SOCKET="+sd.path, "WATCHDOG_USEC=2000000", "WATCHDOG_PID=")
	p, err := startProc("gw-1", e, env, "run", "--config", cfg)
	if err != nil {
		t.Fatal(err)
	}

	var got []string
	ready, pings, holding := -1, 0, false
	deadline := time.Now().Add(30 * time.Second)
	for ready < 0 || pings < 2 || !holding {
		if time.Now().After(deadline) {
			t.Fatalf("after 30 s: ready at %d, %d pings, status holding 3/3: %v; messages %q", ready, pings, holding, got)
		}
		m := sd.next(t, 30*time.Second)
		got = append(got, m)
		switch {
		case strings.HasPrefix(m, "READY=1\n"):
			if ready >= 0 {
				t.Errorf("a second READY=1: %q", got)
			}
			ready = len(got) - 1
			if !strings.Contains(m, "\nSTATUS=holding ") || !strings.Contains(m, "etcd session up") {
				t.Errorf("READY without a STATUS naming the leases and etcd session: %q", m)
			}
		case m == "WATCHDOG=1":
			pings++
		case strings.HasPrefix(m, "STATUS="):
			if ready < 0 {
				t.Errorf("STATUS before READY: %q", got)
			}
			holding = holding || strings.HasPrefix(m, "STATUS=holding 3/3 devices; mqtt connected; etcd session up")
		case strings.HasPrefix(m, "STOPPING=1"):
			t.Fatalf("STOPPING before SIGTERM: %q", got)
		default:
			t.Errorf("unexpected notify message %q", m)
		}
	}
	if !strings.Contains(got[ready], "mqtt connected") && !strings.Contains(got[ready], "offline start") {
		t.Errorf("READY with neither the broker connected nor an offline start: %q", got[ready])
	}
	// The agent answers while it says it is ready.
	if st, r := status(t, sock); st == nil {
		t.Fatalf("status\n%s", r)
	}

	if err := p.Stop(30 * time.Second); err != nil { // SIGTERM
		t.Fatalf("after SIGTERM: %v, want exit 0", err)
	}
	// Every datagram the agent sent is queued on the socket by now.
	var stopping []string
	for {
		select {
		case m := <-sd.msgs:
			got = append(got, m)
			if strings.HasPrefix(m, "STOPPING=1") {
				stopping = append(stopping, m)
			} else if strings.HasPrefix(m, "STATUS=") && len(stopping) > 0 {
				t.Errorf("STATUS after STOPPING: %q", got)
			}
			continue
		case <-time.After(200 * time.Millisecond):
		}
		break
	}
	t.Logf("notify messages: %q", got)
	if len(stopping) != 1 || !strings.Contains(stopping[0], "STATUS=stopping") {
		t.Fatalf("want one STOPPING=1 (with a STATUS) after SIGTERM; messages %q", got)
	}
}

// startProc is env.startAgent with extra environment.
func startProc(name string, e *env, env []string, args ...string) (*sandbox.Proc, error) {
	p, err := sandbox.StartProc(name, filepath.Join(e.dir, name+".log"), env, os.Args[0], args...)
	if err != nil {
		return nil, err
	}
	e.t.Cleanup(func() { _ = p.Stop(10 * time.Second) })
	return p, nil
}

// recorder is a fake sd_notify for in-process tests.
type recorder struct {
	mu   sync.Mutex
	msgs []string
	ch   chan string
}

func newRecorder() *recorder { return &recorder{ch: make(chan string, 4096)} }

func (r *recorder) send(s string) error {
	r.mu.Lock()
	r.msgs = append(r.msgs, s)
	r.mu.Unlock()
	r.ch <- s
	return nil
}

func (r *recorder) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.msgs)
}

// waitMsg waits for a message with prefix and returns it.
func (r *recorder) waitMsg(t *testing.T, prefix string) string {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case m := <-r.ch:
			if strings.HasPrefix(m, prefix) {
				return m
			}
		case <-timeout:
			t.Fatalf("no %q within 10 s; messages %q", prefix, r.all())
		}
	}
}

func discardLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// runNotifier runs n until the test ends.
func runNotifier(t *testing.T, n *notifier) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		n.run(ctx)
	}()
	t.Cleanup(func() { cancel(); <-done })
}

func closed() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// The watchdog pings only while the agent is healthy: a stalled Run loop
// (agent.Healthy failing, see agent/systemd_test.go) stops them, so that
// systemd restarts the service; they resume once it is healthy again.
func TestNotifierWatchdogOnlyWhileHealthy(t *testing.T) {
	const interval = 10 * time.Millisecond
	var sick atomic.Bool
	rec := newRecorder()
	n := &notifier{send: rec.send, log: discardLog(), campaigning: closed(), brokerUp: closed(),
		status: func() string { return "holding 1/1 devices" }, watchdog: interval,
		healthy: func() error {
			if sick.Load() {
				return errors.New("run loop last beat 1m ago")
			}
			return nil
		}}
	runNotifier(t, n)
	rec.waitMsg(t, "READY=1\nSTATUS=holding 1/1 devices")
	rec.waitMsg(t, "WATCHDOG=1")
	rec.waitMsg(t, "WATCHDOG=1")

	sick.Store(true)
	// A ping already past its health check may still follow: let it out.
	time.Sleep(5 * interval)
	before := len(rec.all())
	time.Sleep(30 * interval)
	if after := rec.all()[before:]; slices.Contains(after, "WATCHDOG=1") {
		t.Fatalf("pings while unhealthy: %q", after)
	}

	sick.Store(false)
	rec.waitMsg(t, "WATCHDOG=1")
}

// READY waits for the first etcd session and the broker, but no longer
// than the bound: an offline start is ready, and says so.
func TestNotifierReady(t *testing.T) {
	t.Run("waits for campaigning and the broker", func(t *testing.T) {
		campaigning, broker := make(chan struct{}), make(chan struct{})
		rec := newRecorder()
		runNotifier(t, &notifier{send: rec.send, log: discardLog(), campaigning: campaigning, brokerUp: broker,
			bound: time.Hour, every: time.Millisecond, status: func() string { return "up" }, healthy: func() error { return nil }})
		close(broker)
		time.Sleep(20 * time.Millisecond)
		if m := rec.all(); len(m) != 0 {
			t.Fatalf("notified before campaigning began: %q", m)
		}
		close(campaigning)
		if m := rec.waitMsg(t, "READY=1"); m != "READY=1\nSTATUS=up" {
			t.Fatalf("got %q", m)
		}
	})
	t.Run("offline start after the bound", func(t *testing.T) {
		rec := newRecorder()
		runNotifier(t, &notifier{send: rec.send, log: discardLog(), campaigning: make(chan struct{}), brokerUp: make(chan struct{}),
			bound: 20 * time.Millisecond, status: func() string { return "holding 0/2 devices" }, healthy: func() error { return nil }})
		m := rec.waitMsg(t, "READY=1")
		if want := "READY=1\nSTATUS=holding 0/2 devices; offline start (etcd session not open yet, broker not connected yet)"; m != want {
			t.Fatalf("got %q, want %q", m, want)
		}
	})
}

// STATUS follows changes; after STOPPING=1 (sent once) it is left alone.
func TestNotifierStatusAndStopping(t *testing.T) {
	var st atomic.Value
	st.Store("holding 0/1 devices")
	rec := newRecorder()
	n := &notifier{send: rec.send, log: discardLog(), campaigning: closed(), brokerUp: closed(),
		every: time.Millisecond, status: func() string { return st.Load().(string) }, healthy: func() error { return nil }}
	runNotifier(t, n)
	rec.waitMsg(t, "READY=1\nSTATUS=holding 0/1 devices")
	st.Store("holding 1/1 devices")
	rec.waitMsg(t, "STATUS=holding 1/1 devices")
	n.stopping()
	n.stopping()
	st.Store("holding 0/1 devices")
	time.Sleep(20 * time.Millisecond)
	var stops int
	for i, m := range rec.all() {
		if strings.HasPrefix(m, "STOPPING=1") {
			stops++
			if rest := rec.all()[i+1:]; len(rest) != 0 {
				t.Errorf("messages after STOPPING: %q", rest)
			}
		}
	}
	if stops != 1 {
		t.Fatalf("STOPPING sent %d times, want once: %q", stops, rec.all())
	}
}

// Without NOTIFY_SOCKET the notifications are no-ops.
func TestNotifyWithoutSocket(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	t.Setenv("WATCHDOG_USEC", "")
	if err := systemdNotify("READY=1"); err != nil {
		t.Fatal(err)
	}
	if d := watchdogInterval(discardLog()); d != 0 {
		t.Fatalf("watchdog interval %v without WATCHDOG_USEC", d)
	}
	t.Setenv("WATCHDOG_USEC", "30000000")
	if d := watchdogInterval(discardLog()); d != 15*time.Second {
		t.Fatalf("watchdog interval %v for WatchdogSec=30s, want 15s", d)
	}
}

// systemd-analyze verify accepts deploy/edgefence.service. ExecStart must
// name an executable file, so the unit is verified as a copy that runs this
// test binary instead of /usr/bin/edgefence.
func TestUnitVerify(t *testing.T) {
	unit, err := os.ReadFile("../../deploy/edgefence.service")
	if err != nil {
		t.Fatal(err)
	}
	exec0 := "ExecStart=/usr/bin/edgefence run --config " + defaultConfig + "\n"
	if !bytes.Contains(unit, []byte(exec0)) {
		t.Fatalf("the unit does not run %q (the default config path of `edgefence run`)", exec0)
	}
	for _, want := range []string{"Type=notify\n", "NotifyAccess=main\n", "WatchdogSec=30s\n", "StateDirectory=edgefence\n",
		"RuntimeDirectory=edgefence\n", "ConfigurationDirectory=edgefence\n", "Restart=on-failure\n", "DynamicUser=yes\n",
		"SupplementaryGroups=dialout\n", "CapabilityBoundingSet=\n", "NoNewPrivileges=yes\n", "ProtectSystem=strict\n"} {
		if !bytes.Contains(unit, []byte(want)) {
			t.Errorf("the unit lacks %q", strings.TrimSpace(want))
		}
	}
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("systemd-analyze is required in CI (apt-get install systemd): %v", err)
		}
		t.Skipf("systemd-analyze not installed: %v", err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "edgefence.service")
	copyUnit := bytes.Replace(unit, []byte("ExecStart=/usr/bin/edgefence "), []byte("ExecStart="+self+" "), 1)
	if err := os.WriteFile(path, copyUnit, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, sa, "verify", path).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) != 0 {
		t.Fatalf("systemd-analyze verify: %v; want exit 0 and no warnings:\n%s", err, out)
	}
}

// With etcd auth the agent cannot start before etcd answers (clientv3
// authenticates when the client is made). While it waits it tells systemd
// why, extends the start timeout and pings the watchdog, so that a gateway
// booting with its uplink down is not failed by TimeoutStartSec/WatchdogSec
// and then given up by StartLimitBurst; SIGTERM while waiting is a clean
// exit 0.
func TestEtcdAuthWaitNotifies(t *testing.T) {
	dir := t.TempDir()
	etcdPort, err := sandbox.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	mqttPort, err := sandbox.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "gw.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, `gateway: gw-auth
state_dir: %q
etcd:
  endpoints: ["http://127.0.0.1:%d"]
  username: gw-auth
  dial_timeout: 1s
mqtt:
  brokers: ["mqtt://127.0.0.1:%d"]
api:
  socket: %q
devices:
  - id: dev-1
`, filepath.Join(dir, "state"), etcdPort, mqttPort, filepath.Join(dir, "gw.sock")), 0o644); err != nil {
		t.Fatal(err)
	}
	sd := listenNotify(t)
	env := append(subprocEnv(), "NOTIFY_SOCKET="+sd.path, "EDGEFENCE_ETCD_PASSWORD=secret")
	p, err := sandbox.StartProc("gw-auth", filepath.Join(dir, "gw.log"), env, os.Args[0], "run", "--config", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(10 * time.Second) })
	m := sd.next(t, 30*time.Second)
	if !strings.HasPrefix(m, "STATUS=starting: etcd unreachable: waiting to authenticate as gw-auth\n") ||
		!strings.Contains(m, "\nEXTEND_TIMEOUT_USEC=") || !strings.Contains(m, "\nWATCHDOG=1") {
		t.Fatalf("first notify message %q: want the reason, EXTEND_TIMEOUT_USEC and WATCHDOG=1", m)
	}
	if strings.Contains(m, "secret") {
		t.Fatalf("the password in a notify message: %q", m)
	}
	if m := sd.next(t, 30*time.Second); !strings.HasPrefix(m, "STATUS=starting: etcd unreachable") {
		t.Fatalf("second notify message %q: want another wait notice (it retries)", m)
	}
	if err := p.Stop(30 * time.Second); err != nil {
		t.Fatalf("SIGTERM while waiting for etcd: %v, want exit 0", err)
	}
}
