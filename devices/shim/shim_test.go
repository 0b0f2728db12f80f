package shim_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"go.etcd.io/bbolt"
	"go.uber.org/goleak"

	"github.com/edgefence/edgefence/devices/shim"
	"github.com/edgefence/edgefence/fence"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(helperMain())
	}
	if os.Getenv(historyHelperEnv) != "" {
		os.Exit(historyHelperMain())
	}
	if p := os.Getenv(epochKillEnv); p != "" {
		os.Exit(epochKillMain(p))
	}
	goleak.VerifyTestMain(m)
}

// envelope encodes a valid command for dev.
func envelope(tb testing.TB, dev string, token fence.Token, seq uint64, kind string) []byte {
	tb.Helper()
	return epochEnvelope(tb, dev, 0, token, seq, kind)
}

// epochEnvelope encodes a valid command for dev issued in epoch e.
func epochEnvelope(tb testing.TB, dev string, e uint64, token fence.Token, seq uint64, kind string) []byte {
	tb.Helper()
	b, err := fence.MarshalEnvelope(&fence.Envelope{V: fence.Version, Device: dev, Token: token, Seq: seq,
		ID: fmt.Sprintf("c-%d-%d", token, seq), Kind: kind, Holder: fmt.Sprintf("gw-%d", token), Epoch: e})
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// recorder is a Device that records what it applied, in memory.
type recorder struct {
	mu      sync.Mutex
	applied []fence.Mark
}

func (r *recorder) Check(env *fence.Envelope) error {
	switch env.Kind {
	case "ok", "fail":
		return nil
	case "panic":
		panic("check exploded")
	}
	return fmt.Errorf("unknown kind %q", env.Kind)
}

func (r *recorder) Apply(env *fence.Envelope) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if env.Kind == "fail" {
		return errors.New("actuator jammed")
	}
	r.applied = append(r.applied, fence.Mark{Token: env.Token, Seq: env.Seq})
	return nil
}

func (r *recorder) marks() []fence.Mark {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]fence.Mark(nil), r.applied...)
}

// counter is a TxApplier: per device, how many commands took effect and the
// last one, in the shim's own database.
type counter struct{}

var counterBucket = []byte("test.counter")

func (counter) Check(env *fence.Envelope) error { return (&recorder{}).Check(env) }
func (counter) Apply(*fence.Envelope) error     { panic("Apply called on a TxApplier") }

func (counter) ApplyTx(tx *bbolt.Tx, env *fence.Envelope) error {
	if env.Kind == "fail" {
		return errors.New("actuator jammed")
	}
	b, err := tx.CreateBucketIfNotExists(counterBucket)
	if err != nil {
		return err
	}
	st := readCounter(b, env.Device)
	st.n++
	st.last = fence.Mark{Token: env.Token, Seq: env.Seq}
	v := binary.BigEndian.AppendUint64(nil, st.n)
	v = binary.BigEndian.AppendUint64(v, uint64(st.last.Token))
	v = binary.BigEndian.AppendUint64(v, st.last.Seq)
	return b.Put([]byte(env.Device), v)
}

type counterState struct {
	n    uint64
	last fence.Mark
}

func readCounter(b *bbolt.Bucket, dev string) counterState {
	if b == nil {
		return counterState{}
	}
	v := b.Get([]byte(dev))
	if len(v) != 24 {
		return counterState{}
	}
	return counterState{n: binary.BigEndian.Uint64(v),
		last: fence.Mark{Token: fence.Token(binary.BigEndian.Uint64(v[8:])), Seq: binary.BigEndian.Uint64(v[16:])}}
}

func counterOf(tb testing.TB, s *shim.Shim, dev string) counterState {
	tb.Helper()
	var st counterState
	if err := s.View(func(tx *bbolt.Tx) error {
		st = readCounter(tx.Bucket(counterBucket), dev)
		return nil
	}); err != nil {
		tb.Fatal(err)
	}
	return st
}

