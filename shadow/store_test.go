package shadow_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/edgefence/edgefence/shadow"
)

func TestDesiredConflict(t *testing.T) {
	cli := newClient(t)
	prefix := newPrefix()
	app1, app2 := newStore(t, cli.Client, prefix, "app1"), newStore(t, cli.Client, prefix, "app2")
	ctx := ctxT(t)

	// Version 0: the key must not exist yet.
	st, err := app1.UpdateDesired(ctx, "d1", obj(t, `{"temp":20}`), 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := app2.UpdateDesired(ctx, "d1", obj(t, `{"temp":19}`), 0); !errors.Is(err, shadow.ErrConflict) {
		t.Fatalf("create over existing: %v, want ErrConflict", err)
	}
	// Both read version v; app1 writes first; app2's write conflicts and
	// carries the current version; retried with it, it succeeds.
	v := st.Version
	st1, err := app1.UpdateDesired(ctx, "d1", obj(t, `{"mode":"eco"}`), v)
	if err != nil {
		t.Fatal(err)
	}
	_, err = app2.UpdateDesired(ctx, "d1", obj(t, `{"fan":3}`), v)
	var ce *shadow.ConflictError
	if !errors.As(err, &ce) || !errors.Is(err, shadow.ErrConflict) {
		t.Fatalf("stale write: %v, want *ConflictError", err)
	}
	if ce.Current != st1.Version || ce.Want != v || ce.Device != "d1" {
		t.Fatalf("conflict %+v, want current %d", ce, st1.Version)
	}
	if _, err := app2.UpdateDesired(ctx, "d1", obj(t, `{"fan":3}`), ce.Current); err != nil {
		t.Fatal(err)
	}
	got, err := app1.GetDesired(ctx, "d1")
	if err != nil {
		t.Fatal(err)
	}
	if want := obj(t, `{"temp":20,"mode":"eco","fan":3}`); !shadow.Equal(got.Fields, want) {
		t.Fatalf("desired %s, want %s: an update was lost", js(got.Fields), js(want))
	}
	if got.Meta["/fan"].By != "app2" || got.Meta["/mode"].By != "app1" || got.Meta["/temp"].Token != 0 {
		t.Fatalf("meta %+v", got.Meta)
	}
}

// Writers hammering one desired key lose no update: every write that
// returned success is in the result, and a write that gave up (a
// *ConflictError after MaxRetries) left nothing behind.
func TestDesiredAnyNoLostUpdate(t *testing.T) {
	cli := newClient(t)
	prefix := newPrefix()
	ctx := ctxT(t)
	const writers, each = 4, 10
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		done = map[string]bool{}
		errs []error
	)
	for w := range writers {
		st := newStore(t, cli.Client, prefix, fmt.Sprintf("app%d", w))
		wg.Go(func() {
			for i := range each {
				k := fmt.Sprintf("w%d_%d", w, i)
				_, err := st.UpdateDesiredAny(ctx, "d1", map[string]any{k: i})
				mu.Lock()
				var ce *shadow.ConflictError
				switch {
				case err == nil:
					done[k] = true
				case errors.As(err, &ce) && ce.Attempts > 0:
					t.Logf("gave up: %v", err)
				default:
					errs = append(errs, err)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		t.Fatal(err)
	}
	got, err := newStore(t, cli.Client, prefix, "").GetDesired(ctx, "d1")
	if err != nil {
		t.Fatal(err)
	}
	for k := range done {
		if _, ok := got.Fields[k]; !ok {
			t.Errorf("update %s succeeded but is lost", k)
		}
	}
	if len(got.Fields) != len(done) {
		t.Fatalf("%d fields, %d successful writes", len(got.Fields), len(done))
	}
	if len(done) < writers*each*9/10 {
		t.Fatalf("only %d of %d writes succeeded", len(done), writers*each)
	}
}

func TestReportedByHolder(t *testing.T) {
	cli := newClient(t)
	prefix := newPrefix()
	ctx := ctxT(t)
	st := newStore(t, cli.Client, prefix, "gw-a")
	h := lockDevice(t, cli.Client, st, "d1")

	if _, err := st.UpdateDesired(ctx, "d1", obj(t, `{"temp":21,"mode":"eco"}`), 0); err != nil {
		t.Fatal(err)
	}
	r1, err := st.UpdateReported(ctx, "d1", obj(t, `{"temp":19,"fw":"1.2"}`), h.key, h.token)
	if err != nil {
		t.Fatal(err)
	}
	// Steady state: one etcd request per reported write.
	before := cli.reqs.Load()
	r2, err := st.UpdateReported(ctx, "d1", obj(t, `{"temp":21}`), h.key, h.token)
	if err != nil {
		t.Fatal(err)
	}
	if n := cli.reqs.Load() - before; n != 1 {
		t.Fatalf("%d etcd requests for a reported write, want 1", n)
	}
	// Another writer under the same lock (another Store: its own memory)
	// moves the reported key; our stale base costs one failed txn, which
	// returns the current state, and one that succeeds — no extra read.
	other := newStore(t, cli.Client, prefix, "gw-a2")
	if _, err := other.UpdateReported(ctx, "d1", obj(t, `{"rssi":-60}`), h.key, h.token); err != nil {
		t.Fatal(err)
	}
	before = cli.reqs.Load()
	if r2, err = st.UpdateReported(ctx, "d1", obj(t, `{"temp":21}`), h.key, h.token); err != nil {
		t.Fatal(err)
	}
	if n := cli.reqs.Load() - before; n != 2 {
		t.Fatalf("%d etcd requests after a conflict, want 2", n)
	}
	if r2.Version <= r1.Version {
		t.Fatalf("version %d after %d", r2.Version, r1.Version)
	}
	doc, err := st.Get(ctx, "d1")
	if err != nil {
		t.Fatal(err)
	}
	if want := obj(t, `{"temp":21,"fw":"1.2","rssi":-60}`); !shadow.Equal(doc.Reported.Fields, want) {
		t.Fatalf("reported %s", js(doc.Reported.Fields))
	}
	if want := obj(t, `{"mode":"eco"}`); !shadow.Equal(doc.Delta, want) {
		t.Fatalf("delta %s, want %s", js(doc.Delta), js(want))
	}
	if m := doc.Reported.Meta["/temp"]; m.Token != h.token || m.By != "gw-a" || m.At.IsZero() {
		t.Fatalf("meta %+v, want token %d", m, h.token)
	}
	if doc.Version != max(doc.Desired.Version, doc.Reported.Version) || doc.Reported.Version != r2.Version {
		t.Fatalf("versions %+v", doc)
	}
	// The value in etcd is the readable JSON record.
	raw, err := cli.Get(ctx, st.ReportedKey("d1"))
	if err != nil {
		t.Fatal(err)
	}
	if v := string(raw.Kvs[0].Value); !strings.HasPrefix(v, `{"state":{"fw":"1.2","rssi":-60,"temp":21},"meta":{`) {
		t.Fatalf("stored %s", v)
	}
}

// Two writers under the same lock (two Stores, each with its own memory of
// the reported state) never lose each other's fields: the ModRevision
// compare catches the stale base, the retry merges into the current state.
func TestReportedConcurrentWritersNoLostUpdate(t *testing.T) {
	cli := newClient(t)
	prefix := newPrefix()
	ctx := ctxT(t)
	s1, s2 := newStore(t, cli.Client, prefix, "w1"), newStore(t, cli.Client, prefix, "w2")
	h := lockDevice(t, cli.Client, s1, "d1")
	const each = 15
	var wg sync.WaitGroup
	errs := make(chan error, 2*each)
	for w, st := range []*shadow.Store{s1, s2} {
		wg.Go(func() {
			for i := range each {
				if _, err := st.UpdateReported(ctx, "d1", map[string]any{fmt.Sprintf("w%d_%d", w, i): i}, h.key, h.token); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	got, err := s1.GetReported(ctx, "d1")
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Fields) != 2*each {
		t.Fatalf("%d fields, want %d: lost updates", len(got.Fields), 2*each)
	}
}

// I5: once the lock key is gone or belongs to a newer holder, the old
// holder's reported write is refused by etcd itself and nothing is written.
func TestReportedFencedAfterTakeover(t *testing.T) {
	cli := newClient(t)
	prefix := newPrefix()
	ctx := ctxT(t)
	old := newStore(t, cli.Client, prefix, "gw-a")
	a := lockDevice(t, cli.Client, old, "d1")
	if _, err := old.UpdateReported(ctx, "d1", obj(t, `{"temp":19}`), a.key, a.token); err != nil {
		t.Fatal(err)
	}

	// a's lease is lost (its lock key deleted, as on expiry); b campaigns
	// and wins with a real Mutex: a strictly greater token.
	if _, err := cli.Delete(ctx, a.key); err != nil {
		t.Fatal(err)
	}
	nw := newStore(t, cli.Client, prefix, "gw-b")
	b := lockDevice(t, cli.Client, nw, "d1")
	if b.token <= a.token {
		t.Fatalf("token %d after %d", b.token, a.token)
	}
	if _, err := nw.UpdateReported(ctx, "d1", obj(t, `{"temp":22}`), b.key, b.token); err != nil {
		t.Fatal(err)
	}
	before, err := cli.Get(ctx, nw.ReportedKey("d1"))
	if err != nil {
		t.Fatal(err)
	}

	// The old holder resumes and writes: refused, ErrFenced, nothing written.
	_, err = old.UpdateReported(ctx, "d1", obj(t, `{"temp":5,"stale":true}`), a.key, a.token)
	if !errors.Is(err, shadow.ErrFenced) {
		t.Fatalf("old holder's write: %v, want ErrFenced", err)
	}
	// Its lock key recreated (same name, new CreateRevision) does not
	// revive the old token either.
	if _, err := cli.Put(ctx, a.key, ""); err != nil {
		t.Fatal(err)
	}
	if _, err = old.UpdateReported(ctx, "d1", obj(t, `{"stale":true}`), a.key, a.token); !errors.Is(err, shadow.ErrFenced) {
		t.Fatalf("after recreate: %v, want ErrFenced", err)
	}
	if _, err := cli.Delete(ctx, a.key); err != nil {
		t.Fatal(err)
	}
	after, err := cli.Get(ctx, nw.ReportedKey("d1"))
	if err != nil {
		t.Fatal(err)
	}
	if after.Kvs[0].ModRevision != before.Kvs[0].ModRevision || string(after.Kvs[0].Value) != string(before.Kvs[0].Value) {
		t.Fatal("a fenced write changed the reported state")
	}
	got, err := nw.GetReported(ctx, "d1")
	if err != nil {
		t.Fatal(err)
	}
	if !shadow.Equal(got.Fields, obj(t, `{"temp":22}`)) || got.Meta["/temp"].Token != b.token {
		t.Fatalf("reported %s %+v: only the new holder's writes may show", js(got.Fields), got.Meta)
	}

	// The new holder releases properly; its token is fenced from then on.
	if err := b.mu.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := nw.UpdateReported(ctx, "d1", obj(t, `{"temp":23}`), b.key, b.token); !errors.Is(err, shadow.ErrFenced) {
		t.Fatalf("after unlock: %v, want ErrFenced", err)
	}
}

func TestBadInputWritesNothing(t *testing.T) {
	cli := newClient(t)
	prefix := newPrefix()
	ctx := ctxT(t)
	known := map[string]bool{"d1": true, "d2": true}
	st := shadow.NewStore(cli.Client, shadow.StoreConfig{Prefix: prefix, Writer: "t",
		KnownDevice: func(d string) bool { return known[d] }})
	h := lockDevice(t, cli.Client, st, "d1")
	if _, err := st.UpdateDesired(ctx, "d1", obj(t, `{"big":""}`), 0); err != nil {
		t.Fatal(err)
	}

	deepPatch := map[string]any{}
	cur := deepPatch
	for range 8 {
		next := map[string]any{}
		cur["a"] = next
		cur = next
	}
	huge := map[string]any{"big": strings.Repeat("x", shadow.DefaultMaxSize)}
	half := map[string]any{"big2": strings.Repeat("x", shadow.DefaultMaxSize*2/3)}

	cases := []struct {
		name string
		do   func() error
		want error
	}{
		{"desired too deep", func() error { _, err := st.UpdateDesiredAny(ctx, "d1", deepPatch); return err }, shadow.ErrTooDeep},
		{"desired too large", func() error { _, err := st.UpdateDesiredAny(ctx, "d1", huge); return err }, shadow.ErrTooLarge},
		{"desired unsupported type", func() error {
			_, err := st.UpdateDesiredAny(ctx, "d1", map[string]any{"f": func() {}})
			return err
		}, shadow.ErrInvalid},
		{"desired invalid device id", func() error { _, err := st.UpdateDesiredAny(ctx, "bad/id", obj(t, `{"a":1}`)); return err }, shadow.ErrInvalid},
		{"desired empty device id", func() error { _, err := st.UpdateDesired(ctx, "", obj(t, `{"a":1}`), 0); return err }, shadow.ErrInvalid},
		{"desired unknown device", func() error { _, err := st.UpdateDesiredAny(ctx, "d9", obj(t, `{"a":1}`)); return err }, shadow.ErrUnknownDevice},
		{"desired negative version", func() error { _, err := st.UpdateDesired(ctx, "d1", obj(t, `{"a":1}`), -1); return err }, shadow.ErrInvalid},
		{"reported too deep", func() error { _, err := st.UpdateReported(ctx, "d1", deepPatch, h.key, h.token); return err }, shadow.ErrTooDeep},
		{"reported too large", func() error { _, err := st.UpdateReported(ctx, "d1", huge, h.key, h.token); return err }, shadow.ErrTooLarge},
		{"reported token 0", func() error { _, err := st.UpdateReported(ctx, "d1", obj(t, `{"a":1}`), h.key, 0); return err }, shadow.ErrInvalid},
		{"reported lock key of another device", func() error {
			_, err := st.UpdateReported(ctx, "d2", obj(t, `{"a":1}`), h.key, h.token)
			return err
		}, shadow.ErrInvalid},
		{"reported unknown device", func() error { _, err := st.UpdateReported(ctx, "d9", obj(t, `{"a":1}`), h.key, h.token); return err }, shadow.ErrUnknownDevice},
		{"get invalid device", func() error { _, err := st.Get(ctx, "../x"); return err }, shadow.ErrInvalid},
		{"watch invalid device", func() error { return st.Watch(ctx, ".hidden", 0, func(shadow.Event) error { return nil }) }, shadow.ErrInvalid},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r0 := rev(t, cli.Client)
			err := c.do()
			if !errors.Is(err, c.want) {
				t.Fatalf("err = %v, want %v", err, c.want)
			}
			if r1 := rev(t, cli.Client); r1 != r0 {
				t.Fatalf("etcd revision moved %d → %d: something was written", r0, r1)
			}
		})
	}
	// A patch within the limit whose merge result is not: refused whole.
	if _, err := st.UpdateDesiredAny(ctx, "d1", half); err != nil {
		t.Fatal(err)
	}
	r0 := rev(t, cli.Client)
	if _, err := st.UpdateDesiredAny(ctx, "d1", map[string]any{"big": strings.Repeat("y", shadow.DefaultMaxSize/2)}); !errors.Is(err, shadow.ErrTooLarge) {
		t.Fatalf("merged too large: %v", err)
	}
	if rev(t, cli.Client) != r0 {
		t.Fatal("written")
	}
	// Garbage written by hand under a twin key is reported, not a panic.
	if _, err := cli.Put(ctx, st.DesiredKey("d2"), "not json"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.GetDesired(ctx, "d2"); !errors.Is(err, shadow.ErrInvalid) {
		t.Fatalf("garbage: %v", err)
	}
}

func TestGetEmpty(t *testing.T) {
	cli := newClient(t)
	st := newStore(t, cli.Client, newPrefix(), "")
	doc, err := st.Get(ctxT(t), "nobody")
	if err != nil {
		t.Fatal(err)
	}
	if doc.Version != 0 || len(doc.Desired.Fields) != 0 || len(doc.Delta) != 0 || doc.Revision == 0 {
		t.Fatalf("%+v", doc)
	}
}
