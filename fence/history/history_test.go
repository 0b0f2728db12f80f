package history_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgefence/edgefence/fence/history"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// ev builds an event at t0 plus i milliseconds.
func ev(i int, src, op, dev, id string, tok, seq uint64, verdict string) history.Event {
	return history.Event{Time: t0.Add(time.Duration(i) * time.Millisecond), Source: src, Op: op,
		Device: dev, ID: id, Token: tok, Seq: seq, Verdict: verdict}
}

// clean is a history of two holders of dev-1 (a frozen one coming back
// stale), with the outbox's created/terminal events and a redelivery.
func clean() []history.Event {
	return []history.Event{
		ev(1, "outbox:gw1", history.OpCreated, "dev-1", "a1", 10, 1, ""),
		ev(2, "shim", history.OpVerdict, "dev-1", "a1", 10, 1, "accepted"),
		ev(3, "outbox:gw1", history.OpTerminal, "dev-1", "a1", 10, 1, "accepted"),
		ev(4, "outbox:gw1", history.OpCreated, "dev-1", "a2", 10, 2, ""),
		ev(5, "shim", history.OpVerdict, "dev-1", "a2", 10, 2, "accepted"),
		ev(6, "shim", history.OpVerdict, "dev-1", "a2", 10, 2, "duplicate"), // broker redelivery
		ev(7, "outbox:gw1", history.OpTerminal, "dev-1", "a2", 10, 2, "duplicate"),
		ev(8, "outbox:gw2", history.OpCreated, "dev-1", "b1", 12, 1, ""),
		ev(9, "shim", history.OpVerdict, "dev-1", "b1", 12, 1, "accepted"),
		ev(10, "outbox:gw2", history.OpTerminal, "dev-1", "b1", 12, 1, "accepted"),
		ev(11, "outbox:gw1", history.OpCreated, "dev-1", "a3", 10, 3, ""),
		ev(12, "shim", history.OpVerdict, "dev-1", "a3", 10, 3, "stale"),
		ev(13, "outbox:gw1", history.OpTerminal, "dev-1", "a3", 10, 3, "stale"),
		ev(14, "outbox:gw1", history.OpCreated, "dev-2", "c1", 11, 1, ""),
		ev(15, "outbox:gw1", history.OpTerminal, "dev-2", "c1", 11, 1, "expired"),
	}
}

func TestCheckClean(t *testing.T) {
	r := history.Check(clean())
	if !r.OK() {
		t.Fatalf("clean history:\n%s", r)
	}
	if r.Devices != 2 || r.Created != 5 || r.Terminal["accepted"] != 2 || r.FenceVerdicts["accepted"] != 3 ||
		r.FenceVerdicts["stale"] != 1 || r.Events != 15 {
		t.Fatalf("counts:\n%s", r)
	}
	if s := r.String(); !strings.Contains(s, "OK: no violations") || !strings.Contains(s, "accepted=3") {
		t.Fatalf("String:\n%s", s)
	}
}

// want asserts that r has exactly one violation, of inv, about id, whose
// detail contains detail.
func want(t *testing.T, r history.Report, inv, id, detail string) {
	t.Helper()
	if len(r.Violations) != 1 {
		t.Fatalf("want one %s violation about %s (%q), got:\n%s", inv, id, detail, r)
	}
	v := r.Violations[0]
	if v.Invariant != inv || v.ID != id || !strings.Contains(v.Detail, detail) {
		t.Fatalf("want %s %s %q, got %v", inv, id, detail, v)
	}
	if r.OK() || !strings.Contains(r.String(), v.Detail) {
		t.Fatalf("report:\n%s", r)
	}
}