func open(tb testing.TB, path string, opts *shim.Options) *shim.Shim {
	tb.Helper()
	s, err := shim.Open(path, opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}

func mark(tb testing.TB, s *shim.Shim, dev string) fence.Mark {
	tb.Helper()
	m, err := s.Mark(dev)
	if err != nil {
		tb.Fatal(err)
	}
	return m
}

func TestVerdicts(t *testing.T) {
	const dev = "dev-1"
	valid := envelope(t, dev, 10, 2, "ok")
	otherDev := envelope(t, "dev-2", 10, 3, "ok")
	tests := []struct {
		name       string
		addressed  string
		raw        []byte
		txDevice   bool
		want       fence.Verdict
		wantMark   fence.Mark // after
		wantReason string     // substring
		wantID     string
	}{
		{"accepted new token", dev, envelope(t, dev, 11, 1, "ok"), false, fence.Accepted, fence.Mark{Token: 11, Seq: 1}, "", "c-11-1"},
		{"accepted next seq", dev, envelope(t, dev, 10, 3, "ok"), false, fence.Accepted, fence.Mark{Token: 10, Seq: 3}, "", "c-10-3"},
		{"accepted seq gap", dev, envelope(t, dev, 10, 9, "ok"), false, fence.Accepted, fence.Mark{Token: 10, Seq: 9}, "", "c-10-9"},
		{"accepted tx", dev, envelope(t, dev, 10, 3, "ok"), true, fence.Accepted, fence.Mark{Token: 10, Seq: 3}, "", "c-10-3"},
		{"duplicate same seq", dev, valid, false, fence.Duplicate, fence.Mark{Token: 10, Seq: 2}, "already applied", "c-10-2"},
		{"duplicate lower seq", dev, envelope(t, dev, 10, 1, "ok"), false, fence.Duplicate, fence.Mark{Token: 10, Seq: 2}, "already applied", "c-10-1"},
		{"stale", dev, envelope(t, dev, 9, 7, "ok"), false, fence.Stale, fence.Mark{Token: 10, Seq: 2}, "below the high-water mark 10/2", "c-9-7"},
		{"invalid garbage", dev, []byte("not cbor at all"), false, fence.Invalid, fence.Mark{Token: 10, Seq: 2}, "invalid envelope", ""},
		{"invalid empty", dev, nil, false, fence.Invalid, fence.Mark{Token: 10, Seq: 2}, "invalid envelope", ""},
		{"invalid truncated", dev, valid[:len(valid)-3], false, fence.Invalid, fence.Mark{Token: 10, Seq: 2}, "invalid envelope", ""},
		{"invalid other device", dev, otherDev, false, fence.Invalid, fence.Mark{Token: 10, Seq: 2}, `names device "dev-2"`, "c-10-3"},
		{"invalid kind", dev, envelope(t, dev, 11, 1, "reboot"), false, fence.Invalid, fence.Mark{Token: 10, Seq: 2}, "unknown kind", "c-11-1"},
		{"invalid check panics", dev, envelope(t, dev, 11, 1, "panic"), false, fence.Invalid, fence.Mark{Token: 10, Seq: 2}, "check panicked", "c-11-1"},
		{"invalid tx effect rolls back", dev, envelope(t, dev, 11, 1, "fail"), true, fence.Invalid, fence.Mark{Token: 10, Seq: 2}, "actuator jammed", "c-11-1"},
		{"invalid effect after commit", dev, envelope(t, dev, 11, 1, "fail"), false, fence.Invalid, fence.Mark{Token: 11, Seq: 1}, "command is consumed", "c-11-1"},
		{"invalid addressed device", "bad/topic", valid, false, fence.Invalid, fence.Mark{Token: 10, Seq: 2}, "addressed device", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := open(t, filepath.Join(t.TempDir(), "fence.db"), nil)
			var d shim.Device = &recorder{}
			if tt.txDevice {
				d = counter{}
			}
			if ack := s.Handle(dev, valid, d); ack.Verdict != fence.Accepted {
				t.Fatalf("setup: %+v", ack)
			}
			before := s.Stats()
			ack := s.Handle(tt.addressed, tt.raw, d)
			if ack.Verdict != tt.want {
				t.Fatalf("verdict %v, want %v (ack %+v)", ack.Verdict, tt.want, ack)
			}
			if _, err := fence.MarshalAck(&ack); err != nil {
				t.Fatalf("ack does not marshal: %v (%+v)", err, ack)
			}
			if !strings.Contains(ack.Reason, tt.wantReason) {
				t.Errorf("reason %q, want it to contain %q", ack.Reason, tt.wantReason)
			}
			if ack.ID != tt.wantID {
				t.Errorf("ack id %q, want %q", ack.ID, tt.wantID)
			}
			wantDev := dev
			if tt.addressed != dev {
				wantDev = ""
			}
			if ack.Device != wantDev {
				t.Errorf("ack device %q, want %q", ack.Device, wantDev)
			}
			if got := mark(t, s, dev); got != tt.wantMark {
				t.Errorf("mark %v, want %v", got, tt.wantMark)
			}
			if tt.addressed == dev && ack.Mark() != tt.wantMark {
				t.Errorf("ack mark %v, want %v", ack.Mark(), tt.wantMark)
			}
			after := s.Stats()
			var delta uint64
			switch tt.want {
			case fence.Accepted:
				delta = after.Accepted - before.Accepted
			case fence.Duplicate:
				delta = after.Duplicate - before.Duplicate
			case fence.Stale:
				delta = after.Stale - before.Stale
			case fence.Invalid:
				delta = after.Invalid - before.Invalid
			}
			if delta != 1 {
				t.Errorf("stats %+v → %+v: %v counted %d times", before, after, tt.want, delta)
			}
			if tt.txDevice {
				st := counterOf(t, s, dev)
				if st.last != tt.wantMark || (tt.want == fence.Accepted) != (st.n == 2) {
					t.Errorf("tx state %+v after %v, mark %v", st, tt.want, tt.wantMark)
				}
			}
		})
	}
}

