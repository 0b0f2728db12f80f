package fence_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/bbolt"
	bberrors "go.etcd.io/bbolt/errors"

	"github.com/edgefence/edgefence/fence"
)

// testNow is the clock of the tables in these tests.
var testNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func openTable(t testing.TB, path string, opts *fence.TableOptions) *fence.Table {
	t.Helper()
	var o fence.TableOptions
	if opts != nil {
		o = *opts
	}
	if o.Now == nil {
		o.Now = func() time.Time { return testNow }
	}
	tab, err := fence.OpenTable(path, &o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tab.Close() })
	return tab
}

func tablePath(t testing.TB) string { return filepath.Join(t.TempDir(), fence.TableFile) }

func cmd(dev string, tok fence.Token, seq uint64) *fence.Envelope {
	return &fence.Envelope{V: fence.Version, Device: dev, Token: tok, Seq: seq,
		ID: fmt.Sprintf("c-%d-%d", tok, seq), Kind: "set", Holder: fmt.Sprintf("holder-%d", tok)}
}

func mustGet(t testing.TB, tab *fence.Table, dev string) (fence.Record, bool) {
	t.Helper()
	r, ok, err := tab.Get(dev)
	if err != nil {
		t.Fatalf("Get(%s): %v", dev, err)
	}
	return r, ok
}

// Each verdict, one step after the other on one device, and what each
// leaves in the table: only Accepted writes.
func TestTableVerdicts(t *testing.T) {
	tab := openTable(t, tablePath(t), nil)
	ctx := context.Background()
	badVersion := cmd("dev-1", 9, 9)
	badVersion.V = 2
	badDevice := cmd("dev/1", 9, 9)
	steps := []struct {
		name    string
		env     *fence.Envelope
		want    fence.Verdict
		mark    string // returned
		stored  string // stored afterwards, "" for none
		storeID string // command id stored afterwards
	}{
		{"fresh device accepts", cmd("dev-1", 7, 1), fence.Accepted, "7/1", "7/1", "c-7-1"},
		{"next seq", cmd("dev-1", 7, 2), fence.Accepted, "7/2", "7/2", "c-7-2"},
		{"redelivery is duplicate", cmd("dev-1", 7, 2), fence.Duplicate, "7/2", "7/2", "c-7-2"},
		{"older seq is duplicate", cmd("dev-1", 7, 1), fence.Duplicate, "7/2", "7/2", "c-7-2"},
		{"newer holder", cmd("dev-1", 9, 1), fence.Accepted, "9/1", "9/1", "c-9-1"},
		{"older holder is stale", cmd("dev-1", 7, 3), fence.Stale, "9/1", "9/1", "c-9-1"},
		{"token 0 is invalid", cmd("dev-1", 0, 5), fence.Invalid, "9/1", "9/1", "c-9-1"},
		{"seq 0 is invalid", cmd("dev-1", 10, 0), fence.Invalid, "9/1", "9/1", "c-9-1"},
		{"bad version is invalid", badVersion, fence.Invalid, "9/1", "9/1", "c-9-1"},
		{"nil envelope is invalid", nil, fence.Invalid, "0/0", "9/1", "c-9-1"},
		{"seq gap accepts", cmd("dev-1", 9, 5), fence.Accepted, "9/5", "9/5", "c-9-5"},
		{"bad device id is invalid", badDevice, fence.Invalid, "0/0", "9/5", "c-9-5"},
		{"other device unaffected", cmd("dev-2", 3, 1), fence.Accepted, "3/1", "9/5", "c-9-5"},
	}
	for _, s := range steps {
		v, m, err := tab.Admit(ctx, s.env)
		if v != s.want || m.String() != s.mark {
			t.Fatalf("%s: got %v %v (%v), want %v %s", s.name, v, m, err, s.want, s.mark)
		}
		if (v == fence.Invalid) != (err != nil) || err != nil && !errors.Is(err, fence.ErrInvalid) {
			t.Fatalf("%s: verdict %v with error %v", s.name, v, err)
		}
		r, ok := mustGet(t, tab, "dev-1")
		if !ok || r.Mark.String() != s.stored || r.ID != s.storeID {
			t.Fatalf("%s: stored %+v (found %v), want %s by %s", s.name, r, ok, s.stored, s.storeID)
		}
	}
	r, _ := mustGet(t, tab, "dev-1")
	want := fence.Record{Device: "dev-1", Mark: fence.Mark{Token: 9, Seq: 5}, At: testNow, Holder: "holder-9", ID: "c-9-5"}
	if !r.At.Equal(want.At) || r.Device != want.Device || r.Mark != want.Mark || r.Holder != want.Holder || r.ID != want.ID {
		t.Errorf("record %+v, want %+v", r, want)
	}
	if _, ok := mustGet(t, tab, "dev-never"); ok {
		t.Error("found a record for a device never commanded")
	}
}

