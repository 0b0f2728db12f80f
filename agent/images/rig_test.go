package images_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgefence/edgefence/agent/images"
	"github.com/edgefence/edgefence/internal/modbustest"
)

// blob is a test image: its bytes and a Ref for them at a URL.
type blob struct {
	data []byte
	sum  []byte
}

func newBlob(n int, seed uint64) blob {
	r := rand.New(rand.NewPCG(seed, 15))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	s := sha256.Sum256(b)
	return blob{data: b, sum: s[:]}
}

func (b blob) ref(url string) images.Ref {
	return images.Ref{SHA256: b.sum, Size: uint64(len(b.data)), URL: url}
}

// file writes b into a temporary file and returns its file URL.
func (b blob) file(t testing.TB) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "image.bin")
	if err := os.WriteFile(p, b.data, 0o644); err != nil {
		t.Fatal(err)
	}
	return images.FileURL(p)
}

// open opens a cache in dir (a new one if "") with a log the test reads.
func open(t testing.TB, dir string, o images.Options) (*images.Cache, *modbustest.Buffer, string) {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	lb := &modbustest.Buffer{}
	o.Logger = slog.New(slog.NewTextHandler(lb, nil))
	c, err := images.Open(dir, o)
	if err != nil {
		t.Fatal(err)
	}
	return c, lb, dir
}

// server serves b at /image on loopback and counts the requests; mode
// changes what it does (see serveMode).
type server struct {
	*httptest.Server
	b       blob
	hits    atomic.Int64
	mode    atomic.Value // serveMode
	started chan struct{}
	release chan struct{}
	sent    atomic.Int64
}

type serveMode string

const (
	full    serveMode = "full"    // the image, with its length
	stall   serveMode = "stall"   // half the image, then wait for release or the client to go
	abort   serveMode = "abort"   // half the image with the full length, then cut the connection
	endless serveMode = "endless" // chunked, bytes without end (up to 1 GiB)
	liar    serveMode = "liar"    // declares one byte more than the image, sends half, stalls
)

func newServer(t testing.TB, b blob, tlsOn bool) *server {
	t.Helper()
	s := &server{b: b, started: make(chan struct{}, 64), release: make(chan struct{})}
	s.mode.Store(full)
	h := http.HandlerFunc(s.serve)
	if tlsOn {
		s.Server = httptest.NewTLSServer(h)
	} else {
		s.Server = httptest.NewServer(h)
	}
	t.Cleanup(func() {
		s.CloseClientConnections()
		s.Close()
	})
	return s
}

func (s *server) url() string { return s.URL + "/image" }

func (s *server) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/image" {
		http.NotFound(w, r)
		return
	}
	s.hits.Add(1)
	select {
	case s.started <- struct{}{}:
	default:
	}
	half := len(s.b.data) / 2
	switch s.mode.Load().(serveMode) {
	case full:
		w.Header().Set("Content-Length", strconv.Itoa(len(s.b.data)))
		w.Write(s.b.data)
	case liar:
		w.Header().Set("Content-Length", strconv.Itoa(len(s.b.data)+1))
		w.Write(s.b.data[:half])
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	case stall, abort:
		w.Header().Set("Content-Length", strconv.Itoa(len(s.b.data)))
		w.Write(s.b.data[:half])
		w.(http.Flusher).Flush()
		if s.mode.Load() == abort {
			panic(http.ErrAbortHandler)
		}
		select {
		case <-s.release:
			w.Write(s.b.data[half:])
		case <-r.Context().Done():
		}
	case endless:
		buf := make([]byte, 64<<10)
		for s.sent.Load() < 1<<30 {
			n, err := w.Write(buf)
			s.sent.Add(int64(n))
			if err != nil {
				return
			}
		}
	}
}

// client returns an HTTP client whose idle connections the test closes.
func client(t testing.TB, tr *http.Transport) *http.Client {
	if tr == nil {
		tr = http.DefaultTransport.(*http.Transport).Clone()
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// leftovers lists the files in the cache's directory that are not entries
// (unfinished fetches).
func leftovers(t testing.TB, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, de := range des {
		if de.Name() != "sha256" {
			out = append(out, de.Name())
		}
	}
	return out
}

// entries lists the entries on disk.
func entries(t testing.TB, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(filepath.Join(dir, "sha256"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, de := range des {
		out = append(out, de.Name())
	}
	return out
}

// waitFor polls cond with a generous deadline.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// mustGet gets ref and checks the image's bytes against b.
func mustGet(t testing.TB, c *images.Cache, b blob, ref images.Ref) *images.Image {
	t.Helper()
	im, err := c.Get(context.Background(), ref)
	if err != nil {
		t.Fatalf("Get %s: %v", ref.URL, err)
	}
	got := make([]byte, im.Size())
	if _, err := im.ReadAt(got, 0); err != nil || !bytes.Equal(got, b.data) {
		t.Fatalf("image read back: %v (equal %v)", err, bytes.Equal(got, b.data))
	}
	return im
}
