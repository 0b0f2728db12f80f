package images_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/edgefence/edgefence/agent/images"
	"github.com/edgefence/edgefence/internal/modbustest"
)

func TestMain(m *testing.M) {
	if os.Getenv(killDirEnv) != "" {
		os.Exit(killChild())
	}
	goleak.VerifyTestMain(m)
}

func TestGetFileThenHit(t *testing.T) {
	b := newBlob(300_000, 1)
	c, _, dir := open(t, "", images.Options{})
	ref := b.ref(b.file(t))
	im := mustGet(t, c, b, ref)
	defer im.Close()
	if got := entries(t, dir); len(got) != 1 || got[0] != ref.Hex() {
		t.Fatalf("entries %q, want [%s]", got, ref.Hex())
	}
	im2 := mustGet(t, c, b, ref)
	im2.Close()
	st := c.Stats()
	if st.Fetches != 1 || st.Misses != 1 || st.Hits != 1 || st.FetchedBytes != uint64(len(b.data)) || st.InUse != 1 || st.Entries != 1 {
		t.Fatalf("stats %+v", st)
	}
	if l := leftovers(t, dir); len(l) != 0 {
		t.Fatalf("left in the cache dir: %q", l)
	}
}

func TestChunk(t *testing.T) {
	b := newBlob(40_000, 2)
	c, _, _ := open(t, "", images.Options{})
	im := mustGet(t, c, b, b.ref(b.file(t)))
	defer im.Close()
	var got []byte
	for off := uint64(0); ; {
		ch, err := im.Chunk(off, 16<<10)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ch...)
		off += uint64(len(ch))
	}
	if string(got) != string(b.data) {
		t.Fatal("chunks do not make up the image")
	}
	if ch, err := im.Chunk(39_990, 100); err != nil || len(ch) != 10 {
		t.Fatalf("last chunk: %d bytes, %v; want 10", len(ch), err)
	}
	if _, err := im.Chunk(40_001, 1); err != io.EOF {
		t.Fatalf("chunk past the end: %v, want io.EOF", err)
	}
	if _, err := im.Chunk(0, 0); err == nil {
		t.Fatal("chunk of 0 bytes accepted")
	}
}

func TestGetHTTP(t *testing.T) {
	b := newBlob(1<<20+17, 3)
	s := newServer(t, b, false)
	c, _, _ := open(t, "", images.Options{HTTP: client(t, nil)})
	mustGet(t, c, b, b.ref(s.url())).Close()
	mustGet(t, c, b, b.ref(s.url())).Close()
	if n := s.hits.Load(); n != 1 {
		t.Fatalf("server hit %d times, want 1", n)
	}
}

func TestGetHTTPS(t *testing.T) {
	b := newBlob(100_000, 4)
	s := newServer(t, b, true)
	pool := x509.NewCertPool()
	pool.AddCert(s.Certificate())
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool}
	c, _, _ := open(t, "", images.Options{HTTP: client(t, tr)})
	mustGet(t, c, b, b.ref(s.url())).Close()

	// Without the test CA the server is not trusted.
	c2, _, dir := open(t, "", images.Options{HTTP: client(t, nil)})
	_, err := c2.Get(context.Background(), b.ref(s.url()))
	if _, ok := errors.AsType[*tls.CertificateVerificationError](err); !ok || !errors.Is(err, images.ErrFetch) {
		t.Fatalf("Get without the CA: %v, want ErrFetch wrapping a certificate verification error", err)
	}
	if len(entries(t, dir)) != 0 || len(leftovers(t, dir)) != 0 {
		t.Fatal("a failed fetch left files")
	}
}

