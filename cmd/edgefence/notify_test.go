package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgefence/edgefence/internal/sandbox"
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
    auth: off
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
