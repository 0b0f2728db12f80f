package serial

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// fastConn is a ConnConfig with short backoffs, so that tests do not wait
// long for a reopen; nothing depends on the exact delays.
func fastConn(path string) ConnConfig {
	return ConnConfig{Port: PortConfig{Path: path}, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}
}

func newConnLink(t *testing.T, cfg ConnConfig, lcfg LinkConfig) (*Conn, *Link, error) {
	t.Helper()
	c, openErr := OpenConn(cfg)
	if c == nil {
		t.Fatalf("OpenConn: %v", openErr)
	}
	l, err := NewLink(c, lcfg)
	if err != nil {
		c.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return c, l, openErr
}

// TestConnUnplugReplug: N requests from several goroutines while the
// adapter is unplugged twice: once in the middle of a transaction, after
// the device applied the request and before its response got out, and
// once for long enough that the gateway finds the port missing. Every
// request is answered with its own response and applied exactly once.
func TestConnUnplugReplug(t *testing.T) {
	const workers, each = 4, 15
	const n = workers * each
	a := newAdapter(t)
	first := a.Plug()

	var (
		mu      sync.Mutex
		applied = map[string]int{}
		calls   int
	)
	unplugged := make(chan struct{}, 1)
	var dev *device
	handler := func(req []byte) []byte {
		mu.Lock()
		applied[string(req)]++
		calls++
		k := calls
		mu.Unlock()
		switch k {
		case n / 3:
			// Unplug while this transaction runs: the request is applied,
			// the response is lost with the pty. Plug back at once.
			a.Unplug()
			dev.Serve(a.Plug())
		case 2 * n / 3:
			// Unplug and stay away until the gateway noticed.
			a.Unplug()
			unplugged <- struct{}{}
		}
		return echo(req)
	}
	dev = startDevice(t, &Responder{Handler: handler}, first)
	conn, l, err := newConnLink(t, fastConn(a.Path), LinkConfig{Timeout: 200 * time.Millisecond, Retries: 20})
	if err != nil {
		t.Fatal(err)
	}

	ctx := testCtx(t)
	replugged := make(chan struct{})
	go func() {
		defer close(replugged)
		select {
		case <-unplugged:
		case <-ctx.Done():
			return
		}
		before := conn.Stats().OpenFailures
		for conn.Stats().OpenFailures == before || !errors.Is(conn.Err(), ErrPortMissing) {
			select {
			case <-ctx.Done():
				t.Error("the gateway did not find the port missing")
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
		dev.Serve(a.Plug())
	}()
	defer func() { <-replugged }()

	var wg sync.WaitGroup
	errs := make(chan error, n)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				req := fmt.Appendf(nil, "w%d-%d", w, i)
				resp, err := l.Do(ctx, req)
				if err == nil && !bytes.Equal(resp, echo(req)) {
					err = fmt.Errorf("Do(%q) = %q", req, resp)
				}
				if err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	mu.Lock()
	defer mu.Unlock()
	if calls != n {
		t.Errorf("handler called %d times, want %d", calls, n)
	}
	for w := range workers {
		for i := range each {
			if k := applied[fmt.Sprintf("w%d-%d", w, i)]; k != 1 {
				t.Errorf("request w%d-%d applied %d times", w, i, k)
			}
		}
	}
	cs, ls, ds := conn.Stats(), l.Stats(), dev.R.Stats()
	t.Logf("conn %+v\nlink %+v\ndevice %+v", cs, ls, ds)
	if cs.Losses < 2 || cs.Opens < 3 || ds.Replayed < 1 {
		t.Errorf("want 2 losses, 3 opens and a replayed response")
	}
}

// TestConnMissingAtStart: the adapter is not there when the agent starts:
// OpenConn says so clearly (ErrPortMissing) but returns a Conn that keeps
// trying; a Do meanwhile fails with its context, naming the missing port;
// once the adapter appears, requests go through.
func TestConnMissingAtStart(t *testing.T) {
	a := newAdapter(t)
	conn, l, err := newConnLink(t, fastConn(a.Path), LinkConfig{})
	if !errors.Is(err, ErrPortMissing) || !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), a.Path) {
		t.Fatalf("OpenConn error = %v, want ErrPortMissing naming %s", err, a.Path)
	}
	if !errors.Is(conn.Err(), ErrPortMissing) {
		t.Fatalf("Err = %v", conn.Err())
	}
	if _, err := conn.Write([]byte("x")); !errors.Is(err, ErrPortDown) || !errors.Is(err, ErrPortMissing) {
		t.Fatalf("Write while missing = %v, want ErrPortDown and ErrPortMissing", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	_, err = l.Do(ctx, []byte("early"))
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ErrPortMissing) {
		t.Fatalf("Do while missing = %v, want DeadlineExceeded and ErrPortMissing", err)
	}

	// Still missing after a few attempts in the background.
	waitFor(t, "reopen attempts", func() bool { return conn.Stats().OpenFailures >= 3 })

	h := newCounting(echo)
	startDevice(t, &Responder{Handler: h.Handle}, a.Plug())
	resp, err := l.Do(testCtx(t), []byte("hello"))
	if err != nil || string(resp) != "ok:hello" {
		t.Fatalf("Do after plug = %q, %v", resp, err)
	}
	if err := conn.Err(); err != nil {
		t.Fatalf("Err after plug = %v", err)
	}
	h.checkAppliedOnce(t, []string{"hello"})
}

// TestConnClose: Close during a reopen backoff and during a read returns,
// and the Conn reads and writes ErrClosed afterwards.
func TestConnClose(t *testing.T) {
	for _, plugged := range []bool{false, true} {
		t.Run(fmt.Sprintf("plugged=%v", plugged), func(t *testing.T) {
			a := newAdapter(t)
			if plugged {
				a.Plug()
			}
			cfg := fastConn(a.Path)
			cfg.MinBackoff, cfg.MaxBackoff = time.Hour, time.Hour
			c, _ := OpenConn(cfg)
			readErr := make(chan error, 1)
			go func() {
				buf := make([]byte, 8)
				for {
					if _, err := c.Read(buf); !errors.Is(err, ErrReadTimeout) {
						readErr <- err
						return
					}
				}
			}()
			if err := c.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if err := <-readErr; !errors.Is(err, ErrClosed) {
				t.Fatalf("Read after Close = %v", err)
			}
			if _, err := c.Write([]byte("x")); !errors.Is(err, ErrClosed) {
				t.Fatalf("Write after Close = %v", err)
			}
			if err := c.AwaitUp(context.Background()); !errors.Is(err, ErrClosed) {
				t.Fatalf("AwaitUp after Close = %v", err)
			}
		})
	}
}

func TestConnConfig(t *testing.T) {
	for _, cfg := range []ConnConfig{
		{},
		{Port: PortConfig{Path: "x", Parity: "Q"}},
		{Port: PortConfig{Path: "x"}, MinBackoff: -1},
		{Port: PortConfig{Path: "x"}, MinBackoff: time.Second, MaxBackoff: time.Millisecond},
	} {
		if c, err := OpenConn(cfg); c != nil || !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("OpenConn(%+v) = %v, %v; want nil, ErrInvalidConfig", cfg, c, err)
		}
	}
}

// TestReopenBackoff: the delay before reopening attempt n lies in
// [MinBackoff, min(MinBackoff·2^(n+1), MaxBackoff)] of the Conn's config.
func TestReopenBackoff(t *testing.T) {
	lo, hi := 100*time.Millisecond, 5*time.Second
	conn, err := OpenConn(ConnConfig{Port: PortConfig{Path: filepath.Join(t.TempDir(), "ttyUSB9")}, MinBackoff: lo, MaxBackoff: hi})
	if !errors.Is(err, ErrPortMissing) {
		t.Fatalf("OpenConn: %v, want ErrPortMissing", err)
	}
	defer conn.Close()
	conn.readMu.Lock()
	defer conn.readMu.Unlock()
	conn.attempt = 0
	for attempt := range 1000 {
		ceiling := min(lo<<min(attempt+1, 10), hi)
		if d := conn.schedule(); d < lo || d > ceiling {
			t.Fatalf("attempt %d: %v outside [%v, %v]", attempt, d, lo, ceiling)
		}
	}
}