// failing checks that a Get fails with want, leaves no entry and no
// temporary file, and is counted and logged once with its URL and hash.
func failing(t *testing.T, c *images.Cache, lb *modbustest.Buffer, dir string, ref images.Ref, want error, reason string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := c.Get(ctx, ref)
	if !errors.Is(err, want) {
		t.Fatalf("Get: %v, want %v", err, want)
	}
	if e, l := entries(t, dir), leftovers(t, dir); len(e) != 0 || len(l) != 0 {
		t.Fatalf("after a failed Get: entries %q, other files %q", e, l)
	}
	if st := c.Stats(); st.Failures[reason] != 1 {
		t.Fatalf("failures %v, want 1 %s", st.Failures, reason)
	}
	log := lb.String()
	if n := strings.Count(log, "image fetch failed"); n != 1 || !strings.Contains(log, ref.Hex()) || !strings.Contains(log, "reason="+reason) {
		t.Fatalf("log (%d failure lines), want one with the hash and reason %s:\n%s", n, reason, log)
	}
}

func TestWrongHash(t *testing.T) {
	b := newBlob(5000, 5)
	c, lb, dir := open(t, "", images.Options{})
	ref := b.ref(b.file(t))
	ref.SHA256 = newBlob(5000, 6).sum
	failing(t, c, lb, dir, ref, images.ErrHashMismatch, "hash_mismatch")
	if !strings.Contains(lb.String(), "image.bin") {
		t.Fatalf("the log does not name the URL:\n%s", lb)
	}
}

func TestWrongSize(t *testing.T) {
	b := newBlob(5000, 7)
	for _, tc := range []struct {
		name string
		url  func(t *testing.T) string
		size uint64
	}{
		{"file shorter", func(t *testing.T) string { return b.file(t) }, 5001},
		{"file longer", func(t *testing.T) string { return b.file(t) }, 4999},
		{"http declares more", func(t *testing.T) string { return newServer(t, b, false).url() }, 5001},
		{"http declares less", func(t *testing.T) string { return newServer(t, b, false).url() }, 4999},
		{"http declares another length, refused before reading", func(t *testing.T) string {
			s := newServer(t, b, false)
			s.mode.Store(liar)
			return s.url()
		}, 5000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, lb, dir := open(t, "", images.Options{HTTP: client(t, nil)})
			ref := b.ref(tc.url(t))
			ref.Size = tc.size
			failing(t, c, lb, dir, ref, images.ErrSizeMismatch, "size_mismatch")
		})
	}
}

// An endless source without a declared length is cut off as soon as it
// has more bytes than the Ref's size.
func TestLongerStopsReading(t *testing.T) {
	b := newBlob(100_000, 8)
	s := newServer(t, b, false)
	s.mode.Store(endless)
	c, lb, dir := open(t, "", images.Options{HTTP: client(t, nil)})
	failing(t, c, lb, dir, b.ref(s.url()), images.ErrSizeMismatch, "size_mismatch")
	s.CloseClientConnections()
	// What the server could write is what the client read plus what the
	// sockets buffer: far below the 1 GiB it offers.
	if n := s.sent.Load(); n > 64<<20 {
		t.Fatalf("server wrote %d bytes: the client kept reading", n)
	}

	// Exactly: the reader is asked for size+1 bytes, no more.
	cr := &countingReader{}
	f, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n, err := images.CopyLimited(context.Background(), f, discardHash{}, cr, 1_000_000)
	if err == nil || n != 1_000_001 || cr.n != 1_000_001 {
		t.Fatalf("copy of an endless reader: %d bytes copied, %d read, %v; want 1000001 and an error", n, cr.n, err)
	}
}

type countingReader struct{ n int }

func (r *countingReader) Read(p []byte) (int, error) {
	r.n += len(p)
	return len(p), nil
}

type discardHash struct{}

func (discardHash) Write(p []byte) (int, error) { return len(p), nil }
func (discardHash) Sum(b []byte) []byte         { return b }
func (discardHash) Reset()                      {}
func (discardHash) Size() int                   { return 0 }
func (discardHash) BlockSize() int              { return 1 }