// Figure 1 of the fencing-token argument, at the gateway's table, with a
// restart of the gateway in the middle: client 1 (token 33) pauses, its lease
// expires, client 2 (token 34) writes, client 1 wakes up and writes.
func TestTableFigure1(t *testing.T) {
	path := tablePath(t)
	ctx := context.Background()
	tab := openTable(t, path, nil)
	step := func(tab *fence.Table, who string, env *fence.Envelope, want fence.Verdict) {
		t.Helper()
		v, m, err := tab.Admit(ctx, env)
		if err != nil || v != want {
			t.Fatalf("%s %d/%d: %v %v %v, want %v", who, env.Token, env.Seq, v, m, err, want)
		}
	}
	step(tab, "client 1", cmd("storage", 33, 1), fence.Accepted)
	// client 1 pauses (GC); its lease expires; client 2 gets token 34.
	step(tab, "client 2", cmd("storage", 34, 1), fence.Accepted)
	// The gateway restarts before client 1 wakes.
	if err := tab.Close(); err != nil {
		t.Fatal(err)
	}
	tab = openTable(t, path, nil)
	step(tab, "client 1 wakes", cmd("storage", 33, 2), fence.Stale)
	step(tab, "client 2 redelivered", cmd("storage", 34, 1), fence.Duplicate)
	step(tab, "client 2", cmd("storage", 34, 2), fence.Accepted)
	step(tab, "client 1 again", cmd("storage", 33, 3), fence.Stale)
	if r, _ := mustGet(t, tab, "storage"); r.Mark != (fence.Mark{Token: 34, Seq: 2}) || r.Holder != "holder-34" {
		t.Fatalf("stored %+v", r)
	}
}

// Marks survive a restart, and the restarted table decides from them.
func TestTableRestartKeepsMarks(t *testing.T) {
	path := tablePath(t)
	ctx := context.Background()
	tab := openTable(t, path, nil)
	want := map[string]fence.Mark{}
	for i := range 20 {
		dev := fmt.Sprintf("dev-%02d", i)
		for seq := uint64(1); seq <= uint64(i%4+1); seq++ {
			if v, _, err := tab.Admit(ctx, cmd(dev, fence.Token(100+i), seq)); v != fence.Accepted || err != nil {
				t.Fatal(v, err)
			}
		}
		want[dev] = fence.Mark{Token: fence.Token(100 + i), Seq: uint64(i%4 + 1)}
	}
	if err := tab.Close(); err != nil {
		t.Fatal(err)
	}
	tab = openTable(t, path, nil)
	recs, err := tab.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != len(want) {
		t.Fatalf("%d records after restart, want %d", len(recs), len(want))
	}
	for i, r := range recs {
		if i > 0 && recs[i-1].Device >= r.Device {
			t.Errorf("List not ordered by device: %s before %s", recs[i-1].Device, r.Device)
		}
		if want[r.Device] != r.Mark {
			t.Errorf("%s: mark %v after restart, want %v", r.Device, r.Mark, want[r.Device])
		}
		m := want[r.Device]
		if v, _, _ := tab.Admit(ctx, cmd(r.Device, m.Token, m.Seq)); v != fence.Duplicate {
			t.Errorf("%s: last command again after restart: %v, want duplicate", r.Device, v)
		}
		if v, _, _ := tab.Admit(ctx, cmd(r.Device, m.Token-1, 99)); v != fence.Stale {
			t.Errorf("%s: older token after restart: %v, want stale", r.Device, v)
		}
		if v, _, _ := tab.Admit(ctx, cmd(r.Device, m.Token, m.Seq+1)); v != fence.Accepted {
			t.Errorf("%s: next command after restart: %v, want accepted", r.Device, v)
		}
	}
}