func TestCheckViolations(t *testing.T) {
	for _, tc := range []struct {
		name        string
		edit        func([]history.Event) []history.Event
		opts        history.CheckOptions
		inv, id, in string
	}{
		{"stale accept", func(h []history.Event) []history.Event {
			h[11].Verdict = "accepted" // a3, token 10 after 12
			h[12].Verdict = "accepted"
			return h
		}, history.CheckOptions{}, "I1", "a3", "stale accept"},
		{"seq not increasing", func(h []history.Event) []history.Event {
			return append(h, ev(16, "shim", history.OpVerdict, "dev-1", "b0", 12, 1, "accepted"))
		}, history.CheckOptions{}, "I1", "b0", "seq not increasing"},
		{"applied twice", func(h []history.Event) []history.Event {
			h[5].Verdict = "accepted" // the redelivery of a2 applied again
			return h
		}, history.CheckOptions{}, "I1", "a2", "applied twice"},
		{"lost", func(h []history.Event) []history.Event {
			return append(h[:14], h[15:]...) // c1's terminal
		}, history.CheckOptions{}, "I4", "c1", "lost"},
		{"terminal twice", func(h []history.Event) []history.Event {
			return append(h, ev(16, "outbox:gw1", history.OpTerminal, "dev-2", "c1", 11, 1, "expired"))
		}, history.CheckOptions{}, "I4", "c1", "terminal twice"},
		{"terminal without created", func(h []history.Event) []history.Event {
			return append(h, ev(16, "outbox:gw1", history.OpTerminal, "dev-2", "zz", 11, 2, "expired"))
		}, history.CheckOptions{}, "I4", "zz", "without a created"},
		{"created twice", func(h []history.Event) []history.Event {
			return append(h, ev(16, "outbox:gw1", history.OpCreated, "dev-2", "c1", 11, 1, ""))
		}, history.CheckOptions{}, "I4", "c1", "created 2 times"},
		{"acked accepted, never accepted", func(h []history.Event) []history.Event {
			h[12].Verdict = "accepted" // a3's terminal says accepted, the shim said stale
			return h
		}, history.CheckOptions{}, "I4", "a3", "never accepted"},
		{"acked duplicate, never accepted", func(h []history.Event) []history.Event {
			h[12].Verdict = "duplicate"
			return h
		}, history.CheckOptions{}, "I4", "a3", "never accepted"},
		{"accepted but never applied", func(h []history.Event) []history.Event {
			return append(h,
				ev(16, "bridge", history.OpApplied, "dev-1", "a1", 10, 1, ""),
				ev(17, "bridge", history.OpApplied, "dev-1", "a2", 10, 2, ""))
		}, history.CheckOptions{RequireApplied: true}, "I4", "b1", "never applied"},
		{"device applied twice", func(h []history.Event) []history.Event {
			return append(h,
				ev(16, "bridge", history.OpApplied, "dev-1", "a1", 10, 1, ""),
				ev(17, "bridge", history.OpApplied, "dev-1", "a1", 10, 1, ""))
		}, history.CheckOptions{}, "I1", "a1", "applied twice"},
		{"stale accept across fence points", func(h []history.Event) []history.Event {
			// A second fence point (say a restarted shim under another
			// name) accepts token 11 after the first accepted 12.
			return append(h, ev(20, "shim-b", history.OpVerdict, "dev-1", "d1", 11, 1, "accepted"))
		}, history.CheckOptions{}, "I1", "d1", "across fence points"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want(t, history.CheckWith(tc.edit(clean()), tc.opts), tc.inv, tc.id, tc.in)
		})
	}
}

func TestRequireAppliedPending(t *testing.T) {
	h := append(clean(),
		ev(16, "bridge", history.OpApplied, "dev-1", "a1", 10, 1, ""),
		ev(17, "bridge", history.OpApplied, "dev-1", "a2", 10, 2, ""),
		ev(18, "bridge", history.OpApplied, "dev-1", "b1", 12, 1, ""),
		ev(19, "outbox:gw2", history.OpCreated, "dev-1", "b2", 12, 2, ""),
		ev(20, "table:gw0", history.OpVerdict, "dev-1", "b2", 12, 2, "accepted"))
	r := history.CheckWith(h, history.CheckOptions{RequireApplied: true})
	// b2 is pending (no terminal yet): not "never applied", but "lost".
	want(t, r, "I4", "b2", "lost")
	if r.Applied != 3 {
		t.Fatalf("applied %d", r.Applied)
	}
	// Admitted, then refused by the device: acked invalid, not applied.
	h = append(h, ev(21, "outbox:gw2", history.OpTerminal, "dev-1", "b2", 12, 2, "invalid"))
	if r := history.CheckWith(h, history.CheckOptions{RequireApplied: true}); !r.OK() {
		t.Fatalf("refused after admission:\n%s", r)
	}
}

// TestCheckNeverPanics feeds odd events: empty fields, unknown ops.
func TestCheckNeverPanics(t *testing.T) {
	r := history.Check([]history.Event{{}, {Op: "weird"}, {Op: history.OpVerdict}, {Op: history.OpVerdict, Verdict: "accepted"},
		{Op: history.OpApplied}, {Op: history.OpOpened}})
	if !r.OK() {
		t.Fatalf("%s", r)
	}
	if r := history.Check(nil); !r.OK() || r.Events != 0 {
		t.Fatalf("%s", r)
	}
}