func TestTooLarge(t *testing.T) {
	b := newBlob(5000, 9)
	s := newServer(t, b, false)
	c, lb, dir := open(t, "", images.Options{MaxImage: 4096, HTTP: client(t, nil)})
	failing(t, c, lb, dir, b.ref(s.url()), images.ErrTooLarge, "too_large")
	if s.hits.Load() != 0 {
		t.Fatal("an image above MaxImage was fetched")
	}
	p := filepath.Join(t.TempDir(), "big")
	os.WriteFile(p, b.data, 0o644)
	if _, err := c.Add(context.Background(), p); !errors.Is(err, images.ErrTooLarge) {
		t.Fatalf("Add of a file above MaxImage: %v", err)
	}
	if l := leftovers(t, dir); len(l) != 0 {
		t.Fatalf("Add left %q", l)
	}
}

func TestNotFound(t *testing.T) {
	b := newBlob(5000, 10)
	s := newServer(t, b, false)
	c, lb, dir := open(t, "", images.Options{HTTP: client(t, nil)})
	failing(t, c, lb, dir, b.ref(s.URL+"/nothing"), images.ErrNotFound, "not_found")
	c2, lb2, dir2 := open(t, "", images.Options{})
	failing(t, c2, lb2, dir2, b.ref(images.FileURL(filepath.Join(t.TempDir(), "absent"))), images.ErrNotFound, "not_found")
}

func TestServerDiesMidBody(t *testing.T) {
	b := newBlob(1<<20, 11)
	s := newServer(t, b, false)
	s.mode.Store(abort)
	c, lb, dir := open(t, "", images.Options{HTTP: client(t, nil)})
	failing(t, c, lb, dir, b.ref(s.url()), images.ErrFetch, "fetch")
	s.mode.Store(full)
	mustGet(t, c, b, b.ref(s.url())).Close()
}

func TestBadRef(t *testing.T) {
	b := newBlob(10, 12)
	for _, tc := range []struct {
		name string
		ref  images.Ref
	}{
		{"ftp", b.ref("ftp://host/x")},
		{"file with a host", b.ref("file://host/x")},
		{"relative file", b.ref("file:x")},
		{"http without host", b.ref("http:///x")},
		{"not a URL", b.ref("http://[::1")},
		{"short hash", images.Ref{SHA256: b.sum[:31], Size: 10, URL: "http://h/x"}},
		{"size 0", images.Ref{SHA256: b.sum, URL: "http://h/x"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _, _ := open(t, "", images.Options{})
			if _, err := c.Get(context.Background(), tc.ref); !errors.Is(err, images.ErrBadURL) {
				t.Fatalf("Get: %v, want ErrBadURL", err)
			}
			if c.Stats().Failures["bad_url"] != 1 {
				t.Fatal("not counted")
			}
		})
	}
}

func TestCancelMidFetch(t *testing.T) {
	b := newBlob(4<<20, 13)
	s := newServer(t, b, false)
	s.mode.Store(stall)
	c, lb, dir := open(t, "", images.Options{HTTP: client(t, nil)})
	ctx, cancel := context.WithCancel(context.Background())
	errc := getAsync(ctx, c, b.ref(s.url()))
	<-s.started
	waitFor(t, "half the image in a temporary file", func() bool { return tempBytes(dir) >= int64(len(b.data)/2) })
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Get: %v, want context.Canceled", err)
	}
	if e, l := entries(t, dir), leftovers(t, dir); len(e) != 0 || len(l) != 0 {
		t.Fatalf("after a canceled Get: entries %q, other files %q", e, l)
	}
	if c.Stats().Failures["canceled"] != 1 || !strings.Contains(lb.String(), "reason=canceled") {
		t.Fatalf("not counted or logged: %v", c.Stats().Failures)
	}
}

