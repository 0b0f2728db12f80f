package fence_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/edgefence/edgefence/fence"
)

func unappliedMarks(t *testing.T, tab *fence.Table, dev string) []fence.Mark {
	t.Helper()
	envs, err := tab.Unapplied(dev)
	if err != nil {
		t.Fatalf("Unapplied(%s): %v", dev, err)
	}
	var ms []fence.Mark
	for _, e := range envs {
		if e.Device != dev {
			t.Fatalf("Unapplied(%s) returned %s's command", dev, e.Device)
		}
		ms = append(ms, fence.Mark{Token: e.Token, Seq: e.Seq})
	}
	return ms
}

func sameMarks(a, b []fence.Mark) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Every accepted command is unapplied, in admission order and in full,
// until Applied; duplicates and stale commands add nothing; the list
// survives a restart; Applied is idempotent.
func TestTableUnapplied(t *testing.T) {
	path := tablePath(t)
	ctx := context.Background()
	tab := openTable(t, path, nil)
	if ms := unappliedMarks(t, tab, "dev-1"); len(ms) != 0 {
		t.Fatalf("fresh table: %v", ms)
	}
	body, err := fence.EncodeBody(map[string]any{"addr": 3, "value": 9})
	if err != nil {
		t.Fatal(err)
	}
	first := cmd("dev-1", 5, 1)
	first.Body = body
	for _, c := range []struct {
		env  *fence.Envelope
		want fence.Verdict
	}{
		{first, fence.Accepted},
		{cmd("dev-1", 5, 2), fence.Accepted},
		{cmd("dev-1", 5, 2), fence.Duplicate},
		{cmd("dev-10", 1, 1), fence.Accepted}, // a device id that extends dev-1's
		{cmd("dev-1", 4, 7), fence.Stale},
		{cmd("dev-1", 6, 1), fence.Accepted},
		{cmd("dev-", 1, 1), fence.Accepted}, // a prefix of dev-1
	} {
		if v, _, err := tab.Admit(ctx, c.env); err != nil || v != c.want {
			t.Fatalf("Admit %s %d/%d: %v %v, want %v", c.env.Device, c.env.Token, c.env.Seq, v, err, c.want)
		}
	}
	want := []fence.Mark{{Token: 5, Seq: 1}, {Token: 5, Seq: 2}, {Token: 6, Seq: 1}}
	if ms := unappliedMarks(t, tab, "dev-1"); !sameMarks(ms, want) {
		t.Fatalf("dev-1 unapplied %v, want %v", ms, want)
	}
	envs, _ := tab.Unapplied("dev-1")
	if got := envs[0]; got.ID != first.ID || got.Holder != first.Holder || got.Kind != first.Kind || string(got.Body) != string(body) {
		t.Fatalf("stored command %+v, want %+v", got, first)
	}
	if ms := unappliedMarks(t, tab, "dev-10"); !sameMarks(ms, []fence.Mark{{Token: 1, Seq: 1}}) {
		t.Fatalf("dev-10: %v", ms)
	}

	if err := tab.Applied(ctx, "dev-1", fence.Mark{Token: 5, Seq: 1}); err != nil {
		t.Fatal(err)
	}
	if err := tab.Applied(ctx, "dev-1", fence.Mark{Token: 5, Seq: 1}); err != nil {
		t.Fatalf("Applied twice: %v", err)
	}
	if err := tab.Applied(ctx, "dev-1", fence.Mark{Token: 99, Seq: 1}); err != nil {
		t.Fatalf("Applied of a mark never admitted: %v", err)
	}
	tab.Close()

	tab = openTable(t, path, nil)
	want = want[1:]
	if ms := unappliedMarks(t, tab, "dev-1"); !sameMarks(ms, want) {
		t.Fatalf("after restart: %v, want %v", ms, want)
	}
	// The mark itself is unchanged by Applied.
	if r, _ := mustGet(t, tab, "dev-1"); r.Mark != (fence.Mark{Token: 6, Seq: 1}) {
		t.Fatalf("mark %v", r.Mark)
	}
	if err := tab.Applied(ctx, "bad/id", fence.Mark{Token: 1, Seq: 1}); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("Applied with a bad device id: %v", err)
	}
	tab.Close()
	if err := tab.Applied(ctx, "dev-1", fence.Mark{Token: 5, Seq: 2}); !errors.Is(err, fence.ErrTableClosed) {
		t.Errorf("Applied after Close: %v", err)
	}
	if _, err := tab.Unapplied("dev-1"); !errors.Is(err, fence.ErrTableClosed) {
		t.Errorf("Unapplied after Close: %v", err)
	}

	ro := openTable(t, path, &fence.TableOptions{ReadOnly: true})
	if ms := unappliedMarks(t, ro, "dev-1"); !sameMarks(ms, want) {
		t.Fatalf("read-only: %v, want %v", ms, want)
	}
	if err := ro.Applied(ctx, "dev-1", want[0]); !errors.Is(err, fence.ErrTableReadOnly) {
		t.Errorf("Applied on read-only: %v", err)
	}
}