// outcome is one Admit call seen by a caller, with logical times taken just
// before the call and just after it returned.
type outcome struct {
	env        *fence.Envelope
	v          fence.Verdict
	m          fence.Mark
	start, end int64
}

// Many goroutines admit commands for many devices at once, including the
// same command from several goroutines, redeliveries and stale holders.
// Checked per device, against the order the calls were made and returned:
// a command is accepted at most once; an accepted command never follows
// (in real time) an accepted command with a higher mark (I1); each verdict
// agrees with the mark returned; and after a reopen every device's stored
// mark is the highest accepted one (every Accepted was persisted, nothing
// else was).
func TestTableConcurrentAdmits(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts fence.TableOptions
	}{
		{"groupcommit", fence.TableOptions{}},
		{"groupcommit-small-batches", fence.TableOptions{MaxGroup: 3}},
		{"no-groupcommit", fence.TableOptions{NoGroupCommit: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const (
				devices    = 48
				goroutines = 32
				perG       = 120
			)
			if testing.Short() && tc.name != "groupcommit" {
				t.Skip("one variant under -short")
			}
			path := tablePath(t)
			tab := openTable(t, path, &tc.opts)
			var clock atomic.Int64
			results := make([][]outcome, goroutines)
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(g), 99))
					for i := range perG {
						dev := fmt.Sprintf("dev-%02d", rng.IntN(devices))
						// Tokens rise slowly over the run, with holders
						// lagging behind; seqs collide often.
						tok := fence.Token(1 + i/20 + rng.IntN(3))
						env := cmd(dev, tok, uint64(1+rng.IntN(6)))
						o := outcome{env: env, start: clock.Add(1)}
						var err error
						o.v, o.m, err = tab.Admit(context.Background(), env)
						o.end = clock.Add(1)
						if err != nil {
							t.Errorf("%s %d/%d: %v", dev, env.Token, env.Seq, err)
							return
						}
						results[g] = append(results[g], o)
					}
				})
			}
			wg.Wait()

			byDev := map[string][]outcome{}
			counts := map[fence.Verdict]int{}
			for _, rs := range results {
				for _, o := range rs {
					byDev[o.env.Device] = append(byDev[o.env.Device], o)
					counts[o.v]++
				}
			}
			t.Logf("verdicts: %v", counts)
			if counts[fence.Accepted] < 100 || counts[fence.Stale] == 0 || counts[fence.Duplicate] == 0 {
				t.Fatalf("workload too tame: %v", counts)
			}
			highest := map[string]fence.Mark{}
			for dev, os := range byDev {
				var acc []outcome
				seen := map[fence.Mark]bool{}
				for _, o := range os {
					cm := fence.Mark{Token: o.env.Token, Seq: o.env.Seq}
					switch o.v {
					case fence.Accepted:
						if o.m != cm {
							t.Errorf("%s: accepted %v returned mark %v", dev, cm, o.m)
						}
						if seen[cm] {
							t.Errorf("%s: %v accepted twice", dev, cm)
						}
						seen[cm] = true
						acc = append(acc, o)
						if markLess(highest[dev], cm) {
							highest[dev] = cm
						}
					case fence.Duplicate:
						if o.m.Token != cm.Token || o.m.Seq < cm.Seq {
							t.Errorf("%s: %v duplicate against mark %v", dev, cm, o.m)
						}
					case fence.Stale:
						if o.m.Token <= cm.Token {
							t.Errorf("%s: %v stale against mark %v", dev, cm, o.m)
						}
					default:
						t.Errorf("%s: %v: verdict %v", dev, cm, o.v)
					}
				}
				// I1 in real time: if accepted a returned before accepted b
				// was called, a's mark is below b's.
				sort.Slice(acc, func(i, j int) bool { return acc[i].end < acc[j].end })
				for i, a := range acc {
					for _, b := range acc[i+1:] {
						am := fence.Mark{Token: a.env.Token, Seq: a.env.Seq}
						bm := fence.Mark{Token: b.env.Token, Seq: b.env.Seq}
						if a.end < b.start && !markLess(am, bm) {
							t.Errorf("%s: %v accepted after %v had been accepted", dev, bm, am)
						}
					}
				}
			}

			if err := tab.Close(); err != nil {
				t.Fatal(err)
			}
			tab = openTable(t, path, &fence.TableOptions{ReadOnly: true})
			recs, err := tab.List()
			if err != nil {
				t.Fatal(err)
			}
			if len(recs) != len(highest) {
				t.Errorf("%d devices stored, %d had a command accepted", len(recs), len(highest))
			}
			for _, r := range recs {
				if r.Mark != highest[r.Device] {
					t.Errorf("%s: stored %v, highest accepted %v", r.Device, r.Mark, highest[r.Device])
				}
			}
		})
	}
}