// getAsync gets ref in a goroutine (closing the image) and sends Get's
// error.
func getAsync(ctx context.Context, c *images.Cache, ref images.Ref) <-chan error {
	errc := make(chan error, 1)
	go func() {
		im, err := c.Get(ctx, ref)
		if err == nil {
			im.Close()
		}
		errc <- err
	}()
	return errc
}

// A fetch over FetchTimeout fails as a fetch (ErrFetch, reason fetch),
// not as the caller's cancellation.
func TestFetchTimeout(t *testing.T) {
	b := newBlob(1<<20, 18)
	s := newServer(t, b, false)
	s.mode.Store(stall)
	c, lb, dir := open(t, "", images.Options{HTTP: client(t, nil), FetchTimeout: 300 * time.Millisecond})
	failing(t, c, lb, dir, b.ref(s.url()), images.ErrFetch, "fetch")
	if _, err := c.Get(context.Background(), b.ref(s.url())); errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the fetch timeout reads as the caller's deadline: %v", err)
	}
}

// tempBytes is the size of the unfinished fetches in dir.
func tempBytes(dir string) int64 {
	ms, _ := filepath.Glob(filepath.Join(dir, ".fetch-*"))
	var n int64
	for _, m := range ms {
		if fi, err := os.Stat(m); err == nil {
			n += fi.Size()
		}
	}
	return n
}

func TestConcurrentGetsShareOneFetch(t *testing.T) {
	const n = 8
	b := newBlob(2<<20, 14)
	s := newServer(t, b, false)
	s.mode.Store(stall)
	c, _, _ := open(t, "", images.Options{HTTP: client(t, nil)})
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			im, err := c.Get(context.Background(), b.ref(s.url()))
			if err == nil {
				im.Close()
			}
			errs <- err
		})
	}
	<-s.started
	waitFor(t, "the other Gets to wait for the fetch", func() bool { return c.Joined(b.sum) == n-1 })
	close(s.release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	st := c.Stats()
	if s.hits.Load() != 1 || st.Fetches != 1 || st.Misses != n {
		t.Fatalf("server hits %d, stats %+v; want one fetch, %d misses", s.hits.Load(), st, n)
	}
}

// When the Get running a fetch gives up, one that waited takes it over.
func TestWaiterTakesOverAbandonedFetch(t *testing.T) {
	b := newBlob(2<<20, 15)
	s := newServer(t, b, false)
	s.mode.Store(stall)
	c, _, _ := open(t, "", images.Options{HTTP: client(t, nil)})
	ctx, cancel := context.WithCancel(context.Background())
	first := getAsync(ctx, c, b.ref(s.url()))
	<-s.started
	second := getAsync(context.Background(), c, b.ref(s.url()))
	waitFor(t, "the second Get to wait", func() bool { return c.Joined(b.sum) == 1 })
	s.mode.Store(full)
	cancel()
	if err := <-first; !errors.Is(err, context.Canceled) {
		t.Fatalf("first Get: %v", err)
	}
	if err := <-second; err != nil {
		t.Fatalf("second Get: %v", err)
	}
	if s.hits.Load() != 2 {
		t.Fatalf("server hits %d, want 2", s.hits.Load())
	}
}

func TestCorruptEntryRefetched(t *testing.T) {
	b := newBlob(200_000, 16)
	s := newServer(t, b, false)
	c, _, dir := open(t, "", images.Options{HTTP: client(t, nil)})
	ref := b.ref(s.url())
	mustGet(t, c, b, ref).Close()
	p := filepath.Join(dir, "sha256", ref.Hex())

	// A bit flipped on disk: the next process finds it on first use.
	data, _ := os.ReadFile(p)
	data[1234] ^= 0x10
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	c2, lb, _ := open(t, dir, images.Options{HTTP: client(t, nil)})
	mustGet(t, c2, b, ref).Close()
	if st := c2.Stats(); st.Corrupt != 1 || s.hits.Load() != 2 || !strings.Contains(lb.String(), "corrupted entry") {
		t.Fatalf("corrupt %d, server hits %d; log:\n%s", st.Corrupt, s.hits.Load(), lb)
	}

	// Truncated under a running process: its size check on use finds it.
	if err := os.Truncate(p, 1000); err != nil {
		t.Fatal(err)
	}
	mustGet(t, c2, b, ref).Close()
	if st := c2.Stats(); st.Corrupt != 2 || s.hits.Load() != 3 {
		t.Fatalf("corrupt %d, server hits %d after a truncation", st.Corrupt, s.hits.Load())
	}
}

