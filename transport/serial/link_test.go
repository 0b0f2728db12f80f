package serial

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// echo is a device handler: it answers "ok:" and the request.
func echo(req []byte) []byte { return append([]byte("ok:"), req...) }

// countingHandler wraps a handler and counts how often each request was
// applied.
type countingHandler struct {
	mu      sync.Mutex
	applied map[string]int
	calls   atomic.Int64
	h       func([]byte) []byte
}

func newCounting(h func([]byte) []byte) *countingHandler {
	return &countingHandler{applied: map[string]int{}, h: h}
}

func (c *countingHandler) Handle(req []byte) []byte {
	c.calls.Add(1)
	c.mu.Lock()
	c.applied[string(req)]++
	c.mu.Unlock()
	return c.h(req)
}

// checkAppliedOnce fails unless each request was applied exactly once.
func (c *countingHandler) checkAppliedOnce(t *testing.T, reqs []string) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range reqs {
		if n := c.applied[r]; n != 1 {
			t.Errorf("request %q applied %d times, want 1", r, n)
		}
	}
	if n := c.calls.Load(); n != int64(len(reqs)) {
		t.Errorf("handler called %d times, want %d", n, len(reqs))
	}
}

// newPortLink opens a's port and starts a Link over it.
func newPortLink(t *testing.T, a *adapter, cfg LinkConfig) *Link {
	t.Helper()
	p, err := OpenPort(PortConfig{Path: a.Path})
	if err != nil {
		t.Fatal(err)
	}
	l, err := NewLink(p, cfg)
	if err != nil {
		p.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func TestLinkRoundTrip(t *testing.T) {
	a := newAdapter(t)
	m := a.Plug()
	h := newCounting(echo)
	dev := &Responder{Handler: h.Handle}
	startDevice(t, dev, m)
	l := newPortLink(t, a, LinkConfig{})
	ctx := testCtx(t)

	var reqs []string
	for i, req := range [][]byte{
		[]byte("x"),
		{0x00},
		bytes.Repeat([]byte{0x00}, 300),
		bytes.Repeat([]byte{0xFF}, 600),
		bytes.Repeat([]byte("0123456789"), 110)[:DefaultMaxPayload-headerLen-3], // response at the limit
		{},
	} {
		resp, err := l.Do(ctx, req)
		if err != nil {
			t.Fatalf("Do #%d: %v", i, err)
		}
		if want := echo(req); !bytes.Equal(resp, want) {
			t.Fatalf("Do #%d = %q, want %q", i, resp, want)
		}
		reqs = append(reqs, string(req))
	}
	h.checkAppliedOnce(t, reqs)
	if _, err := l.Do(ctx, make([]byte, DefaultMaxPayload-headerLen+1)); !errors.Is(err, ErrFrameSize) {
		t.Fatalf("oversize Do error = %v, want ErrFrameSize", err)
	}
	s := l.Stats()
	if s.Requests != uint64(len(reqs)) || s.Responses != uint64(len(reqs)) || s.Retries != 0 {
		t.Errorf("stats %+v", s)
	}
}

// dropWriter drops the first n writes, as a line that loses the device's
// first responses would.
type dropWriter struct {
	*os.File // the pty master; its SetReadDeadline lets Serve stop
	drop     atomic.Int64
}

func (w *dropWriter) Write(p []byte) (int, error) {
	if w.drop.Add(-1) >= 0 {
		return len(p), nil
	}
	return w.File.Write(p)
}

// TestLinkRetrySameTxid: the first response is lost; the Link resends the
// request with the same txid; the device recognises the retry and replays
// its response without applying the request again.
func TestLinkRetrySameTxid(t *testing.T) {
	a := newAdapter(t)
	m := a.Plug()
	h := newCounting(echo)
	dev := &Responder{Handler: h.Handle}
	dw := &dropWriter{File: m}
	dw.drop.Store(1)
	startDevice(t, dev, dw)
	l := newPortLink(t, a, LinkConfig{Timeout: 250 * time.Millisecond, Retries: 20})

	resp, err := l.Do(testCtx(t), []byte("set r1=7"))
	if err != nil || string(resp) != "ok:set r1=7" {
		t.Fatalf("Do = %q, %v", resp, err)
	}
	h.checkAppliedOnce(t, []string{"set r1=7"})
	if s := dev.Stats(); s.Applied != 1 || s.Replayed < 1 || s.Requests != s.Applied+s.Replayed {
		t.Errorf("device stats %+v: want 1 applied, at least 1 replayed", s)
	}
	if s := l.Stats(); s.Retries < 1 {
		t.Errorf("link stats %+v: want a retry", s)
	}
}

// TestLinkTimeout: a device whose responses never arrive: ErrTimeout after
// 1+Retries attempts, all with one txid, so the request was applied once.
func TestLinkTimeout(t *testing.T) {
	a := newAdapter(t)
	m := a.Plug()
	h := newCounting(echo)
	dev := &Responder{Handler: h.Handle}
	dw := &dropWriter{File: m}
	dw.drop.Store(1 << 40)
	d := startDevice(t, dev, dw)
	l := newPortLink(t, a, LinkConfig{Timeout: 50 * time.Millisecond, Retries: 2})

	_, err := l.Do(testCtx(t), []byte("cmd"))
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("Do error = %v, want ErrTimeout", err)
	}
	if s := l.Stats(); s.Retries != 2 || s.Timeouts != 1 {
		t.Errorf("link stats %+v: want 2 retries, 1 timeout", s)
	}
	// The device got up to three copies (the last may still be on its
	// way), applied one.
	waitFor(t, "the device to see the request", func() bool { return dev.Stats().Requests >= 1 })
	d.Stop(t)
	if s := dev.Stats(); s.Applied != 1 || s.Requests > 3 {
		t.Errorf("device stats %+v", s)
	}
}

// TestLinkDropsUnknownTxid: responses that answer no pending request
// (a stale txid) are dropped and counted; the right one is delivered.
func TestLinkDropsUnknownTxid(t *testing.T) {
	a := newAdapter(t)
	m := a.Plug()
	l := newPortLink(t, a, LinkConfig{Timeout: 5 * time.Second})
	done := make(chan error, 1)
	go func() {
		dec := newDecoder(m, 0, new(frameCounters))
		p, err := dec.Next()
		if err != nil {
			done <- err
			return
		}
		h, req, err := parseMessage(p)
		if err != nil {
			done <- err
			return
		}
		for _, msg := range []struct {
			txid uint32
			body string
		}{{h.txid - 1, "stale"}, {h.txid + 1, "future"}, {h.txid, "right:" + string(req)}, {h.txid, "second copy"}} {
			f, err := encodeMessage(header{typ: typeResponse, txid: msg.txid}, []byte(msg.body))
			if err == nil {
				_, err = m.Write(f)
			}
			if err != nil {
				done <- err
				return
			}
		}
		// A request frame is not a response either.
		f, _ := encodeMessage(header{typ: typeRequest, txid: h.txid}, nil)
		_, err = m.Write(f)
		done <- err
	}()
	resp, err := l.Do(testCtx(t), []byte("q"))
	if err != nil || string(resp) != "right:q" {
		t.Fatalf("Do = %q, %v", resp, err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the extra frames to be dropped", func() bool {
		s := l.Stats()
		return s.UnknownTxid == 3 && s.BadMessages == 1
	})
}

// noisyLine sits between a Responder and the pty master and garbles what
// the device sends: noise before responses (with and without delimiters),
// truncated and oversize frames, responses with a flipped bit (which the
// gateway must drop and retry), and a few intact responses with a wrong
// txid. Randomness is seeded: the same garbage every run.
type noisyLine struct {
	*os.File // the pty master
	mu       sync.Mutex
	rng      *rand.Rand
	quiet    bool
}

func (n *noisyLine) Write(frame []byte) (int, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.quiet {
		return n.File.Write(frame)
	}
	var out []byte
	noise := func(withZeros bool) []byte {
		b := make([]byte, 1+n.rng.IntN(200))
		for i := range b {
			b[i] = byte(n.rng.IntN(256))
			if !withZeros && b[i] == 0 {
				b[i] = 0x55
			}
		}
		return b
	}
	switch n.rng.IntN(8) {
	case 0:
		out = append(out, noise(false)...)
	case 1:
		out = append(out, noise(true)...)
	case 2: // a truncated copy of this frame, then the frame
		out = append(out, frame[:1+n.rng.IntN(len(frame)-1)]...)
	case 3: // a frame over the 1 KiB limit
		big, _ := Encode(bytes.Repeat([]byte{0xA5}, DefaultMaxPayload+1+n.rng.IntN(500)))
		out = append(out, big...)
	case 4: // the frame with one bit flipped, instead of the frame
		bad := bytes.Clone(frame)
		at := 8 + n.rng.IntN((len(frame)-2)*8) // between the delimiters
		bad[at/8] ^= 1 << (at % 8)
		return n.File.Write(bad)
	case 5: // an intact response for another transaction, then the frame
		h, _, _ := parseMessage(mustDecodeOne(frame))
		other, _ := encodeMessage(header{typ: typeResponse, txid: h.txid + 1000}, []byte("not yours"))
		out = append(out, other...)
	}
	out = append(out, frame...)
	if _, err := n.File.Write(out); err != nil {
		return 0, err
	}
	return len(frame), nil
}

func mustDecodeOne(frame []byte) []byte {
	d := newDecoder(bytes.NewReader(frame), 0, new(frameCounters))
	p, err := d.Next()
	if err != nil {
		panic(err)
	}
	return p
}

// TestLinkNoise: with noise injected from the device's side of the pty,
// every Do returns its own request's response (never a wrong one), each
// request is applied once, the decoder counts the damage, and afterwards a
// clean line works at once.
func TestLinkNoise(t *testing.T) {
	a := newAdapter(t)
	m := a.Plug()
	h := newCounting(echo)
	dev := &Responder{Handler: h.Handle}
	line := &noisyLine{File: m, rng: rand.New(rand.NewPCG(1, 2))}
	startDevice(t, dev, line)
	l := newPortLink(t, a, LinkConfig{Timeout: 100 * time.Millisecond, Retries: 50})
	ctx := testCtx(t)

	const n = 80
	var reqs []string
	for i := range n {
		req := fmt.Appendf(nil, "write reg %d = %d\x00\x00", i, i*i)
		resp, err := l.Do(ctx, req)
		if err != nil {
			t.Fatalf("Do #%d: %v", i, err)
		}
		if !bytes.Equal(resp, echo(req)) {
			t.Fatalf("Do #%d = %q, want %q", i, resp, echo(req))
		}
		reqs = append(reqs, string(req))
	}
	h.checkAppliedOnce(t, reqs)
	s := l.Stats()
	t.Logf("link stats %+v", s)
	if s.Frames.CRCErrors+s.Frames.Malformed == 0 || s.Frames.Oversize == 0 || s.Frames.GarbageBytes == 0 || s.UnknownTxid == 0 || s.Retries == 0 {
		t.Errorf("noise not seen in the stats: %+v", s)
	}
	// The line is clean again, and the link works.
	line.mu.Lock()
	line.quiet = true
	line.mu.Unlock()
	for i := range 5 {
		req := []byte("after " + strconv.Itoa(i))
		if resp, err := l.Do(ctx, req); err != nil || !bytes.Equal(resp, echo(req)) {
			t.Fatalf("Do after noise = %q, %v", resp, err)
		}
	}
}

// TestLinkConcurrentDo: Do calls from many goroutines are queued and run
// one at a time; every one gets its own response.
func TestLinkConcurrentDo(t *testing.T) {
	a := newAdapter(t)
	m := a.Plug()
	h := newCounting(echo)
	startDevice(t, &Responder{Handler: h.Handle}, m)
	l := newPortLink(t, a, LinkConfig{})
	ctx := testCtx(t)

	const workers, each = 4, 25
	var wg sync.WaitGroup
	errs := make(chan error, workers*each)
	var reqs []string
	for w := range workers {
		for i := range each {
			reqs = append(reqs, "w"+strconv.Itoa(w)+"-"+strconv.Itoa(i))
		}
		wg.Go(func() {
			for i := range each {
				req := []byte("w" + strconv.Itoa(w) + "-" + strconv.Itoa(i))
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
	h.checkAppliedOnce(t, reqs)
}

// TestLinkClose: Close stops the reader and fails pending and later Do
// calls with ErrClosed.
func TestLinkClose(t *testing.T) {
	a := newAdapter(t)
	a.Plug() // a device that never answers
	l := newPortLink(t, a, LinkConfig{Timeout: time.Hour})
	errc := make(chan error, 1)
	go func() {
		_, err := l.Do(context.Background(), []byte("never answered"))
		errc <- err
	}()
	waitFor(t, "the request to be sent", func() bool { return l.Stats().Requests == 1 })
	if err := l.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("pending Do = %v, want ErrClosed", err)
		}
	case <-time.After(testDeadline):
		t.Fatal("pending Do did not return")
	}
	<-l.Done()
	if _, err := l.Do(context.Background(), []byte("late")); !errors.Is(err, ErrClosed) {
		t.Fatalf("Do after Close = %v, want ErrClosed", err)
	}
	if err := l.Err(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Err = %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestLinkContext: a Do whose context ends while waiting returns the
// context's error.
func TestLinkContext(t *testing.T) {
	a := newAdapter(t)
	a.Plug()
	l := newPortLink(t, a, LinkConfig{Timeout: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := l.Do(ctx, []byte("x"))
		errc <- err
	}()
	waitFor(t, "the request to be sent", func() bool { return l.Stats().Requests == 1 })
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Do = %v, want context.Canceled", err)
	}
}

func TestLinkConfig(t *testing.T) {
	for _, cfg := range []LinkConfig{
		{Timeout: -1},
		{MaxPayload: headerLen},
		{MaxPayload: MaxPayloadLimit + 1},
	} {
		if _, err := NewLink(nil, cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("NewLink(%+v) error = %v, want ErrInvalidConfig", cfg, err)
		}
	}
	got, err := LinkConfig{Retries: -1}.withDefaults()
	if err != nil || got.Retries != 0 || got.Timeout != DefaultTimeout || got.MaxPayload != DefaultMaxPayload {
		t.Errorf("withDefaults = %+v, %v", got, err)
	}
}
