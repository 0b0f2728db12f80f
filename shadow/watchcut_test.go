package shadow_test

import (
	"testing"

	"github.com/edgefence/edgefence/shadow"
)

// A running watch cut off from etcd while the revisions it needs are
// compacted: when the connection is back, etcd answers its resumed watch
// with a compaction, and Watch falls back to a full read — EventSync for
// the current state, EventDelete for a device it had seen that is gone —
// then carries on with puts.
func TestWatchCompactedWhileCut(t *testing.T) {
	direct := newClient(t)
	ctx := ctxT(t)
	prefix := newPrefix()
	writer := newStore(t, direct.Client, prefix, "app")
	for _, d := range []string{"d1", "d2"} {
		if _, err := writer.UpdateDesiredAny(ctx, d, obj(t, `{"n":0}`)); err != nil {
			t.Fatal(err)
		}
	}
	proxy, wcli, err := testEtcd.CutClient()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	defer wcli.Close()
	w := startWatch(t, newStore(t, wcli, prefix, "agent"), "", 0)
	for range 2 {
		if ev := w.next(t); ev.Kind != shadow.EventSync {
			t.Fatalf("%+v", ev)
		}
	}
	s, err := writer.UpdateDesiredAny(ctx, "d1", obj(t, `{"n":1}`))
	if err != nil {
		t.Fatal(err)
	}
	if ev := w.next(t); ev.Kind != shadow.EventPut || ev.Revision != s.Version {
		t.Fatalf("%+v", ev)
	}

	proxy.Cut()
	if _, err := writer.UpdateDesiredAny(ctx, "d1", obj(t, `{"n":2}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := direct.Delete(ctx, writer.DesiredKey("d2")); err != nil {
		t.Fatal(err)
	}
	if _, err := writer.UpdateDesiredAny(ctx, "d3", obj(t, `{"n":0}`)); err != nil {
		t.Fatal(err)
	}
	cur := rev(t, direct.Client)
	if _, err := direct.Compact(ctx, cur); err != nil {
		t.Fatal(err)
	}
	if err := proxy.Heal(); err != nil {
		t.Fatal(err)
	}
	if cc := wcli.ActiveConnection(); cc != nil {
		cc.ResetConnectBackoff()
	}

	got := map[string]shadow.Event{}
	for range 3 {
		ev := w.next(t)
		if ev.Revision < cur {
			t.Fatalf("event %+v from before the compaction at %d", ev, cur)
		}
		got[ev.Device] = ev
	}
	if ev := got["d1"]; ev.Kind != shadow.EventSync || ev.Desired.Fields["n"] != float64(2) {
		t.Fatalf("d1: %+v, want sync n=2", ev)
	}
	if ev := got["d3"]; ev.Kind != shadow.EventSync {
		t.Fatalf("d3: %+v, want sync", ev)
	}
	if ev := got["d2"]; ev.Kind != shadow.EventDelete {
		t.Fatalf("d2: %+v, want delete", ev)
	}
	s, err = writer.UpdateDesiredAny(ctx, "d1", obj(t, `{"n":3}`))
	if err != nil {
		t.Fatal(err)
	}
	if ev := w.next(t); ev.Kind != shadow.EventPut || ev.Revision != s.Version {
		t.Fatalf("after resync: %+v, want put at %d", ev, s.Version)
	}
	w.stop(t)
}
