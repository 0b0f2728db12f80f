package daemon

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

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
	if notifyListens(Options{}) {
		t.Error("no NOTIFY_SOCKET, no Options.Notify: a listener assumed")
	}
	if !notifyListens(Options{Notify: func(string) error { return nil }}) {
		t.Error("Options.Notify given: no listener assumed")
	}
	if d := watchdogInterval(discardLog()); d != 0 {
		t.Fatalf("watchdog interval %v without WATCHDOG_USEC", d)
	}
	t.Setenv("NOTIFY_SOCKET", "/run/systemd/notify")
	if !notifyListens(Options{}) {
		t.Error("NOTIFY_SOCKET set: no listener assumed")
	}
	t.Setenv("WATCHDOG_USEC", "30000000")
	if d := watchdogInterval(discardLog()); d != 15*time.Second {
		t.Fatalf("watchdog interval %v for WatchdogSec=30s, want 15s", d)
	}
}

// Without a listener (no NOTIFY_SOCKET) the status summary — a walk of
// every device's lock — is taken once, for READY, and not checked every
// second after it (issue 17: idle CPU); the watchdog pings go on. The
// control, with a listener, checks it every interval.
func TestNotifierNoStatusWithoutListener(t *testing.T) {
	run := func(noStatus bool) (calls *atomic.Int64, rec *recorder) {
		calls, rec = new(atomic.Int64), newRecorder()
		runNotifier(t, &notifier{send: rec.send, log: discardLog(), campaigning: closed(), brokerUp: closed(),
			every: time.Millisecond, watchdog: time.Millisecond, noStatus: noStatus,
			status: func() string { calls.Add(1); return "up" }, healthy: func() error { return nil }})
		rec.waitMsg(t, "READY=1\nSTATUS=up")
		return calls, rec
	}
	control, _ := run(false)
	start := time.Now()
	for deadline := start.Add(10 * time.Second); control.Load() < 5; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("control: status taken %d times in 10 s", control.Load())
		}
	}
	took := time.Since(start)
	calls, rec := run(true)
	// Pings prove the loop runs; then wait at least as long as the
	// control needed for its checks (a slow machine waits longer).
	for range 5 {
		rec.waitMsg(t, "WATCHDOG=1")
	}
	time.Sleep(2*took + 20*time.Millisecond)
	if n := calls.Load(); n != 1 {
		t.Fatalf("no listener: status taken %d times, want once (for READY)", n)
	}
}
