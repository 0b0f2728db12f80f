package offline_test

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/fxamacker/cbor/v2"
	"go.etcd.io/bbolt"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/offline"
)

// bodyOf is a CBOR byte string of exactly n encoded bytes (n > 2), its
// bytes made from seed.
func bodyOf(t testing.TB, n int, seed byte) cbor.RawMessage {
	t.Helper()
	for k := n - 3; k < n; k++ {
		data := make([]byte, max(k, 0))
		for i := range data {
			data[i] = seed + byte(i*7)
		}
		b, err := fence.EncodeBody(data)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) == n {
			return b
		}
	}
	t.Fatalf("no CBOR byte string of %d bytes", n)
	return nil
}

// checkBody fails unless r shows body as kept (pending, or small) or, for a
// terminal entry with a body over offline.KeepBodyMax, as dropped with its
// size and SHA-256.
func checkBody(t testing.TB, r offline.Record, body []byte) {
	t.Helper()
	if err := bodyErr(r, body); err != nil {
		t.Fatal(err)
	}
}

func bodyErr(r offline.Record, body []byte) error {
	drop := !r.Pending() && len(body) > offline.KeepBodyMax
	sum := sha256.Sum256(body)
	switch {
	case r.BodyBytes != len(body) || r.BodyDropped != drop:
		return fmt.Errorf("%s (%s): body %d bytes, dropped %v; want %d bytes, dropped %v", r.ID, r.StateString(), r.BodyBytes, r.BodyDropped, len(body), drop)
	case drop && !bytes.Equal(r.BodySHA256, sum[:]):
		return fmt.Errorf("%s: dropped body's sha256 %x, want %x", r.ID, r.BodySHA256, sum)
	case !drop && r.BodySHA256 != nil:
		return fmt.Errorf("%s: sha256 %x of a kept body", r.ID, r.BodySHA256)
	}
	return nil
}

