package mqtt

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"

	"github.com/edgefence/edgefence/internal/mochiquota"
)

// testBroker is an in-process mochi-mqtt v2 broker on a fixed 127.0.0.1
// port, so that it can be stopped and restarted at the same address.
type testBroker struct {
	t        testing.TB
	addr     string
	hooks    []mochi.Hook
	tls      *tls.Config // serve TLS if set
	auth     mochi.Hook  // replaces auth.AllowHook if set
	authOpts any         // auth's options (auth.Options for auth.Hook)

	mu    sync.Mutex
	srv   *mochi.Server    // nil while stopped
	quota *mochiquota.Hook // the running server's
}

// freeAddr returns a 127.0.0.1 address whose port was free a moment ago.
func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// startBroker starts a broker on a free port; it is stopped at cleanup.
func startBroker(t testing.TB, hooks ...mochi.Hook) *testBroker {
	b := newBroker(t, freeAddr(t), hooks...)
	b.start()
	return b
}

// newBroker returns a stopped broker for addr; it is stopped at cleanup.
func newBroker(t testing.TB, addr string, hooks ...mochi.Hook) *testBroker {
	b := &testBroker{t: t, addr: addr, hooks: hooks}
	t.Cleanup(b.stop)
	return b
}

func (b *testBroker) url() string { return "mqtt://" + b.addr }

// start starts a fresh broker (no sessions, no retained messages).
func (b *testBroker) start() {
	b.t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.srv != nil {
		b.t.Fatal("broker already running")
	}
	srv := mochi.New(&mochi.Options{
		InlineClient: false,
		Logger:       slog.New(slog.DiscardHandler),
	})
	var authHook mochi.Hook = new(auth.AllowHook)
	if b.auth != nil {
		authHook = b.auth
	}
	if err := srv.AddHook(authHook, b.authOpts); err != nil { // mochi denies everyone by default
		b.t.Fatal(err)
	}
	quota, err := mochiquota.Add(srv) // mochi v2.7.9's send quota stalls deliveries
	if err != nil {
		b.t.Fatal(err)
	}
	b.quota = quota
	for _, h := range b.hooks {
		if err := srv.AddHook(h, nil); err != nil {
			b.t.Fatal(err)
		}
	}
	// The port may linger briefly after a restart; retry the bind.
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := srv.AddListener(listeners.NewTCP(listeners.Config{ID: "t1", Address: b.addr, TLSConfig: b.tls}))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("listen %s: %v", b.addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := srv.Serve(); err != nil {
		b.t.Fatal(err)
	}
	b.srv = srv
}

// stop closes the broker and every client connection; idempotent.
func (b *testBroker) stop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.srv != nil {
		b.srv.Close()
		b.srv = nil
	}
}

// testLogger returns a logger writing to the test's output until the test
// ends (later writes are dropped rather than panicking).
func testLogger(t testing.TB) *slog.Logger {
	w := &testWriter{w: t.Output()}
	t.Cleanup(w.stop)
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type testWriter struct {
	mu      sync.Mutex
	w       io.Writer
	stopped bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return len(p), nil
	}
	return w.w.Write(p)
}

func (w *testWriter) stop() {
	w.mu.Lock()
	w.stopped = true
	w.mu.Unlock()
}

// dial connects a client to brokerURL with fast backoff; it is closed at
// cleanup.
func dial(t testing.TB, brokerURL, id string, opts ...func(*Config)) *Client {
	t.Helper()
	cfg := Config{
		Brokers:    []string{brokerURL},
		ClientID:   id,
		MinBackoff: 10 * time.Millisecond,
		MaxBackoff: 100 * time.Millisecond,
		Logger:     testLogger(t),
	}
	for _, o := range opts {
		o(&cfg)
	}
	c, err := Dial(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := c.Close(ctx); err != nil {
			t.Errorf("close %s: %v", id, err)
		}
	})
	return c
}

// timeout returns a context that ends after d or at cleanup.
func timeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
