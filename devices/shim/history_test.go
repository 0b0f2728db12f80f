package shim_test

import (
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"github.com/edgefence/edgefence/devices/shim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/history"
)

func createHistory(t *testing.T, path, source string) *history.Writer {
	t.Helper()
	w, err := history.Create(path, source)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

// TestHistory: every decision is one OpVerdict event, in decision order,
// across a restart of the fence point; the history checks clean.
func TestHistory(t *testing.T) {
	dir := t.TempDir()
	db, hpath := filepath.Join(dir, "fence.db"), filepath.Join(dir, "history.jsonl")
	s := open(t, db, &shim.Options{History: createHistory(t, hpath, "shim:a")})
	d := &recorder{}
	for _, c := range []struct {
		tok  fence.Token
		seq  uint64
		kind string
	}{{10, 1, "ok"}, {10, 2, "ok"}, {10, 2, "ok"}, {12, 1, "ok"}, {10, 3, "ok"}, {12, 2, "nope"}} {
		s.Handle("dev-1", envelope(t, "dev-1", c.tok, c.seq, c.kind), d)
	}
	s.Handle("dev-1", []byte("garbage"), d)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Restarted (same marks), writing under another source name.
	s = open(t, db, &shim.Options{History: createHistory(t, hpath, "shim:b")})
	s.Handle("dev-1", envelope(t, "dev-1", 12, 1, "ok"), d)
	s.Handle("dev-1", envelope(t, "dev-1", 12, 3, "ok"), d)

	evs, err := history.Read(hpath)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range evs {
		if e.Op != history.OpVerdict || e.Device != "dev-1" || e.Time.IsZero() {
			t.Fatalf("event %+v", e)
		}
		got = append(got, fmt.Sprintf("%s %d/%d %s %s", e.Source, e.Token, e.Seq, e.Kind, e.Verdict))
	}
	want := []string{
		"shim:a 10/1 ok accepted", "shim:a 10/2 ok accepted", "shim:a 10/2 ok duplicate",
		"shim:a 12/1 ok accepted", "shim:a 10/3 ok stale", "shim:a 12/2 nope invalid", "shim:a 0/0  invalid",
		"shim:b 12/1 ok duplicate", "shim:b 12/3 ok accepted",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("history\n got %q\nwant %q", got, want)
	}
	if evs[4].Reason == "" || evs[0].ID != "c-10-1" {
		t.Fatalf("events %+v", evs[:5])
	}
	if r := history.Check(evs); !r.OK() || r.FenceVerdicts["accepted"] != 4 {
		t.Fatalf("check:\n%s", r)
	}
}

// TestHistoryConcurrent: decisions from many goroutines land one line each,
// in decision order (the history checks clean).
func TestHistoryConcurrent(t *testing.T) {
	dir := t.TempDir()
	hpath := filepath.Join(dir, "history.jsonl")
	s := open(t, filepath.Join(dir, "fence.db"), &shim.Options{History: createHistory(t, hpath, "shim")})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 25 {
				// Holders with tokens 1..4 racing: stale and accepted mixed.
				s.Handle("dev-1", envelope(t, "dev-1", fence.Token(w+1), uint64(i+1), "ok"), counter{})
			}
		})
	}
	wg.Wait()
	evs, err := history.Read(hpath)
	if err != nil {
		t.Fatal(err)
	}
	if r := history.Check(evs); len(evs) != 100 || !r.OK() {
		t.Fatalf("%d events:\n%s", len(evs), r)
	}
}

// TestHistoryRecover: a crash that keeps an accept recorded in the history
// from being committed (here: the database as it was before) makes the
// reopened shim record the durable marks (OpOpened), also for a device the
// store does not know; the resent commands are accepted again and the
// history checks clean. A clean reopen records nothing.
func TestHistoryRecover(t *testing.T) {
	dir := t.TempDir()
	db, hpath := filepath.Join(dir, "fence.db"), filepath.Join(dir, "history.jsonl")
	s := open(t, db, &shim.Options{History: createHistory(t, hpath, "shim")})
	s.Handle("dev-1", envelope(t, "dev-1", 5, 1, "ok"), counter{})
	crashed := snapshot(t, db, filepath.Join(dir, "crashed.db")) // 5/1 durable, nothing of dev-2
	s.Handle("dev-1", envelope(t, "dev-1", 5, 2, "ok"), counter{})
	s.Handle("dev-2", envelope(t, "dev-2", 7, 1, "ok"), counter{})
	s.Handle("dev-p", envelope(t, "dev-p", 3, 1, "fail"), &recorder{}) // consumed, then invalid
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	for range 2 { // after the crash, then a clean restart
		s = open(t, crashed, &shim.Options{History: createHistory(t, hpath, "shim")})
		for _, c := range []struct {
			dev string
			tok fence.Token
			seq uint64
		}{{"dev-1", 5, 2}, {"dev-2", 7, 1}} {
			if ack := s.Handle(c.dev, envelope(t, c.dev, c.tok, c.seq, "ok"), counter{}); ack.Verdict != fence.Accepted && ack.Verdict != fence.Duplicate {
				t.Fatalf("resend: %+v", ack)
			}
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}

	evs, err := history.Read(hpath)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range evs {
		got = append(got, fmt.Sprintf("%s %s %d/%d %s", e.Op, e.Device, e.Token, e.Seq, e.Verdict))
	}
	want := []string{
		"verdict dev-1 5/1 accepted", "verdict dev-1 5/2 accepted", "verdict dev-2 7/1 accepted",
		"verdict dev-p 3/1 accepted", "verdict dev-p 3/1 invalid",
		"opened dev-1 5/1 ", "opened dev-2 0/0 ", "opened dev-p 0/0 ",
		"verdict dev-1 5/2 accepted", "verdict dev-2 7/1 accepted",
		"verdict dev-1 5/2 duplicate", "verdict dev-2 7/1 duplicate",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("history\n got %q\nwant %q", got, want)
	}
	if r := history.Check(evs); !r.OK() || r.Uncommitted != 3 {
		t.Fatalf("check:\n%s", r)
	}
}

// TestHistoryNote: Options.HistoryNote annotates every decision of a
// decoded command, the accept (written before its commit) and the
// refusals alike, before the event is written.
func TestHistoryNote(t *testing.T) {
	dir := t.TempDir()
	hpath := filepath.Join(dir, "history.jsonl")
	note := func(env *fence.Envelope, e *history.Event) { e.Job = "job-of-" + env.ID }
	s := open(t, filepath.Join(dir, "fence.db"), &shim.Options{History: createHistory(t, hpath, "shim"), HistoryNote: note})
	d := &recorder{}
	s.Handle("dev-1", envelope(t, "dev-1", 10, 1, "ok"), d)
	s.Handle("dev-1", envelope(t, "dev-1", 10, 1, "ok"), d)
	s.Handle("dev-1", envelope(t, "dev-1", 9, 1, "ok"), d)
	s.Handle("dev-1", []byte("garbage"), d)
	var got []string
	for _, e := range closeAndRead(t, s, hpath) {
		got = append(got, e.Verdict+" "+e.Job)
	}
	want := []string{"accepted job-of-c-10-1", "duplicate job-of-c-10-1", "stale job-of-c-9-1", "invalid "}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("events\n got %q\nwant %q", got, want)
	}
}

// closeAndRead closes s and reads the history file at path.
func closeAndRead(t *testing.T, s *shim.Shim, path string) []history.Event {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	evs, err := history.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}
