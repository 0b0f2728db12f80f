package shadow_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgefence/edgefence/shadow"
)

func openCache(t *testing.T, dir string, now func() time.Time) *shadow.Cache {
	t.Helper()
	c, err := shadow.OpenCache(dir, &shadow.CacheOptions{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestCacheDesired(t *testing.T) {
	dir := t.TempDir()
	c := openCache(t, dir, nil)
	if _, ok, err := c.Desired("d1"); ok || err != nil {
		t.Fatalf("empty cache: %v %v", ok, err)
	}
	v5 := shadow.State{Fields: obj(t, `{"temp":21}`), Version: 5}
	if ok, err := c.PutDesired("d1", v5); !ok || err != nil {
		t.Fatalf("put: %v %v", ok, err)
	}
	// An older version (a replayed event) does not move it back.
	if ok, err := c.PutDesired("d1", shadow.State{Fields: obj(t, `{"temp":1}`), Version: 4}); ok || err != nil {
		t.Fatalf("older put stored: %v %v", ok, err)
	}
	if _, err := c.PutDesired("bad/id", v5); !errors.Is(err, shadow.ErrInvalid) {
		t.Fatalf("bad id: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, shadow.CacheFile)); err != nil {
		t.Fatal(err)
	}
	// A second open of the same file while one is open waits and fails.
	c = openCache(t, dir, nil)
	defer c.Close()
	if _, err := shadow.OpenCache(dir, &shadow.CacheOptions{Timeout: 50 * time.Millisecond}); err == nil {
		t.Fatal("second open of a locked cache succeeded")
	}
	got, ok, err := c.Desired("d1")
	if err != nil || !ok || got.Version != 5 || !shadow.Equal(got.Fields, v5.Fields) {
		t.Fatalf("after reopen: %+v %v %v", got, ok, err)
	}
}

func TestCacheQueueDurableAndOrdered(t *testing.T) {
	dir := t.TempDir()
	c := openCache(t, dir, nil)
	for i, p := range []string{`{"temp":19}`, `{"temp":20,"fan":1}`, `{"fan":null}`} {
		seq, err := c.Enqueue("d1", obj(t, p))
		if err != nil || seq != uint64(i+1) {
			t.Fatalf("enqueue %d: seq %d %v", i, seq, err)
		}
	}
	if _, err := c.Enqueue("d2", obj(t, `{"x":1}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Enqueue("d1", map[string]any{"bad": make(chan int)}); !errors.Is(err, shadow.ErrInvalid) {
		t.Fatalf("bad patch: %v", err)
	}
	if _, err := c.Enqueue("d1", obj(t, deep(8))); err != nil {
		t.Fatal(err)
	}
	if err := c.Discard("d1", 4); err != nil { // seqs 1–4
		t.Fatal(err)
	}
	for i, p := range []string{`{"temp":19}`, `{"temp":20,"fan":1}`, `{"fan":null}`} {
		if _, err := c.Enqueue("d1", obj(t, p)); err != nil {
			t.Fatalf("enqueue %d: %v", i, err)
		}
	}
	c.Close()
	c = openCache(t, dir, nil)
	devs, err := c.PendingDevices()
	if err != nil || len(devs) != 2 || devs[0] != "d1" || devs[1] != "d2" {
		t.Fatalf("devices %v %v", devs, err)
	}
	ps, err := c.Pending("d1")
	if err != nil || len(ps) != 3 {
		t.Fatalf("pending %v %v", ps, err)
	}
	for i, p := range ps {
		if p.Seq != uint64(5+i) {
			t.Fatalf("seq %d at %d: sequence numbers must not be reused", p.Seq, i)
		}
	}
	if !shadow.Equal(ps[2].Patch, map[string]any{"fan": nil}) {
		t.Fatalf("null lost in the queue: %s", js(ps[2].Patch))
	}
	if err := c.Discard("d1", 0); err != nil {
		t.Fatal(err)
	}
	if ps, err := c.Pending("d1"); err != nil || len(ps) != 0 {
		t.Fatalf("after Discard all: %v %v", ps, err)
	}
	if ps, err := c.Pending("d2"); err != nil || len(ps) != 1 {
		t.Fatalf("Discard touched another device: %v %v", ps, err)
	}
	c.Close()
	if _, err := c.Enqueue("d1", obj(t, `{"a":1}`)); !errors.Is(err, shadow.ErrClosed) {
		t.Fatalf("after Close: %v, want ErrClosed", err)
	}
}

func TestCacheFlush(t *testing.T) {
	cli := newClient(t)
	ctx := ctxT(t)
	prefix := newPrefix()
	st := newStore(t, cli.Client, prefix, "gw-a")
	t0 := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	clock := t0
	c := openCache(t, t.TempDir(), func() time.Time { clock = clock.Add(time.Second); return clock })
	defer c.Close()

	h1 := lockDevice(t, cli.Client, st, "d1")
	h2 := lockDevice(t, cli.Client, st, "d2")
	for _, p := range []string{`{"temp":19,"fan":1}`, `{"temp":20}`, `{"fan":null,"mode":"eco"}`} {
		if _, err := c.Enqueue("d1", obj(t, p)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Enqueue("d2", obj(t, `{"x":1}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Enqueue("d3", obj(t, `{"x":1}`)); err != nil {
		t.Fatal(err)
	}
	// d2 was taken over while we were offline: our token is fenced.
	if _, err := cli.Delete(ctx, h2.key); err != nil {
		t.Fatal(err)
	}
	held := map[string]*holder{"d1": h1, "d2": h2} // d3: not held, skipped
	fenceFn := func(dev string) (string, int64, bool) {
		h, ok := held[dev]
		if !ok {
			return "", 0, false
		}
		return h.key, h.token, true
	}
	fenced, err := c.Flush(ctx, st, fenceFn)
	if !errors.Is(err, shadow.ErrFenced) || len(fenced) != 1 || fenced[0] != "d2" {
		t.Fatalf("flush: fenced %v, err %v", fenced, err)
	}
	rep, err := st.GetReported(ctx, "d1")
	if err != nil {
		t.Fatal(err)
	}
	if want := obj(t, `{"temp":20,"mode":"eco"}`); !shadow.Equal(rep.Fields, want) {
		t.Fatalf("reported %s, want %s (patches in order)", js(rep.Fields), js(want))
	}
	// Metadata keeps the time each patch was queued, not the flush time.
	if m := rep.Meta["/temp"]; !m.At.Equal(t0.Add(2*time.Second)) || m.Token != h1.token {
		t.Fatalf("meta %+v", m)
	}
	if ps, _ := c.Pending("d1"); len(ps) != 0 {
		t.Fatalf("d1 still has %d pending", len(ps))
	}
	// Fenced and not-held queues are kept; nothing was written for them.
	for _, d := range []string{"d2", "d3"} {
		if ps, _ := c.Pending(d); len(ps) != 1 {
			t.Fatalf("%s: %d pending, want 1", d, len(ps))
		}
		if r, _ := cli.Get(ctx, st.ReportedKey(d)); len(r.Kvs) != 0 {
			t.Fatalf("%s: reported written", d)
		}
	}
	// A new lock for d2: the queue drains under the new token.
	h2b := lockDevice(t, cli.Client, st, "d2")
	held["d2"] = h2b
	if fenced, err := c.Flush(ctx, st, fenceFn); err != nil || len(fenced) != 0 {
		t.Fatalf("second flush: %v %v", fenced, err)
	}
	if r, _ := st.GetReported(ctx, "d2"); r.Meta["/x"].Token != h2b.token {
		t.Fatalf("d2 reported %+v", r)
	}
}