// A terminal entry, resolved or expired, keeps a body of up to KeepBodyMax
// bytes and drops a larger one, keeping its size and SHA-256; the pending
// counts give back the whole envelope's bytes; the stubs read after a
// reopen, refuse a second terminal state, and are compacted as before.
func TestTerminalDropsLargeBody(t *testing.T) {
	clk := newClock()
	path := dbPath(t)
	opts := &offline.Options{Now: clk.Now, Retention: time.Hour}
	ob := open(t, path, opts)
	bodies := map[string][]byte{}
	var entries []*offline.Entry
	for i, n := range []int{0, 3, offline.KeepBodyMax, offline.KeepBodyMax + 1, 30<<10 + 3} {
		for _, end := range []string{"r", "x"} { // resolved, expired
			e := entry("dev", fmt.Sprintf("%s-%d", end, n), 1, uint64(2*i+len(end)))
			if n > 0 {
				e.Envelope.Body = bodyOf(t, n, byte(i))
			}
			if end == "x" {
				e.TTL = time.Second
			}
			appendOK(t, ob, e)
			bodies[e.Envelope.ID], entries = e.Envelope.Body, append(entries, e)
		}
	}
	for _, e := range entries { // pending: every body kept, and sent whole
		r, err := ob.Get(e.Envelope.ID)
		if err != nil {
			t.Fatal(err)
		}
		checkBody(t, r, bodies[r.ID])
	}
	if next, _, err := ob.Next("dev"); err != nil || !bytes.Equal(next.Raw, entries[0].Raw) {
		t.Fatalf("next %v", err)
	}
	clk.Advance(2 * time.Second)
	for _, e := range entries {
		if e.TTL == 0 {
			if err := ob.Resolve(e.Envelope.ID, ack(e, fence.Accepted, "")); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n, err := ob.ExpireDue(); n != len(entries)/2 || err != nil {
		t.Fatalf("expired %d %v", n, err)
	}
	if n, size := ob.Pending("dev"); n != 0 || size != 0 {
		t.Fatalf("after the terminal states: %d pending, %d bytes", n, size)
	}
	for range 2 { // as written, and after a reopen
		for _, e := range entries {
			r, err := ob.Get(e.Envelope.ID)
			if err != nil {
				t.Fatal(err)
			}
			checkBody(t, r, bodies[r.ID])
			if r.Token != e.Envelope.Token || r.Seq != e.Envelope.Seq || r.Kind != e.Envelope.Kind || r.Device != "dev" {
				t.Fatalf("%s: %+v", r.ID, r)
			}
			if err := ob.Resolve(r.ID, ack(e, fence.Duplicate, "")); !errors.Is(err, offline.ErrResolved) {
				t.Fatalf("second resolve of %s: %v", r.ID, err)
			}
		}
		ob.Close()
		ob = open(t, path, opts)
	}
	clk.Advance(time.Hour)
	if n, err := ob.Compact(); n != len(entries) || err != nil {
		t.Fatalf("compacted %d %v", n, err)
	}
}

// Chunks appended and resolved as a firmware download does (a window of
// them pending at a time) leave the file small: 2 MiB after 1,000 chunks
// of 30 KiB (1.2 MiB of it in pages), where without the drop their data
// stays in it (48 MiB), and 4 MiB without putTerminal's delete (a sparse
// leaf page per chunk).
func TestTerminalBodyDropBoundsFile(t *testing.T) {
	const chunks, window, limit = 1000, 16, 4 << 20
	path := dbPath(t)
	ob := open(t, path, nil)
	body := bodyOf(t, 30<<10, 1)
	win := make([]*offline.Entry, 0, window)
	for i := range chunks {
		e := entry(fmt.Sprintf("dev-%d", i%4), fmt.Sprintf("c-%d", i), 1, uint64(i+1))
		e.Envelope.Body = body
		appendOK(t, ob, e)
		if win = append(win, e); len(win) < window && i < chunks-1 {
			continue
		}
		var wg sync.WaitGroup // concurrent: group-committed, as the agent's workers
		for _, e := range win {
			wg.Go(func() {
				if err := ob.Resolve(e.Envelope.ID, ack(e, fence.Accepted, "")); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		win = win[:0]
	}
	if t.Failed() {
		t.FailNow()
	}
	s, err := ob.Stats()
	if err != nil || s.Terminal[fence.Accepted] != chunks || s.Pending != 0 {
		t.Fatalf("stats %+v %v", s, err)
	}
	ob.Close()
	size, used := fileSize(t, path)
	t.Logf("%s: %d bytes (%d in pages) after %d resolved chunks of %d bytes", offline.File, size, used, chunks, len(body))
	if size >= limit { // bbolt grows the file in powers of two: 2 MiB, where 4 would be sparse leaves
		t.Fatalf("%s is %d bytes after %d resolved chunks of %d bytes, want under %d", offline.File, size, chunks, len(body), limit)
	}
}

// fileSize returns the size of the closed outbox file at path and the part
// of it bbolt has handed out as pages (in use or free; the rest is growth
// ahead of need).
func fileSize(t testing.TB, path string) (size, pages int64) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.View(func(tx *bbolt.Tx) error { pages = tx.Size(); return nil })
	return fi.Size(), pages
}

// An outbox file written before bodies were dropped (testdata/README.md)
// reads: its terminal entry keeps its body as written, its pending entry
// with a large body is sent whole and, once resolved, stored without it.
func TestOutboxV1FileStillReads(t *testing.T) {
	old, err := os.ReadFile(filepath.Join("testdata", "outbox-v1.db"))
	if err != nil {
		t.Fatal(err)
	}
	path := dbPath(t)
	if err := os.WriteFile(path, old, 0o600); err != nil {
		t.Fatal(err)
	}
	clk := newClock()
	ob := open(t, path, &offline.Options{Now: clk.Now})
	big, small := bodyOf(t, 2003, 0), []byte{0x42, 'o', 'n'}
	for i := range big[3:] {
		big[3+i] = 0 // the fixture's 2,000 zero bytes
	}
	want := map[string][]byte{"c-1": big, "c-2": small, "c-3": big, "c-4": nil}
	recs, err := ob.List(offline.Filter{})
	if err != nil || len(recs) != 4 {
		t.Fatalf("list %d %v", len(recs), err)
	}
	for _, r := range recs {
		if r.ID == "c-1" { // terminal, body kept as the old code did
			if r.State != fence.Accepted || r.BodyBytes != len(big) || r.BodyDropped {
				t.Fatalf("c-1: %+v", r)
			}
			continue
		}
		checkBody(t, r, want[r.ID])
	}
	e, ok, err := ob.Next("fw-1")
	if err != nil || !ok || e.Envelope.ID != "c-3" || !bytes.Equal(e.Envelope.Body, big) {
		t.Fatalf("next %+v %v %v", e, ok, err)
	}
	if err := ob.Resolve("c-3", ack(e, fence.Accepted, "")); err != nil {
		t.Fatal(err)
	}
	old1 := &offline.Entry{Envelope: e.Envelope}
	old1.Envelope.ID, old1.Envelope.Seq = "c-1", 1
	if err := ob.Resolve("c-1", ack(old1, fence.Duplicate, "")); !errors.Is(err, offline.ErrResolved) {
		t.Fatalf("resolve of the old terminal entry: %v", err)
	}
	r, err := ob.Get("c-3")
	if err != nil {
		t.Fatal(err)
	}
	checkBody(t, r, big)
	if n, size := ob.Pending("fw-1"); n != 1 || size == 0 {
		t.Fatalf("pending %d, %d bytes", n, size)
	}
}
