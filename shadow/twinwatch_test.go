package shadow_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/edgefence/edgefence/shadow"
)

// twinWatcher runs Store.WatchTwin in the background for a test.
type twinWatcher struct {
	events chan shadow.TwinEvent
	cancel context.CancelFunc
	done   chan error
}

func startTwinWatch(t *testing.T, st *shadow.Store, dev string, from *shadow.Document) *twinWatcher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &twinWatcher{events: make(chan shadow.TwinEvent, 100), cancel: cancel, done: make(chan error, 1)}
	go func() {
		w.done <- st.WatchTwin(ctx, dev, from, func(ev shadow.TwinEvent) error {
			select {
			case w.events <- ev:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	}()
	t.Cleanup(func() {
		w.cancel()
		select {
		case err := <-w.done:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("WatchTwin returned %v, want context.Canceled", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("WatchTwin did not return after cancel")
		}
	})
	return w
}

func (w *twinWatcher) next(t *testing.T) shadow.TwinEvent {
	t.Helper()
	select {
	case ev := <-w.events:
		if ev.Err != nil {
			t.Fatalf("event error: %v", ev.Err)
		}
		return ev
	case <-time.After(10 * time.Second):
		t.Fatal("no twin event within 10s")
	}
	return shadow.TwinEvent{}
}

// WatchTwin follows both sides of one device, with the whole twin and its
// delta after each change.
func TestWatchTwinBothSides(t *testing.T) {
	cli := newClient(t)
	ctx := ctxT(t)
	st := newStore(t, cli.Client, newPrefix(), "app")
	if _, err := st.UpdateDesiredAny(ctx, "d1", obj(t, `{"x":1}`)); err != nil {
		t.Fatal(err)
	}
	w := startTwinWatch(t, st, "d1", nil)
	ev := w.next(t)
	if ev.Kind != shadow.EventSync || ev.Side != "" || ev.Doc.Desired.Fields["x"] != 1.0 || ev.Doc.Reported.Version != 0 {
		t.Fatalf("%+v", ev)
	}
	// Another device's twin is not this watch's business.
	if _, err := st.UpdateDesiredAny(ctx, "d10", obj(t, `{"x":9}`)); err != nil {
		t.Fatal(err)
	}
	d, err := st.UpdateDesiredAny(ctx, "d1", obj(t, `{"y":2}`))
	if err != nil {
		t.Fatal(err)
	}
	ev = w.next(t)
	if ev.Kind != shadow.EventPut || ev.Side != shadow.SideDesired || ev.Doc.Revision != d.Version ||
		ev.Prev.Fields["y"] != nil || js(ev.Doc.Delta) != `{"x":1,"y":2}` {
		t.Fatalf("%+v", ev)
	}
	h := lockDevice(t, cli.Client, st, "d1")
	r, err := st.UpdateReported(ctx, "d1", obj(t, `{"x":1}`), h.key, h.token)
	if err != nil {
		t.Fatal(err)
	}
	ev = w.next(t)
	if ev.Kind != shadow.EventPut || ev.Side != shadow.SideReported || ev.Doc.Reported.Version != r.Version ||
		ev.Doc.Reported.Meta["/x"].Token != h.token || js(ev.Doc.Delta) != `{"y":2}` || ev.Doc.Desired.Version != d.Version {
		t.Fatalf("%+v", ev)
	}
	if _, err := cli.Delete(ctx, st.DesiredKey("d1")); err != nil {
		t.Fatal(err)
	}
	ev = w.next(t)
	if ev.Kind != shadow.EventDelete || ev.Side != shadow.SideDesired || len(ev.Doc.Desired.Fields) != 0 ||
		len(ev.Doc.Delta) != 0 || ev.Prev.Fields["y"] != 2.0 {
		t.Fatalf("%+v", ev)
	}
}

// Watching from a document whose revision was compacted away: a full read
// (EventSync) of both sides, then changes from there.
func TestWatchTwinAfterCompaction(t *testing.T) {
	cli := newClient(t)
	ctx := ctxT(t)
	st := newStore(t, cli.Client, newPrefix(), "app")
	if _, err := st.UpdateDesiredAny(ctx, "d1", obj(t, `{"n":0}`)); err != nil {
		t.Fatal(err)
	}
	doc, err := st.Get(ctx, "d1")
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		if _, err := st.UpdateDesiredAny(ctx, "d1", map[string]any{"n": i}); err != nil {
			t.Fatal(err)
		}
	}
	cur := rev(t, cli.Client)
	if _, err := cli.Compact(ctx, cur); err != nil {
		t.Fatal(err)
	}
	w := startTwinWatch(t, st, "d1", doc)
	ev := w.next(t)
	if ev.Kind != shadow.EventSync || ev.Doc.Desired.Fields["n"] != 3.0 || ev.Doc.Revision < cur {
		t.Fatalf("%+v, want sync with n=3 at ≥ %d", ev, cur)
	}
	s, err := st.UpdateDesiredAny(ctx, "d1", obj(t, `{"n":4}`))
	if err != nil {
		t.Fatal(err)
	}
	if ev := w.next(t); ev.Kind != shadow.EventPut || ev.Doc.Revision != s.Version || ev.Prev.Fields["n"] != 3.0 {
		t.Fatalf("after resync: %+v, want put at %d", ev, s.Version)
	}
	if err := st.WatchTwin(ctx, "d2", doc, nil); !errors.Is(err, shadow.ErrInvalid) {
		t.Errorf("a document of another device: %v", err)
	}
}