func TestSizeOfRefAgainstCachedEntry(t *testing.T) {
	b := newBlob(3000, 17)
	c, _, _ := open(t, "", images.Options{})
	ref := b.ref(b.file(t))
	mustGet(t, c, b, ref).Close()
	ref.Size++
	if _, err := c.Get(context.Background(), ref); !errors.Is(err, images.ErrSizeMismatch) {
		t.Fatalf("Get with the wrong size of a cached image: %v", err)
	}
}

func TestPruneLeastRecentlyUsedNotInUse(t *testing.T) {
	bs := []blob{newBlob(1000, 20), newBlob(1000, 21), newBlob(1000, 22), newBlob(1000, 23), newBlob(1000, 24)}
	c, _, dir := open(t, "", images.Options{MaxImage: 1000, MaxBytes: 3000})
	get := func(i int) *images.Image { return mustGet(t, c, bs[i], bs[i].ref(bs[i].file(t))) }
	has := func(want ...int) {
		t.Helper()
		got := map[string]bool{}
		for _, e := range entries(t, dir) {
			got[e] = true
		}
		for _, i := range want {
			if !got[bs[i].ref("").Hex()] {
				t.Fatalf("entry %d pruned; entries %q", i, entries(t, dir))
			}
		}
		if len(got) != len(want) {
			t.Fatalf("%d entries, want %d", len(got), len(want))
		}
	}
	a := get(0) // the oldest, in use
	get(1).Close()
	get(2).Close()
	get(3).Close()
	has(0, 2, 3)
	a.Close()
	get(4).Close()
	has(2, 3, 4)
	if st := c.Stats(); st.Pruned != 2 || st.Bytes != 3000 {
		t.Fatalf("stats %+v", st)
	}

	// At open, over a smaller budget, by the use order on disk.
	get(2).Close()
	c2, _, _ := open(t, dir, images.Options{MaxImage: 1000, MaxBytes: 2000})
	has(2, 4)
	if c2.Stats().Pruned != 1 {
		t.Fatal("not counted")
	}
}

func TestAdd(t *testing.T) {
	b := newBlob(70_000, 30)
	c, _, dir := open(t, "", images.Options{})
	p := filepath.Join(t.TempDir(), "fw.bin")
	os.WriteFile(p, b.data, 0o644)
	ref, err := c.Add(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	if ref.Hex() != b.ref("").Hex() || ref.Size != uint64(len(b.data)) || ref.URL != "file://"+p {
		t.Fatalf("ref %+v", ref)
	}
	mustGet(t, c, b, ref).Close()
	if st := c.Stats(); st.Fetches != 0 || st.Hits != 1 || len(entries(t, dir)) != 1 {
		t.Fatalf("stats %+v", st)
	}
	empty := filepath.Join(t.TempDir(), "empty")
	os.WriteFile(empty, nil, 0o644)
	if _, err := c.Add(context.Background(), empty); !errors.Is(err, images.ErrSizeMismatch) {
		t.Fatalf("Add of an empty file: %v", err)
	}
	if _, err := c.Add(context.Background(), filepath.Join(t.TempDir(), "absent")); !errors.Is(err, images.ErrNotFound) {
		t.Fatalf("Add of a missing file: %v", err)
	}
	if l := leftovers(t, dir); len(l) != 0 {
		t.Fatalf("left %q", l)
	}
}
