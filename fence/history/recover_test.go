package history_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/edgefence/edgefence/fence/history"
)

// crashed is a fence point "shim" killed between recording the accept of
// a2 (5/2) and committing it; it comes back with 5/1 durable and accepts
// a2 again when the outbox resends it. recovered is the mark its OpOpened
// event carries.
func crashed(recovered uint64) []history.Event {
	return []history.Event{
		ev(1, "outbox", history.OpCreated, "dev-1", "a1", 5, 1, ""),
		ev(2, "shim", history.OpVerdict, "dev-1", "a1", 5, 1, "accepted"),
		ev(3, "outbox", history.OpTerminal, "dev-1", "a1", 5, 1, "accepted"),
		ev(4, "outbox", history.OpCreated, "dev-1", "a2", 5, 2, ""),
		ev(5, "shim", history.OpVerdict, "dev-1", "a2", 5, 2, "accepted"), // killed before the commit
		ev(6, "shim", history.OpOpened, "dev-1", "", 5, recovered, ""),
		ev(7, "shim", history.OpVerdict, "dev-1", "a2", 5, 2, "accepted"), // the resend
		ev(8, "outbox", history.OpTerminal, "dev-1", "a2", 5, 2, "accepted"),
	}
}

func TestCheckDiscardsUncommittedAccepts(t *testing.T) {
	r := history.Check(crashed(1))
	if !r.OK() || r.Uncommitted != 1 || r.FenceVerdicts["accepted"] != 2 || r.Devices != 1 {
		t.Fatalf("uncommitted accept before the restart:\n%s", r)
	}
	if !strings.Contains(r.String(), "1 uncommitted accepts discarded") {
		t.Fatalf("String:\n%s", r)
	}

	// Histories without OpOpened events are checked as recorded.
	old := slices.Delete(crashed(1), 5, 6)
	want(t, history.Check(old), "I1", "a2", "applied twice")

	for _, tc := range []struct {
		name        string
		h           []history.Event
		inv, id, in string
	}{
		{"committed accept kept", crashed(2), "I1", "a2", "applied twice"},
		{"other source's restart", func() []history.Event {
			h := crashed(1)
			h[5].Source = "shim-b"
			return h
		}(), "I1", "a2", "applied twice"},
		{"torn-line seal is no restart", func() []history.Event {
			h := crashed(1)
			h[5].Device, h[5].Token, h[5].Seq = "", 0, 0
			return h
		}(), "I1", "a2", "applied twice"},
		{"acked accepted, only an uncommitted accept", func() []history.Event {
			h := crashed(1)
			h[6].Verdict = "duplicate" // impossible after the restart, but the ack claims accepted
			return h
		}(), "I4", "a2", "never accepted"},
		{"stale accept after the restart", append(crashed(1),
			ev(9, "shim", history.OpVerdict, "dev-1", "z1", 4, 9, "accepted")), "I1", "z1", "stale accept"},
		{"stale accept below a committed token", []history.Event{
			ev(1, "shim", history.OpVerdict, "dev-1", "b1", 6, 1, "accepted"),
			ev(2, "shim", history.OpOpened, "dev-1", "", 6, 1, ""),
			ev(3, "shim", history.OpVerdict, "dev-1", "a3", 5, 3, "accepted"),
		}, "I1", "a3", "stale accept"},
		{"judged once: a later, lower mark discards nothing", []history.Event{
			ev(1, "shim", history.OpVerdict, "dev-1", "b1", 6, 1, "accepted"),
			ev(2, "shim", history.OpOpened, "dev-1", "", 6, 1, ""),
			ev(3, "shim", history.OpOpened, "dev-1", "", 0, 0, ""),
			ev(4, "shim", history.OpVerdict, "dev-1", "b1", 6, 1, "accepted"),
		}, "I1", "b1", "applied twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want(t, history.Check(tc.h), tc.inv, tc.id, tc.in)
		})
	}

	// A higher token accepted but never committed does not make what the
	// recovered holder accepts next stale.
	h := []history.Event{
		ev(1, "shim", history.OpVerdict, "dev-1", "a1", 5, 1, "accepted"),
		ev(2, "shim", history.OpVerdict, "dev-1", "b1", 6, 1, "accepted"),
		ev(3, "shim", history.OpOpened, "dev-1", "", 5, 1, ""),
		ev(4, "shim", history.OpVerdict, "dev-1", "a2", 5, 2, "accepted"),
		ev(5, "shim-other", history.OpVerdict, "dev-2", "c1", 1, 1, "accepted"),
	}
	if r := history.Check(h); !r.OK() || r.Uncommitted != 1 || r.Devices != 2 {
		t.Fatalf("uncommitted higher token:\n%s", r)
	}
}