func markLess(a, b fence.Mark) bool {
	return a.Token < b.Token || a.Token == b.Token && a.Seq < b.Seq
}

// A second open of the same file (a second agent on the gateway) fails with
// ErrTableLocked after the timeout instead of hanging; so does a read-only
// open while the file is held, with the hint to ask the agent.
func TestTableLocked(t *testing.T) {
	path := tablePath(t)
	openTable(t, path, nil)
	for _, ro := range []bool{false, true} {
		start := time.Now()
		tab, err := fence.OpenTable(path, &fence.TableOptions{Timeout: 100 * time.Millisecond, ReadOnly: ro})
		if err == nil {
			tab.Close()
			t.Fatalf("read-only %v: second open succeeded", ro)
		}
		if !errors.Is(err, fence.ErrTableLocked) || !errors.Is(err, bberrors.ErrTimeout) {
			t.Fatalf("read-only %v: %v, want ErrTableLocked", ro, err)
		}
		if !strings.Contains(err.Error(), "another edgefence process") || !strings.Contains(err.Error(), path) {
			t.Errorf("read-only %v: error does not say what happened: %v", ro, err)
		}
		if ro && !strings.Contains(err.Error(), "ask the agent") {
			t.Errorf("read-only open: no hint to ask the agent: %v", err)
		}
		t.Logf("read-only %v: failed after %v: %v", ro, time.Since(start).Round(time.Millisecond), err)
	}
}

// rawPut writes value under key in the table's bucket, bypassing the table.
func rawPut(t *testing.T, path, key string, value []byte) {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(func(tx *bbolt.Tx) error {
		return tx.Bucket([]byte("fence.marks")).Put([]byte(key), value)
	}); err != nil {
		t.Fatal(err)
	}
}

func rawGet(t *testing.T, path, key string) []byte {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: time.Second, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var v []byte
	db.View(func(tx *bbolt.Tx) error {
		v = append([]byte(nil), tx.Bucket([]byte("fence.marks")).Get([]byte(key))...)
		return nil
	})
	return v
}