func TestNilDeviceIsInvalid(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "fence.db"), nil)
	if ack := s.Handle("dev-1", envelope(t, "dev-1", 1, 1, "ok"), nil); ack.Verdict != fence.Invalid {
		t.Fatalf("%+v", ack)
	}
	if m := mark(t, s, "dev-1"); m != (fence.Mark{}) {
		t.Fatalf("mark moved to %v", m)
	}
}

// TestFrozenHolderTimeline is the failure from the fencing-token argument:
// holder A is paused past its lease, B takes over, A wakes up and writes.
func TestFrozenHolderTimeline(t *testing.T) {
	const dev = "boiler-7"
	s := open(t, filepath.Join(t.TempDir(), "fence.db"), nil)
	rec := &recorder{}
	steps := []struct {
		who   string
		token fence.Token
		seq   uint64
		want  fence.Verdict
		mark  fence.Mark
	}{
		{"A acquires (token 33) and writes", 33, 1, fence.Accepted, fence.Mark{Token: 33, Seq: 1}},
		{"A writes again", 33, 2, fence.Accepted, fence.Mark{Token: 33, Seq: 2}},
		// A freezes (GC pause, SIGSTOP); its lease expires; B is granted token 34.
		{"B writes", 34, 1, fence.Accepted, fence.Mark{Token: 34, Seq: 1}},
		{"A wakes and writes with stale confidence", 33, 3, fence.Stale, fence.Mark{Token: 34, Seq: 1}},
		{"B writes again", 34, 2, fence.Accepted, fence.Mark{Token: 34, Seq: 2}},
		{"A retries", 33, 3, fence.Stale, fence.Mark{Token: 34, Seq: 2}},
		{"broker redelivers B's last write", 34, 2, fence.Duplicate, fence.Mark{Token: 34, Seq: 2}},
		{"C takes over (token 40)", 40, 1, fence.Accepted, fence.Mark{Token: 40, Seq: 1}},
		{"B, now paused too, wakes", 34, 3, fence.Stale, fence.Mark{Token: 40, Seq: 1}},
	}
	for _, st := range steps {
		ack := s.Handle(dev, envelope(t, dev, st.token, st.seq, "ok"), rec)
		if ack.Verdict != st.want || ack.Mark() != st.mark {
			t.Fatalf("%s: %v mark %v, want %v mark %v (%s)", st.who, ack.Verdict, ack.Mark(), st.want, st.mark, ack.Reason)
		}
	}
	want := []fence.Mark{{Token: 33, Seq: 1}, {Token: 33, Seq: 2}, {Token: 34, Seq: 1}, {Token: 34, Seq: 2}, {Token: 40, Seq: 1}}
	if got := rec.marks(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("applied %v, want %v", got, want)
	}
	r, err := s.Record(dev)
	if err != nil || r.Holder != "gw-40" || r.ID != "c-40-1" || r.At.IsZero() {
		t.Fatalf("record %+v, %v", r, err)
	}
}