// Applied shares group commits with concurrent admits; every admit's
// command is unapplied exactly until its Applied returned.
func TestTableAppliedConcurrent(t *testing.T) {
	for _, noGroup := range []bool{false, true} {
		tab := openTable(t, tablePath(t), &fence.TableOptions{NoGroupCommit: noGroup})
		ctx := context.Background()
		devs := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
		var wg sync.WaitGroup
		for _, dev := range devs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for seq := uint64(1); seq <= 40; seq++ {
					if v, _, err := tab.Admit(ctx, cmd(dev, 1, seq)); err != nil || v != fence.Accepted {
						t.Errorf("%s %d: %v %v", dev, seq, v, err)
						return
					}
					if seq%2 == 0 { // leave the odd ones unapplied
						if err := tab.Applied(ctx, dev, fence.Mark{Token: 1, Seq: seq}); err != nil {
							t.Errorf("%s %d: Applied: %v", dev, seq, err)
							return
						}
					}
				}
			}()
		}
		wg.Wait()
		for _, dev := range devs {
			ms := unappliedMarks(t, tab, dev)
			if len(ms) != 20 {
				t.Fatalf("group=%v %s: %d unapplied, want 20", !noGroup, dev, len(ms))
			}
			for i, m := range ms {
				if m != (fence.Mark{Token: 1, Seq: uint64(2*i + 1)}) {
					t.Fatalf("%s: unapplied %v", dev, ms)
				}
			}
		}
	}
}

// A corrupt unapplied command is reported, never returned or obeyed.
func TestTableUnappliedCorrupt(t *testing.T) {
	path := tablePath(t)
	tab := openTable(t, path, nil)
	if v, _, err := tab.Admit(context.Background(), cmd("dev-1", 2, 1)); err != nil || v != fence.Accepted {
		t.Fatal(v, err)
	}
	tab.Close()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bbolt.Tx) error {
		b := tx.Bucket([]byte("fence.unapplied"))
		k, v := b.Cursor().First()
		v = append([]byte(nil), v...)
		v[len(v)/2] ^= 0x20 // one bit
		return b.Put(append([]byte(nil), k...), v)
	}); err != nil {
		t.Fatal(err)
	}
	db.Close()
	tab = openTable(t, path, nil)
	if envs, err := tab.Unapplied("dev-1"); !errors.Is(err, fence.ErrTableCorrupt) || envs != nil {
		t.Fatalf("corrupt unapplied command: %v %v", envs, err)
	}
}

// MarkApplied writes nothing by itself: the next commit — here another
// admit's — carries the removal, after which AwaitApplied returns; Close
// commits removals no commit carried.
func TestTableMarkAppliedRidesAlong(t *testing.T) {
	path := tablePath(t)
	ctx := context.Background()
	tab := openTable(t, path, nil)
	for seq := uint64(1); seq <= 3; seq++ {
		if v, _, err := tab.Admit(ctx, cmd("dev-1", 1, seq)); err != nil || v != fence.Accepted {
			t.Fatal(v, err)
		}
	}
	t1, err := tab.MarkApplied("dev-1", fence.Mark{Token: 1, Seq: 1})
	if err != nil {
		t.Fatal(err)
	}
	if ms := unappliedMarks(t, tab, "dev-1"); len(ms) != 3 {
		t.Fatalf("removed before any commit: %v", ms)
	}
	if v, _, err := tab.Admit(ctx, cmd("dev-2", 1, 1)); err != nil || v != fence.Accepted {
		t.Fatal(v, err)
	}
	want := []fence.Mark{{Token: 1, Seq: 2}, {Token: 1, Seq: 3}}
	if ms := unappliedMarks(t, tab, "dev-1"); !sameMarks(ms, want) {
		t.Fatalf("after another admit's commit: %v, want %v", ms, want)
	}
	if err := tab.AwaitApplied(ctx, t1); err != nil {
		t.Fatal(err)
	}
	// Alone, AwaitApplied commits.
	t2, err := tab.MarkApplied("dev-1", fence.Mark{Token: 1, Seq: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := tab.AwaitApplied(ctx, t2); err != nil {
		t.Fatal(err)
	}
	if ms := unappliedMarks(t, tab, "dev-1"); !sameMarks(ms, want[1:]) {
		t.Fatalf("after AwaitApplied: %v", ms)
	}
	// Close commits what is queued.
	if _, err := tab.MarkApplied("dev-1", fence.Mark{Token: 1, Seq: 3}); err != nil {
		t.Fatal(err)
	}
	tab.Close()
	if _, err := tab.MarkApplied("dev-1", fence.Mark{Token: 1, Seq: 3}); !errors.Is(err, fence.ErrTableClosed) {
		t.Errorf("MarkApplied after Close: %v", err)
	}
	tab = openTable(t, path, nil)
	if ms := unappliedMarks(t, tab, "dev-1"); len(ms) != 0 {
		t.Fatalf("after Close and reopen: %v", ms)
	}
}
