package sandbox

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// startMosquitto starts mosquitto for a test, skipping when it is not
// installed unless CI=true, where its absence is a failure.
func startMosquitto(t *testing.T) *Mosquitto {
	t.Helper()
	start := time.Now()
	m, err := StartMosquitto(t.Context(), t.TempDir())
	if errors.Is(err, ErrNoMosquitto) && os.Getenv("CI") != "true" {
		t.Skip(err)
	}
	if err != nil {
		t.Fatalf("StartMosquitto: %v", err)
	}
	t.Logf("mosquitto listening in %v at %s", time.Since(start), m.URL())
	t.Cleanup(func() {
		start := time.Now()
		if err := m.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		t.Logf("mosquitto closed in %v", time.Since(start))
	})
	return m
}

func TestMosquittoPubSubQoS1(t *testing.T) {
	m := startMosquitto(t)
	if strings.HasSuffix(m.Addr(), ":1883") {
		t.Fatalf("mosquitto on the default port: %s", m.Addr())
	}
	if m.URL() != "mqtt://"+m.Addr() {
		t.Fatalf("URL %q, Addr %q", m.URL(), m.Addr())
	}
	rtt := pubSubOnce(t, m.Addr(), "edgefence/test/cmd")
	t.Logf("mosquitto QoS 1 publish→receive %v", rtt)
}

func TestMosquittoRestart(t *testing.T) {
	m := startMosquitto(t)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	mqttClient(t, ctx, m.Addr(), "victim", nil)

	start := time.Now()
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("mosquitto stop (SIGTERM, reaped) took %v", time.Since(start))
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	c := mqttClient(t, ctx, m.Addr(), "victim2", nil)

	start = time.Now()
	if err := m.Restart(ctx); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	t.Logf("mosquitto restart took %v", time.Since(start))
	select {
	case <-c.Done():
	case <-ctx.Done():
		t.Fatal("client still connected across a restart")
	}
	pubSubOnce(t, m.Addr(), "edgefence/test/after")

	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}
	if conn, err := net.DialTimeout("tcp", m.Addr(), time.Second); err == nil {
		conn.Close()
		t.Fatal("stopped mosquitto accepts connections")
	}
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	m.Close()
	if err := m.Start(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Start after Close = %v", err)
	}
}

// TestMosquittoTempDir checks that StartMosquitto with no dir makes a temp
// dir and Close removes it.
func TestMosquittoTempDir(t *testing.T) {
	m, err := StartMosquitto(t.Context(), "")
	if errors.Is(err, ErrNoMosquitto) && os.Getenv("CI") != "true" {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(m.dir, "mosquitto.conf")
	b, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"listener ", " 127.0.0.1\n", "allow_anonymous true\n", "persistence false\n"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("config lacks %q:\n%s", want, b)
		}
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(m.dir); !os.IsNotExist(err) {
		t.Fatalf("temp dir %s left behind: %v", m.dir, err)
	}
}

// TestMosquittoContextEndsProcess checks that cancelling StartMosquitto's
// ctx terminates the broker, as exec.CommandContext promises.
func TestMosquittoContextEndsProcess(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	m, err := StartMosquitto(ctx, t.TempDir())
	if errors.Is(err, ErrNoMosquitto) && os.Getenv("CI") != "true" {
		cancel()
		t.Skip(err)
	}
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	defer m.Close()
	cancel()
	m.mu.Lock()
	done := m.proc.done
	m.mu.Unlock()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("mosquitto still running after ctx cancel")
	}
}

func TestNoMosquitto(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := findMosquitto(filepath.Join(t.TempDir(), "mosquitto"))
	if !errors.Is(err, ErrNoMosquitto) {
		t.Fatalf("err = %v, want ErrNoMosquitto", err)
	}
}