func TestRestartKeepsMark(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fence.db")
	s, err := shim.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		token fence.Token
		seq   uint64
	}{{5, 1}, {5, 2}, {8, 1}, {8, 4}} {
		if ack := s.Handle("dev-1", envelope(t, "dev-1", c.token, c.seq, "ok"), counter{}); ack.Verdict != fence.Accepted {
			t.Fatalf("%+v", ack)
		}
	}
	if ack := s.Handle("dev-2", envelope(t, "dev-2", 3, 1, "ok"), counter{}); ack.Verdict != fence.Accepted {
		t.Fatalf("%+v", ack)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if ack := s.Handle("dev-1", envelope(t, "dev-1", 9, 1, "ok"), counter{}); ack.Verdict != fence.Invalid || !strings.Contains(ack.Reason, "closed") {
		t.Fatalf("after Close: %+v", ack)
	}

	s = open(t, path, nil)
	if m := mark(t, s, "dev-1"); m != (fence.Mark{Token: 8, Seq: 4}) {
		t.Fatalf("dev-1 mark after restart %v", m)
	}
	if m := mark(t, s, "dev-2"); m != (fence.Mark{Token: 3, Seq: 1}) {
		t.Fatalf("dev-2 mark after restart %v", m)
	}
	for _, c := range []struct {
		token fence.Token
		seq   uint64
		want  fence.Verdict
	}{{5, 3, fence.Stale}, {7, 100, fence.Stale}, {8, 4, fence.Duplicate}, {8, 2, fence.Duplicate}, {8, 5, fence.Accepted}} {
		if ack := s.Handle("dev-1", envelope(t, "dev-1", c.token, c.seq, "ok"), counter{}); ack.Verdict != c.want {
			t.Fatalf("%d/%d after restart: %+v, want %v", c.token, c.seq, ack, c.want)
		}
	}
	if st := counterOf(t, s, "dev-1"); st.n != 5 || st.last != (fence.Mark{Token: 8, Seq: 5}) {
		t.Fatalf("state %+v", st)
	}
}

func TestOpenLocked(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fence.db")
	open(t, path, nil)
	_, err := shim.Open(path, &shim.Options{LockTimeout: 50e6})
	if !errors.Is(err, shim.ErrLocked) {
		t.Fatalf("second Open: %v, want ErrLocked", err)
	}
}

func TestOpenMissingDir(t *testing.T) {
	_, err := shim.Open(filepath.Join(t.TempDir(), "no", "such", "fence.db"), nil)
	if err == nil || errors.Is(err, shim.ErrLocked) {
		t.Fatalf("Open in a missing directory: %v", err)
	}
}

