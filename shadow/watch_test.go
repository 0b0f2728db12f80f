package shadow_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/edgefence/edgefence/shadow"
)

// watcher runs Store.Watch in the background for a test and hands its
// events over a channel.
type watcher struct {
	events chan shadow.Event
	cancel context.CancelFunc
	done   chan error
}

func startWatch(t *testing.T, st *shadow.Store, dev string, from int64) *watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &watcher{events: make(chan shadow.Event, 100), cancel: cancel, done: make(chan error, 1)}
	go func() {
		w.done <- st.Watch(ctx, dev, from, func(ev shadow.Event) error {
			select {
			case w.events <- ev:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	}()
	t.Cleanup(func() { w.stop(t) })
	return w
}

// stop cancels the watch and waits for Watch to return.
func (w *watcher) stop(t *testing.T) {
	w.cancel()
	select {
	case err, ok := <-w.done:
		if ok && !errors.Is(err, context.Canceled) {
			t.Errorf("Watch returned %v, want context.Canceled", err)
		}
		if ok {
			close(w.done)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Watch did not return after cancel")
	}
}

func (w *watcher) next(t *testing.T) shadow.Event {
	t.Helper()
	select {
	case ev := <-w.events:
		if ev.Err != nil {
			t.Fatalf("event error: %v", ev.Err)
		}
		return ev
	case <-time.After(10 * time.Second):
		t.Fatal("no watch event within 10s")
	}
	return shadow.Event{}
}

func (w *watcher) none(t *testing.T) {
	t.Helper()
	select {
	case ev := <-w.events:
		t.Fatalf("unexpected event %+v", ev)
	case <-time.After(100 * time.Millisecond):
	}
}

func TestWatchSyncThenPuts(t *testing.T) {
	cli := newClient(t)
	ctx := ctxT(t)
	st := newStore(t, cli.Client, newPrefix(), "app")
	if _, err := st.UpdateDesiredAny(ctx, "d1", obj(t, `{"temp":20}`)); err != nil {
		t.Fatal(err)
	}
	w := startWatch(t, st, "d1", 0)
	ev := w.next(t)
	if ev.Kind != shadow.EventSync || ev.Device != "d1" || !shadow.Equal(ev.Desired.Fields, obj(t, `{"temp":20}`)) {
		t.Fatalf("first event %+v, want sync", ev)
	}
	s2, err := st.UpdateDesiredAny(ctx, "d1", obj(t, `{"temp":21}`))
	if err != nil {
		t.Fatal(err)
	}
	ev = w.next(t)
	if ev.Kind != shadow.EventPut || ev.Revision != s2.Version || ev.Desired.Version != s2.Version || !shadow.Equal(ev.Desired.Fields, obj(t, `{"temp":21}`)) {
		t.Fatalf("event %+v, want put at %d", ev, s2.Version)
	}
	// Reported writes and other devices do not show on d1's desired watch.
	h := lockDevice(t, cli.Client, st, "d1")
	if _, err := st.UpdateReported(ctx, "d1", obj(t, `{"temp":21}`), h.key, h.token); err != nil {
		t.Fatal(err)
	}
	if _, err := st.UpdateDesiredAny(ctx, "d2", obj(t, `{"temp":1}`)); err != nil {
		t.Fatal(err)
	}
	w.none(t)
	if _, err := cli.Delete(ctx, st.DesiredKey("d1")); err != nil {
		t.Fatal(err)
	}
	if ev = w.next(t); ev.Kind != shadow.EventDelete || len(ev.Desired.Fields) != 0 {
		t.Fatalf("event %+v, want delete", ev)
	}
}

func TestWatchAllDevices(t *testing.T) {
	cli := newClient(t)
	ctx := ctxT(t)
	st := newStore(t, cli.Client, newPrefix(), "app")
	w := startWatch(t, st, "", rev(t, cli.Client)+1)
	h := lockDevice(t, cli.Client, st, "d1") // lock keys are under the same prefix
	for _, d := range []string{"d1", "d2", "d3"} {
		if _, err := st.UpdateDesiredAny(ctx, d, obj(t, `{"on":true}`)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.UpdateReported(ctx, "d1", obj(t, `{"on":true}`), h.key, h.token); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"d1", "d2", "d3"} {
		if ev := w.next(t); ev.Kind != shadow.EventPut || ev.Device != d {
			t.Fatalf("event %+v, want put of %s", ev, d)
		}
	}
	w.none(t)
}

// A watcher that stopped resumes from the last revision it saw + 1 and
// gets every change made meanwhile, in order, as puts.
func TestWatchResumesAfterGap(t *testing.T) {
	cli := newClient(t)
	ctx := ctxT(t)
	st := newStore(t, cli.Client, newPrefix(), "app")
	w := startWatch(t, st, "d1", rev(t, cli.Client)+1)
	if _, err := st.UpdateDesiredAny(ctx, "d1", obj(t, `{"n":0}`)); err != nil {
		t.Fatal(err)
	}
	last := w.next(t).Revision
	w.stop(t)

	var want []int64
	for i := 1; i <= 3; i++ {
		s, err := st.UpdateDesiredAny(ctx, "d1", map[string]any{"n": i})
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, s.Version)
	}
	w2 := startWatch(t, st, "d1", last+1)
	for i, v := range want {
		ev := w2.next(t)
		if ev.Kind != shadow.EventPut || ev.Revision != v || ev.Desired.Fields["n"] != float64(i+1) {
			t.Fatalf("event %d: %+v, want put n=%d at %d", i, ev, i+1, v)
		}
	}
	w2.none(t)
}

// When the revisions to resume from were compacted, Watch falls back to a
// full read (EventSync with the current state) and carries on from there.
func TestWatchAfterCompaction(t *testing.T) {
	cli := newClient(t)
	ctx := ctxT(t)
	st := newStore(t, cli.Client, newPrefix(), "app")
	if _, err := st.UpdateDesiredAny(ctx, "d2", obj(t, `{"x":1}`)); err != nil {
		t.Fatal(err)
	}
	w := startWatch(t, st, "", 0)
	if ev := w.next(t); ev.Kind != shadow.EventSync || ev.Device != "d2" {
		t.Fatalf("%+v", ev)
	}
	if _, err := st.UpdateDesiredAny(ctx, "d1", obj(t, `{"n":0}`)); err != nil {
		t.Fatal(err)
	}
	last := w.next(t).Revision
	w.stop(t)

	for i := 1; i <= 3; i++ {
		if _, err := st.UpdateDesiredAny(ctx, "d1", map[string]any{"n": i}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cli.Delete(ctx, st.DesiredKey("d2")); err != nil {
		t.Fatal(err)
	}
	cur := rev(t, cli.Client)
	if _, err := cli.Compact(ctx, cur); err != nil {
		t.Fatal(err)
	}
	// Resuming needs revision last+1, compacted away. The events of the
	// first watch told us about d1 and d2; a fresh Watch only knows what
	// the full read shows, so d2's deletion cannot be reported to it.
	w2 := startWatch(t, st, "", last+1)
	ev := w2.next(t)
	if ev.Kind != shadow.EventSync || ev.Device != "d1" || ev.Desired.Fields["n"] != float64(3) || ev.Revision < cur {
		t.Fatalf("event %+v, want sync of d1 n=3 at ≥ %d", ev, cur)
	}
	w2.none(t)
	s, err := st.UpdateDesiredAny(ctx, "d1", obj(t, `{"n":4}`))
	if err != nil {
		t.Fatal(err)
	}
	if ev := w2.next(t); ev.Kind != shadow.EventPut || ev.Revision != s.Version {
		t.Fatalf("after resync: %+v, want put at %d", ev, s.Version)
	}
}