// A corrupt record is an error for its device, never a panic and never a
// decision; the other devices are served, and List reports it beside the
// readable records.
func TestTableCorruptRecord(t *testing.T) {
	ctx := context.Background()
	setup := func(t *testing.T) (string, []byte) {
		path := tablePath(t)
		tab := openTable(t, path, nil)
		for _, dev := range []string{"dev-a", "dev-b"} {
			if v, _, err := tab.Admit(ctx, cmd(dev, 5, 1)); v != fence.Accepted || err != nil {
				t.Fatal(v, err)
			}
		}
		tab.Close()
		return path, rawGet(t, path, "dev-a")
	}
	flip := func(i int, bit byte) func([]byte) []byte {
		return func(b []byte) []byte { b[i] ^= bit; return b }
	}
	for _, tc := range []struct {
		name string
		edit func([]byte) []byte
	}{
		{"empty", func([]byte) []byte { return []byte{} }},
		{"truncated", func(b []byte) []byte { return b[:len(b)-1] }},
		{"one byte", func([]byte) []byte { return []byte{1} }},
		{"token bit flipped", flip(8, 0x01)},
		{"token high bit flipped", flip(1, 0x80)},
		{"checksum bit flipped", func(b []byte) []byte { b[len(b)-1] ^= 4; return b }},
		{"version", flip(0, 0x02)},
		{"extra byte", func(b []byte) []byte { return append(b, 0) }},
		{"cbor instead", func([]byte) []byte { return []byte("\xa2\x01\x05\x02\x01") }},
		{"garbage", func([]byte) []byte { return []byte(strings.Repeat("\xff", 64)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, good := setup(t)
			rawPut(t, path, "dev-a", tc.edit(good))
			tab := openTable(t, path, nil)

			if _, _, err := tab.Get("dev-a"); !errors.Is(err, fence.ErrTableCorrupt) || !errors.Is(err, fence.ErrMarkRecordCorrupt) {
				t.Errorf("Get: %v, want ErrTableCorrupt and ErrMarkRecordCorrupt", err)
			}
			for _, env := range []*fence.Envelope{cmd("dev-a", 6, 1), cmd("dev-a", 5, 1), cmd("dev-a", 4, 1)} {
				v, m, err := tab.Admit(ctx, env)
				if v != 0 || m != (fence.Mark{}) || !errors.Is(err, fence.ErrTableCorrupt) || !errors.Is(err, fence.ErrMarkRecordCorrupt) {
					t.Errorf("Admit %d/%d: %v %v %v, want no verdict and ErrTableCorrupt, ErrMarkRecordCorrupt", env.Token, env.Seq, v, m, err)
				} else if !strings.Contains(err.Error(), "dev-a") {
					t.Errorf("Admit error does not name the device: %v", err)
				}
			}
			if v, _, err := tab.Admit(ctx, cmd("dev-b", 5, 2)); v != fence.Accepted || err != nil {
				t.Errorf("other device: %v %v", v, err)
			}
			recs, err := tab.List()
			if !errors.Is(err, fence.ErrTableCorrupt) || !strings.Contains(err.Error(), "dev-a") {
				t.Errorf("List error %v, want ErrTableCorrupt naming dev-a", err)
			}
			if len(recs) != 1 || recs[0].Device != "dev-b" || recs[0].Mark != (fence.Mark{Token: 5, Seq: 2}) {
				t.Errorf("List returned %+v, want dev-b at 5/2", recs)
			}
		})
	}
	t.Run("key not a device id", func(t *testing.T) {
		path, good := setup(t)
		rawPut(t, path, "not/a/device", good)
		tab := openTable(t, path, nil)
		recs, err := tab.List()
		if !errors.Is(err, fence.ErrTableCorrupt) || len(recs) != 2 {
			t.Errorf("List: %d records, %v", len(recs), err)
		}
	})
	t.Run("not a bbolt file", func(t *testing.T) {
		path := tablePath(t)
		if err := os.WriteFile(path, []byte(strings.Repeat("not a database. ", 1024)), 0o600); err != nil {
			t.Fatal(err)
		}
		for _, ro := range []bool{false, true} {
			tab, err := fence.OpenTable(path, &fence.TableOptions{ReadOnly: ro})
			if err == nil {
				tab.Close()
				t.Fatalf("read-only %v: opened garbage", ro)
			}
			if !errors.Is(err, fence.ErrTableCorrupt) {
				t.Errorf("read-only %v: %v, want ErrTableCorrupt", ro, err)
			}
		}
	})
}

// Admits in one group as a member whose record is corrupt: bbolt rolls the
// group back, and the table reruns every call alone (the good ones run
// twice). Every good admit must still get the verdict that was committed.
func TestTableGroupWithCorruptMember(t *testing.T) {
	path := tablePath(t)
	tab := openTable(t, path, nil)
	if v, _, err := tab.Admit(context.Background(), cmd("dev-bad", 1, 1)); v != fence.Accepted {
		t.Fatal(v, err)
	}
	tab.Close()
	rawPut(t, path, "dev-bad", []byte("corrupt"))
	// A cap that never splits a round: admits arriving during a commit
	// share the next group, so most rounds group the bad one with others.
	const n = 12
	tab = openTable(t, path, &fence.TableOptions{MaxGroup: 2 * n})
	for round := range 20 {
		var wg sync.WaitGroup
		verdicts := make([]fence.Verdict, 2*n)
		for i := range 2 * n {
			wg.Go(func() {
				dev := fmt.Sprintf("dev-%02d", i%n) // two admits per device per round
				if i == 0 {
					dev = "dev-bad"
				}
				v, _, err := tab.Admit(context.Background(), cmd(dev, 3, uint64(round+1)))
				if (dev == "dev-bad") != errors.Is(err, fence.ErrTableCorrupt) {
					t.Errorf("round %d %s: %v %v", round, dev, v, err)
				}
				verdicts[i] = v
			})
		}
		wg.Wait()
		for d := 1; d < n; d++ {
			a, b := verdicts[d], verdicts[d+n]
			if !(a == fence.Accepted && b == fence.Duplicate || a == fence.Duplicate && b == fence.Accepted) {
				t.Fatalf("round %d dev-%02d: verdicts %v and %v for the same command, want one accepted", round, d, a, b)
			}
		}
		if v := verdicts[n]; v != fence.Accepted { // dev-00's second admit; its first is dev-bad
			t.Fatalf("round %d dev-00: %v", round, v)
		}
	}
	for d := range n {
		if r, _ := mustGet(t, tab, fmt.Sprintf("dev-%02d", d)); r.Mark != (fence.Mark{Token: 3, Seq: 20}) {
			t.Errorf("dev-%02d: stored %v", d, r.Mark)
		}
	}
}

// A read-only open reads a table no agent holds, and refuses to admit.
func TestTableReadOnly(t *testing.T) {
	path := tablePath(t)
	ctx := context.Background()
	if _, err := fence.OpenTable(path, &fence.TableOptions{ReadOnly: true}); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("read-only open of a missing file: %v, want not exist", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("read-only open created the file")
	}
	tab := openTable(t, path, nil)
	tab.Admit(ctx, cmd("dev-1", 4, 2))
	tab.Close()

	ro := openTable(t, path, &fence.TableOptions{ReadOnly: true})
	if r, ok := mustGet(t, ro, "dev-1"); !ok || r.Mark != (fence.Mark{Token: 4, Seq: 2}) {
		t.Errorf("Get: %+v %v", r, ok)
	}
	if recs, err := ro.List(); err != nil || len(recs) != 1 {
		t.Errorf("List: %+v %v", recs, err)
	}
	if v, _, err := ro.Admit(ctx, cmd("dev-1", 5, 1)); v != 0 || !errors.Is(err, fence.ErrTableReadOnly) {
		t.Errorf("Admit on read-only: %v %v", v, err)
	}
	// Several readers at once: shared locks.
	ro2 := openTable(t, path, &fence.TableOptions{ReadOnly: true})
	if _, ok := mustGet(t, ro2, "dev-1"); !ok {
		t.Error("second reader sees nothing")
	}

	// A bbolt file without the bucket (never opened by a table) reads empty.
	empty := tablePath(t)
	db, err := bbolt.Open(empty, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	ro3 := openTable(t, empty, &fence.TableOptions{ReadOnly: true})
	if recs, err := ro3.List(); err != nil || len(recs) != 0 {
		t.Errorf("List of an empty file: %+v %v", recs, err)
	}
}

func TestTableClosed(t *testing.T) {
	tab := openTable(t, tablePath(t), nil)
	if err := tab.Close(); err != nil {
		t.Fatal(err)
	}
	if err := tab.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if v, _, err := tab.Admit(context.Background(), cmd("dev-1", 1, 1)); v != 0 || !errors.Is(err, fence.ErrTableClosed) {
		t.Errorf("Admit after Close: %v %v", v, err)
	}
	if _, _, err := tab.Get("dev-1"); !errors.Is(err, fence.ErrTableClosed) {
		t.Errorf("Get after Close: %v", err)
	}
	if _, err := tab.List(); !errors.Is(err, fence.ErrTableClosed) {
		t.Errorf("List after Close: %v", err)
	}
}

// Close waits for admits in progress: each admit either completed (and is
// stored) or failed with ErrTableClosed.
func TestTableCloseDuringAdmits(t *testing.T) {
	path := tablePath(t)
	tab := openTable(t, path, nil)
	var wg sync.WaitGroup
	var accepted sync.Map
	var n atomic.Int64
	some := make(chan struct{})
	for g := range 16 {
		wg.Go(func() {
			dev := fmt.Sprintf("dev-%02d", g)
			for seq := uint64(1); ; seq++ {
				v, _, err := tab.Admit(context.Background(), cmd(dev, 1, seq))
				if errors.Is(err, fence.ErrTableClosed) {
					return
				}
				if v != fence.Accepted || err != nil {
					t.Errorf("%s: %v %v", dev, v, err)
					return
				}
				accepted.Store(dev, seq)
				if n.Add(1) == 100 {
					close(some)
				}
			}
		})
	}
	<-some // let some admits through, then close in the middle of others
	if err := tab.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	tab = openTable(t, path, nil)
	accepted.Range(func(k, v any) bool {
		if r, _ := mustGet(t, tab, k.(string)); r.Mark.Seq < v.(uint64) {
			t.Errorf("%s: acked seq %d, stored %v", k, v, r.Mark)
		}
		return true
	})
}

// A done context stops Admit before it decides; nothing is written.
func TestTableAdmitContextDone(t *testing.T) {
	tab := openTable(t, tablePath(t), nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if v, _, err := tab.Admit(ctx, cmd("dev-1", 1, 1)); v != 0 || !errors.Is(err, context.Canceled) {
		t.Fatalf("%v %v", v, err)
	}
	if _, ok := mustGet(t, tab, "dev-1"); ok {
		t.Fatal("a cancelled admit wrote")
	}
}

func TestTableGetInvalidDevice(t *testing.T) {
	tab := openTable(t, tablePath(t), nil)
	if _, _, err := tab.Get("../etc"); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("Get(../etc): %v", err)
	}
}

// A table file written before MarkRecord existed (testdata/README.md)
// opens, lists its marks and unapplied commands, and goes on deciding from
// them.
func TestTableLoadsFixtureV1(t *testing.T) {
	old, err := os.ReadFile("testdata/table-v1.db")
	if err != nil {
		t.Fatal(err)
	}
	path := tablePath(t)
	if err := os.WriteFile(path, old, 0o600); err != nil {
		t.Fatal(err)
	}
	tab := openTable(t, path, nil)
	recs, err := tab.List()
	if err != nil {
		t.Fatal(err)
	}
	at := time.UnixMilli(1767225600123)
	want := []fence.Record{
		{Device: "plc-1", Mark: fence.Mark{Token: 5, Seq: 2}, At: at, Holder: "gw-a", ID: "a2"},
		{Device: "plc-2", Mark: fence.Mark{Token: 9, Seq: 4}, At: at, Holder: "gw-b", ID: "b4"},
	}
	if len(recs) != len(want) {
		t.Fatalf("List: %+v, want %+v", recs, want)
	}
	for i, r := range recs {
		if w := want[i]; r.Device != w.Device || r.Mark != w.Mark || !r.At.Equal(w.At) || r.Holder != w.Holder || r.ID != w.ID {
			t.Errorf("record %d: %+v, want %+v", i, r, w)
		}
	}
	if got := fmt.Sprint(unappliedMarks(t, tab, "plc-1"), unappliedMarks(t, tab, "plc-2")); got != "[5/1 5/2] [9/4]" {
		t.Errorf("unapplied %s", got)
	}
	ctx := context.Background()
	for _, c := range []struct {
		env  *fence.Envelope
		want fence.Verdict
	}{{cmd("plc-1", 5, 2), fence.Duplicate}, {cmd("plc-1", 4, 9), fence.Stale}, {cmd("plc-1", 5, 3), fence.Accepted}, {cmd("plc-2", 10, 1), fence.Accepted}} {
		if v, _, err := tab.Admit(ctx, c.env); v != c.want || err != nil {
			t.Errorf("Admit %s %d/%d: %v %v, want %v", c.env.Device, c.env.Token, c.env.Seq, v, err, c.want)
		}
	}
}