func write(t *testing.T, path string, events []history.Event) {
	t.Helper()
	w, err := history.Create(path, "test")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range events {
		if err := w.Record(e); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

func appendRaw(t *testing.T, path, s string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
	f.Close()
}

func TestReadRoundTrip(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.jsonl"), filepath.Join(dir, "b.jsonl")
	h := clean()
	write(t, a, h[:7])
	write(t, b, h[7:])
	appendRaw(t, b, "\n   \n") // blank lines are skipped
	got, err := history.Read(a, b)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(h) {
		t.Fatalf("read %d events, want %d", len(got), len(h))
	}
	for i := range h {
		if !got[i].Time.Equal(h[i].Time) || got[i].ID != h[i].ID || got[i].Op != h[i].Op || got[i].Source != h[i].Source {
			t.Fatalf("event %d: %+v, want %+v", i, got[i], h[i])
		}
	}
	if r := history.Check(got); !r.OK() {
		t.Fatal(r)
	}
}

// TestReadFirmwareFields: a firmware step's job and image round-trip;
// a line written before they existed reads with them empty, and an event
// without them writes neither key.
func TestReadFirmwareFields(t *testing.T) {
	path := filepath.Join(t.TempDir(), "h.jsonl")
	appendRaw(t, path, `{"t":"2026-01-02T03:04:05Z","src":"old","op":"verdict","dev":"d","id":"a","token":1,"seq":1,"kind":"fw.begin","verdict":"accepted"}`+"\n")
	write(t, path, []history.Event{
		{Op: history.OpVerdict, Device: "d", ID: "b", Token: 1, Seq: 2, Kind: "fw.begin", Verdict: "accepted", Job: "j1", Image: "ab12"},
		{Op: history.OpVerdict, Device: "d", ID: "c", Token: 1, Seq: 3, Kind: "set", Verdict: "accepted"},
	})
	got, err := history.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0].Job != "" || got[0].Image != "" || got[1].Job != "j1" || got[1].Image != "ab12" || got[2].Job != "" {
		t.Fatalf("%+v", got)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if last := strings.Split(strings.TrimSpace(string(raw)), "\n")[2]; strings.Contains(last, `"job"`) || strings.Contains(last, `"image"`) {
		t.Fatalf("an event without job and image: %s", last)
	}
}

func TestWriterDefaults(t *testing.T) {
	path := filepath.Join(t.TempDir(), "h.jsonl")
	write(t, path, []history.Event{{Op: history.OpVerdict, Device: "d", ID: "x", Token: 1, Seq: 1, Verdict: "accepted"}})
	got, err := history.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Source != "test" || got[0].Time.IsZero() {
		t.Fatalf("%+v", got)
	}
	var w *history.Writer // nil records nothing
	if w.Record(history.Event{}) != nil || w.Close() != nil {
		t.Fatal("nil writer")
	}
}

func TestReadSkipsTornLastLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "h.jsonl")
	write(t, path, clean()[:3])
	appendRaw(t, path, `{"t":"2026-11-29T12:00:00Z","src":"shim","op":"verd`) // SIGKILL mid-line
	got, err := history.Read(path)
	if err != nil || len(got) != 3 {
		t.Fatalf("read: %d events, %v", len(got), err)
	}

	// A restarted writer seals the torn line off; the file still reads,
	// and the torn line is skipped.
	write(t, path, clean()[3:7])
	got, err = history.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 8 || got[3].Op != history.OpOpened || got[4].ID != "a2" {
		t.Fatalf("after restart: %+v", got)
	}
	// A writer reopening an intact file adds nothing.
	write(t, path, nil)
	if again, err := history.Read(path); err != nil || len(again) != 8 {
		t.Fatalf("reopen: %d events, %v", len(again), err)
	}
	if r := history.Check(got); !r.OK() {
		t.Fatal(r)
	}
}

func TestReadCorruptMiddleLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "h.jsonl")
	write(t, path, clean()[:2])
	appendRaw(t, path, "not json\n")
	write(t, path, clean()[2:4])
	_, err := history.Read(path)
	if !errors.Is(err, history.ErrCorrupt) || !strings.Contains(err.Error(), path+":3") {
		t.Fatalf("err = %v, want ErrCorrupt at %s:3", err, path)
	}
	// Two bad lines at the end: the last may be torn, the one before not.
	path2 := filepath.Join(t.TempDir(), "h2.jsonl")
	write(t, path2, clean()[:1])
	appendRaw(t, path2, "{bad\n{torn")
	if _, err := history.Read(path2); !errors.Is(err, history.ErrCorrupt) || !strings.Contains(err.Error(), path2+":2") {
		t.Fatalf("err = %v", err)
	}
	if _, err := history.Read(filepath.Join(t.TempDir(), "missing")); err == nil || errors.Is(err, history.ErrCorrupt) {
		t.Fatalf("missing file: %v", err)
	}
}