func TestPersistOnTokenChangeOnly(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "fence.db")
	s := open(t, path, &shim.Options{PersistOnTokenChangeOnly: true})
	rec := &recorder{}
	for seq := uint64(1); seq <= 5; seq++ {
		if ack := s.Handle("dev-1", envelope(t, "dev-1", 20, seq, "ok"), rec); ack.Verdict != fence.Accepted {
			t.Fatalf("%+v", ack)
		}
	}
	if st := s.Stats(); st.Deferred != 4 || st.Accepted != 5 {
		t.Fatalf("stats %+v: want the token change written and 4 seq advances deferred", st)
	}
	if m := mark(t, s, "dev-1"); m != (fence.Mark{Token: 20, Seq: 5}) {
		t.Fatalf("live mark %v", m)
	}
	if ack := s.Handle("dev-1", envelope(t, "dev-1", 20, 5, "ok"), rec); ack.Verdict != fence.Duplicate {
		t.Fatalf("duplicate while running: %+v", ack)
	}

	// What a crash now would leave on disk: the token, with its first seq.
	crashed := snapshot(t, path, filepath.Join(dir, "crashed.db"))
	c := open(t, crashed, &shim.Options{PersistOnTokenChangeOnly: true})
	if m := mark(t, c, "dev-1"); m != (fence.Mark{Token: 20, Seq: 1}) {
		t.Fatalf("durable mark %v, want 20/1", m)
	}
	if ack := c.Handle("dev-1", envelope(t, "dev-1", 19, 9, "ok"), rec); ack.Verdict != fence.Stale {
		t.Fatalf("stale token after crash: %+v", ack)
	}
	// The documented trade-off: a same-token duplicate is re-applied.
	if ack := c.Handle("dev-1", envelope(t, "dev-1", 20, 3, "ok"), rec); ack.Verdict != fence.Accepted {
		t.Fatalf("same-token duplicate after crash: %+v (the option's trade-off)", ack)
	}

	// A token change is written at once, together with nothing else pending.
	if ack := s.Handle("dev-1", envelope(t, "dev-1", 21, 1, "ok"), rec); ack.Verdict != fence.Accepted {
		t.Fatal(ack)
	}
	if m := mark(t, c, "dev-1"); m.Token != 20 {
		t.Fatal("snapshot changed")
	}
	if m := durableMark(t, path, dir, "dev-1"); m != (fence.Mark{Token: 21, Seq: 1}) {
		t.Fatalf("durable after token change %v", m)
	}
	if ack := s.Handle("dev-1", envelope(t, "dev-1", 21, 2, "ok"), rec); ack.Verdict != fence.Accepted {
		t.Fatal(ack)
	}
	// A clean Close writes the in-memory seqs.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, path, nil)
	if m := mark(t, s, "dev-1"); m != (fence.Mark{Token: 21, Seq: 2}) {
		t.Fatalf("mark after clean restart %v", m)
	}
}

// snapshot copies the database file as a crash would leave it: everything
// committed, nothing in memory.
func snapshot(t *testing.T, from, to string) string {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return to
}

func durableMark(t *testing.T, path, dir, dev string) fence.Mark {
	t.Helper()
	snap := snapshot(t, path, filepath.Join(dir, "snap.db"))
	s, err := shim.Open(snap, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(snap)
	defer s.Close()
	return mark(t, s, dev)
}

// TestFrozenHolderSchedule: a holder's late command and a redelivery of
// the new holder's are refused and never applied (the same schedule on the
// unfenced simulator kind, devices/sim, applies both).
func TestFrozenHolderSchedule(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "fence.db"), nil)
	var vs []fence.Verdict
	for _, c := range []struct {
		token fence.Token
		seq   uint64
	}{{10, 1}, {11, 1}, {10, 2}, {11, 1}} {
		vs = append(vs, s.Handle("dev-1", envelope(t, "dev-1", c.token, c.seq, "ok"), counter{}).Verdict)
	}
	if st := counterOf(t, s, "dev-1"); fmt.Sprint(vs) != "[accepted accepted stale duplicate]" || st.n != 2 || st.last != (fence.Mark{Token: 11, Seq: 1}) {
		t.Fatalf("verdicts %v state %+v", vs, st)
	}
}

func TestConcurrentHandle(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "fence.db"), nil)
	const workers, per = 4, 25
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				// Every worker sends the same schedule: each (token, seq)
				// must take effect once, whoever wins.
				tok := fence.Token(1 + i/5)
				s.Handle("dev-1", envelope(t, "dev-1", tok, uint64(i%5+1), "ok"), counter{})
				s.Handle(fmt.Sprintf("dev-w%d", w), envelope(t, fmt.Sprintf("dev-w%d", w), tok, uint64(i%5+1), "ok"), counter{})
			}
		}()
	}
	wg.Wait()
	st := counterOf(t, s, "dev-1")
	if m := mark(t, s, "dev-1"); m != st.last || st.n > per || st.last != (fence.Mark{Token: 5, Seq: 5}) {
		t.Fatalf("mark %v state %+v", m, st)
	}
	for w := range workers {
		if st := counterOf(t, s, fmt.Sprintf("dev-w%d", w)); st.n != per {
			t.Fatalf("worker %d device applied %d, want %d", w, st.n, per)
		}
	}
}