// TestWriterRecover: Recover records an OpOpened event exactly for the
// devices whose recorded accepts (this source's, in the file or through
// this Writer) are above the durable mark, and a new Writer on the file
// finds the accepts of the run before it.
func TestWriterRecover(t *testing.T) {
	path := filepath.Join(t.TempDir(), "h.jsonl")
	w, err := history.Create(path, "shim")
	if err != nil {
		t.Fatal(err)
	}
	accept := func(w *history.Writer, src, dev string, tok, seq uint64) {
		t.Helper()
		e := history.Event{Source: src, Op: history.OpVerdict, Device: dev, ID: fmt.Sprintf("%s-%d-%d", dev, tok, seq),
			Token: tok, Seq: seq, Verdict: "accepted"}
		if err := w.Record(e); err != nil {
			t.Fatal(err)
		}
	}
	accept(w, "", "dev-1", 5, 1)
	accept(w, "", "dev-1", 5, 2)
	accept(w, "", "dev-2", 3, 1)
	accept(w, "other", "dev-3", 9, 9) // not this writer's source
	if err := w.Record(history.Event{Op: history.OpVerdict, Device: "dev-2", ID: "x", Token: 8, Seq: 1, Verdict: "stale"}); err != nil {
		t.Fatal(err)
	}
	store := map[string][2]uint64{"dev-1": {5, 1}, "dev-2": {3, 1}}
	var asked []string
	durable := func(dev string) (uint64, uint64, uint64, error) {
		asked = append(asked, dev)
		if dev == "dev-5" {
			return 0, 0, 0, errors.New("disk on fire")
		}
		m := store[dev]
		return 0, m[0], m[1], nil
	}
	if err := w.Recover(durable); err != nil {
		t.Fatal(err)
	}
	if err := w.Recover(durable); err != nil { // dev-1 judged: nothing new
		t.Fatal(err)
	}
	if fmt.Sprint(asked) != "[dev-1 dev-2 dev-2]" {
		t.Fatalf("durable asked for %v", asked)
	}
	accept(w, "", "dev-2", 3, 2)
	accept(w, "", "dev-4", 1, 1)
	accept(w, "", "dev-5", 1, 1)
	w.Close() // killed: nothing of this is committed

	// The restarted fence point: a new Writer, same file and source.
	w, err = history.Create(path, "shim")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	asked = nil
	if err := w.Recover(durable); err == nil || !strings.Contains(err.Error(), "disk on fire") {
		t.Fatalf("Recover: %v", err)
	}
	if fmt.Sprint(asked) != "[dev-2 dev-4 dev-5]" {
		t.Fatalf("durable asked for %v", asked)
	}
	evs, err := history.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	var opened []string
	for _, e := range evs {
		if e.Op == history.OpOpened {
			if e.Source != "shim" || e.Reason == "" {
				t.Fatalf("%+v", e)
			}
			opened = append(opened, fmt.Sprintf("%s %d/%d", e.Device, e.Token, e.Seq))
		}
	}
	if want := "[dev-1 5/1 dev-2 3/1 dev-4 0/0]"; fmt.Sprint(opened) != want {
		t.Fatalf("opened %v, want %s", opened, want)
	}
	// dev-1 5/2, dev-2 3/2, dev-4 1/1 discarded; dev-5's 1/1 stays (its
	// durable mark could not be read).
	if r := history.Check(evs); !r.OK() || r.Uncommitted != 3 || r.FenceVerdicts["accepted"] != 4 {
		t.Fatalf("check:\n%s", r)
	}
	var nilw *history.Writer
	if err := nilw.Recover(durable); err != nil {
		t.Fatal(err)
	}
}
