package fwjob_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"go.uber.org/goleak"

	"github.com/edgefence/edgefence/devices/fwjob"
	"github.com/edgefence/edgefence/devices/shim"
	"github.com/edgefence/edgefence/fence"
)

func TestMain(m *testing.M) {
	if os.Getenv(killEnv) != "" {
		os.Exit(killMain())
	}
	goleak.VerifyTestMain(m)
}

// small is the image most tests send: 250 bytes in chunks of 100.
var small = newImage("j1", 250, 3, 100)

// reach drives a fresh device to state s with job small.job.
func reach(t *testing.T, s fwjob.State) *rig {
	t.Helper()
	r := newRig(t, fwjob.BootConfig{})
	im := small
	steps := map[fwjob.State]func(){
		fwjob.Downloading: func() { r.must(fwjob.KindBegin, im.begin()); r.must(fwjob.KindChunk, im.chunkAt(0)) },
		fwjob.Downloaded:  func() { r.must(fwjob.KindBegin, im.begin()); r.download(im) },
		fwjob.Installing: func() {
			r.must(fwjob.KindBegin, im.begin())
			r.download(im)
			// The shim alone, without the device's Settle: the state the
			// device is in between the command and its own verification.
			if res := r.s.Process(dev, r.env(fwjob.KindInstall, im.job1()), r.d); !res.Applied {
				t.Fatalf("install: %+v", res.Ack)
			}
		},
	}
	path := []fwjob.State{fwjob.Downloaded, fwjob.Installed, fwjob.Rebooting, fwjob.Confirming, fwjob.Committed}
	next := map[fwjob.State]func(){
		fwjob.Installed:  func() { r.must(fwjob.KindInstall, im.job1()) },
		fwjob.Rebooting:  func() { r.must(fwjob.KindActivate, im.job1()) },
		fwjob.Confirming: func() { r.reboot() },
		fwjob.Committed:  func() { r.must(fwjob.KindCommit, im.job1()) },
	}
	switch s {
	case fwjob.Idle:
	case fwjob.Downloading, fwjob.Downloaded, fwjob.Installing:
		steps[s]()
	case fwjob.Failed:
		steps[fwjob.Downloading]()
		r.must(fwjob.KindCancel, im.job1())
	case fwjob.RolledBack:
		r = reach(t, fwjob.Rebooting)
		r.must(fwjob.KindCancel, im.job1())
	default:
		steps[fwjob.Downloaded]()
		for _, p := range path[1:] {
			next[p]()
			if p == s {
				break
			}
		}
	}
	if got := r.status().State; got != s {
		t.Fatalf("reached %s, want %s", got, s)
	}
	return r
}

// TestTransitions takes every step in every state, of the job there and of
// another job: the legal ones move to the state of the plan, the illegal
// ones are refused invalid naming the state (or the job in progress) and
// move neither the mark nor the record.
func TestTransitions(t *testing.T) {
	type want struct {
		state  fwjob.State // accepted: the state after
		refuse string      // refused: in the reason
	}
	ok := func(s fwjob.State) want { return want{state: s} }
	no := func(s fwjob.State) want { return want{refuse: "state " + string(s)} }
	allNo := func(s fwjob.State) map[string]want {
		m := map[string]want{}
		for _, k := range fwjob.Kinds {
			m[k] = no(s)
		}
		return m
	}
	with := func(m map[string]want, k string, w want) map[string]want { m = maps.Clone(m); m[k] = w; return m }
	table := map[fwjob.State]map[string]want{
		fwjob.Idle:        with(allNo(fwjob.Idle), fwjob.KindBegin, ok(fwjob.Downloading)),
		fwjob.Downloading: with(with(allNo(fwjob.Downloading), fwjob.KindChunk, ok(fwjob.Downloading)), fwjob.KindCancel, ok(fwjob.Failed)),
		fwjob.Downloaded:  with(with(allNo(fwjob.Downloaded), fwjob.KindInstall, ok(fwjob.Installed)), fwjob.KindCancel, ok(fwjob.Failed)),
		fwjob.Installing:  with(allNo(fwjob.Installing), fwjob.KindCancel, ok(fwjob.Failed)),
		fwjob.Installed:   with(with(allNo(fwjob.Installed), fwjob.KindActivate, ok(fwjob.Rebooting)), fwjob.KindCancel, ok(fwjob.Failed)),
		fwjob.Rebooting:   with(allNo(fwjob.Rebooting), fwjob.KindCancel, ok(fwjob.RolledBack)),
		fwjob.Confirming:  with(with(allNo(fwjob.Confirming), fwjob.KindCommit, ok(fwjob.Committed)), fwjob.KindCancel, ok(fwjob.RolledBack)),
		fwjob.Committed:   allNo(fwjob.Committed),
		fwjob.Failed:      allNo(fwjob.Failed),
		fwjob.RolledBack:  allNo(fwjob.RolledBack),
	}
	if len(table) != len(fwjob.States) {
		t.Fatalf("table covers %d states of %d", len(table), len(fwjob.States))
	}
	for _, from := range fwjob.States {
		for _, kind := range fwjob.Kinds {
			for _, job := range []string{small.job, "j2"} {
				w := table[from][kind]
				if job != small.job { // another job's step
					switch {
					case from.InProgress():
						w = want{refuse: "job j1 in progress (state " + string(from) + ")"}
					case kind == fwjob.KindBegin:
						w = ok(fwjob.Downloading)
					}
				}
				t.Run(fmt.Sprintf("%s/%s/%s", from, kind, job), func(t *testing.T) {
					r := reach(t, from)
					im := small
					im.job = job
					off := r.status().Bytes
					c := fwjob.ChunkBody{Job: job, Off: off, Data: []byte{1}} // past a full image: refused first by the state
					if off < uint64(len(im.data)) {
						c = im.chunkAt(off)
					}
					body := map[string]any{fwjob.KindBegin: im.begin(), fwjob.KindChunk: c}[kind]
					if body == nil {
						body = im.job1()
					}
					if w.refuse != "" {
						r.refused(kind, body, w.refuse)
						return
					}
					if st := r.must(kind, body); st.State != w.state || st.Job != job {
						t.Fatalf("state %s job %s, want %s job %s (%q)", st.State, st.Job, w.state, job, st.Reason)
					}
				})
			}
		}
	}
}

// TestJobCommitted runs a job to the end and a second one back to the
// first slot: the slots, the running slot, the security version, the
// state report.
func TestJobCommitted(t *testing.T) {
	r := newRig(t, fwjob.BootConfig{Security: 2})
	im := newImage("j1", 10_000, 3, 1024)
	st := r.must(fwjob.KindBegin, im.begin())
	if st.State != fwjob.Downloading || st.Bytes != 0 || st.Size != 10_000 {
		t.Fatalf("after begin: %+v", st)
	}
	if st = r.download(im); st.State != fwjob.Downloaded || st.Bytes != st.Size {
		t.Fatalf("after download: %+v", st)
	}
	if st = r.must(fwjob.KindInstall, im.job1()); st.State != fwjob.Installed {
		t.Fatalf("after install: %+v", st)
	}
	o := r.send(fwjob.KindActivate, im.job1())
	if o.Status.State != fwjob.Rebooting || !o.Reboot || o.Status.Trial != fwjob.SlotB || o.Status.Slot != fwjob.SlotA {
		t.Fatalf("after activate: %+v (reboot %v)", o.Status, o.Reboot)
	}
	info := r.reboot()
	if !info.Trial || info.Slot != fwjob.SlotB || info.Status.State != fwjob.Confirming || info.Status.Tries != fwjob.DefaultBootTries-1 {
		t.Fatalf("after reboot: %+v", info)
	}
	if !bytes.Equal(r.slot(fwjob.SlotB), im.data) {
		t.Fatal("slot b does not hold the image")
	}
	st = r.must(fwjob.KindCommit, im.job1())
	if st.State != fwjob.Committed || st.Active != fwjob.SlotB || st.Slot != fwjob.SlotB || st.Trial != "" || st.Security != 3 {
		t.Fatalf("after commit: %+v", st)
	}
	want := map[string]any{"job": "j1", "state": "committed", "bytes": uint64(10_000), "size": uint64(10_000),
		"slot": "b", "version": uint64(3), "reason": "", "token": uint64(r.token), "image": hex.EncodeToString(im.sum())}
	if got := st.Report(); !maps.Equal(got, want) {
		t.Fatalf("report %v, want %v", got, want)
	}
	if info := r.reboot(); info.Trial || info.Slot != fwjob.SlotB || info.Status.State != fwjob.Committed {
		t.Fatalf("a reboot after the commit: %+v", info)
	}

	// The next job goes to the other slot, the old image's.
	im2 := newImage("j2", 3000, 3, 1000)
	r.must(fwjob.KindBegin, im2.begin())
	r.download(im2)
	r.must(fwjob.KindInstall, im2.job1())
	r.must(fwjob.KindActivate, im2.job1())
	if info := r.reboot(); info.Slot != fwjob.SlotA || !info.Trial {
		t.Fatalf("second job boots %+v", info)
	}
	if st := r.must(fwjob.KindCommit, im2.job1()); st.Active != fwjob.SlotA || !bytes.Equal(r.slot(fwjob.SlotA), im2.data) {
		t.Fatalf("second job: %+v", st)
	}
}

// TestAntiRollback: an image below the running security version is
// refused at fw.begin; equal is allowed; a commit raises the version.
func TestAntiRollback(t *testing.T) {
	r := newRig(t, fwjob.BootConfig{Security: 5})
	r.refused(fwjob.KindBegin, newImage("old", 100, 4, 100).begin(), "image version 4 below the running security version 5")
	im := newImage("j7", 100, 7, 100)
	r.must(fwjob.KindBegin, im.begin())
	r.download(im)
	r.must(fwjob.KindInstall, im.job1())
	r.must(fwjob.KindActivate, im.job1())
	r.reboot()
	if st := r.must(fwjob.KindCommit, im.job1()); st.Security != 7 || st.Report()["version"] != uint64(7) {
		t.Fatalf("after commit: %+v", st)
	}
	r.refused(fwjob.KindBegin, newImage("j6", 100, 6, 100).begin(), "image version 6 below the running security version 7")
	if st := r.must(fwjob.KindBegin, newImage("j7b", 100, 7, 100).begin()); st.State != fwjob.Downloading {
		t.Fatalf("same version: %+v", st)
	}
}

// TestOffsetsAndResume: a chunk must start at the bytes received, within
// the job's chunk and the image; a new holder resumes from the device's
// reported bytes; a chunk whose record never committed (a crash after the
// slot write: here a panic at that point, which rolls the transaction
// back) is simply sent again.
func TestOffsetsAndResume(t *testing.T) {
	r := newRig(t, fwjob.BootConfig{})
	im := newImage("j1", 1000, 1, 300)
	r.must(fwjob.KindBegin, im.begin())
	r.must(fwjob.KindChunk, im.chunkAt(0))
	r.refused(fwjob.KindChunk, im.chunkAt(0), "expected offset 300, got 0")
	r.refused(fwjob.KindChunk, im.chunkAt(600), "expected offset 300, got 600")
	r.refused(fwjob.KindChunk, fwjob.ChunkBody{Job: "j1", Off: 300, Data: make([]byte, 301)}, "chunks are at most 300")
	r.refused(fwjob.KindChunk, fwjob.ChunkBody{Job: "j1", Off: 300, Data: nil}, "data of 0 bytes")

	// A new holder (failover) reads the device's bytes and goes on.
	r.token, r.seq = r.token+1, 0
	st := r.status()
	if st.Bytes != 300 {
		t.Fatalf("bytes %d", st.Bytes)
	}
	r.must(fwjob.KindChunk, im.chunkAt(st.Bytes))

	// Killed between the slot write and the record's commit.
	crashed := false
	r.d, _ = fwjob.New(fwjob.WithCrash(r.cfg, func(p string) {
		if p == "chunk.written" && !crashed {
			crashed = true
			panic("power lost")
		}
	}))
	raw := r.env(fwjob.KindChunk, im.chunkAt(600))
	o := r.d.Handle(r.s, raw)
	if o.Ack.Verdict != fence.Invalid || o.Status.Bytes != 600 || r.mark().Seq != r.seq-1 {
		t.Fatalf("crash in the chunk: %v %q, %+v, mark %v", o.Ack.Verdict, o.Ack.Reason, o.Status, r.mark())
	}
	if got := r.slot(fwjob.SlotB); !bytes.Equal(got, im.data[:900]) {
		t.Fatalf("the slot holds %d bytes: the write happened, only the record did not move", len(got))
	}
	if o := r.d.Handle(r.s, raw); o.Ack.Verdict != fence.Accepted || o.Status.Bytes != 900 {
		t.Fatalf("the same chunk again: %v %q %+v", o.Ack.Verdict, o.Ack.Reason, o.Status)
	}
	r.refused(fwjob.KindChunk, fwjob.ChunkBody{Job: "j1", Off: 900, Data: make([]byte, 101)}, "runs past the image's 1000 bytes")
	if st := r.download(im); st.State != fwjob.Downloaded {
		t.Fatalf("%+v", st)
	}
}

// TestDeposedHolder: a step of a holder below the mark is stale at the
// fence, whatever the job's state: its chunk never reaches the slot.
func TestDeposedHolder(t *testing.T) {
	r := reach(t, fwjob.Downloading)
	old := envelope(t, r.token-1, 99, fwjob.KindChunk, fwjob.ChunkBody{Job: "j1", Off: 100, Data: bytes.Repeat([]byte{0xEE}, 100)})
	if o := r.d.Handle(r.s, old); o.Ack.Verdict != fence.Stale || o.Status.Bytes != 100 {
		t.Fatalf("deposed chunk: %v %+v", o.Ack.Verdict, o.Status)
	}
	if bytes.Contains(r.slot(fwjob.SlotB), []byte{0xEE, 0xEE}) {
		t.Fatal("a deposed holder's chunk reached the slot")
	}
	old = envelope(t, r.token-1, 99, fwjob.KindCancel, fwjob.JobBody{Job: "j1"})
	if o := r.d.Handle(r.s, old); o.Ack.Verdict != fence.Stale || o.Status.State != fwjob.Downloading {
		t.Fatalf("deposed cancel: %v %+v", o.Ack.Verdict, o.Status)
	}
}

// TestHashChecks: a chunk corrupted on the way fails the job at the last
// chunk; a slot corrupted after the download fails the install; either
// way the image is never activated.
func TestHashChecks(t *testing.T) {
	t.Run("corrupted chunk", func(t *testing.T) {
		r := newRig(t, fwjob.BootConfig{})
		im := newImage("j1", 250, 1, 100)
		bad := im
		bad.data = slices.Clone(im.data)
		bad.data[150] ^= 1
		r.must(fwjob.KindBegin, im.begin())
		st := r.download(bad)
		if st.State != fwjob.Failed || !strings.Contains(st.Reason, "received image SHA-256") {
			t.Fatalf("%+v", st)
		}
		r.refused(fwjob.KindInstall, im.job1(), "state failed")
		r.refused(fwjob.KindActivate, im.job1(), "state failed")
	})
	t.Run("corrupted slot", func(t *testing.T) {
		r := reach(t, fwjob.Downloaded)
		f, err := os.OpenFile(fwjob.SlotPath(r.dir, fwjob.SlotB), os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteAt([]byte{0x55}, 17)
		f.Close()
		st := r.must(fwjob.KindInstall, small.job1())
		if st.State != fwjob.Failed || !strings.Contains(st.Reason, "install: slot b") {
			t.Fatalf("%+v", st)
		}
		r.refused(fwjob.KindActivate, small.job1(), "state failed")
		if info := r.reboot(); info.Slot != fwjob.SlotA || info.Trial {
			t.Fatalf("%+v", info)
		}
	})
	t.Run("slot corrupted after activate", func(t *testing.T) {
		r := reach(t, fwjob.Rebooting)
		if err := os.WriteFile(fwjob.SlotPath(r.dir, fwjob.SlotB), []byte("half"), 0o600); err != nil {
			t.Fatal(err)
		}
		info := r.reboot()
		if info.Slot != fwjob.SlotA || info.Trial || info.Status.State != fwjob.RolledBack ||
			!strings.Contains(info.Status.Reason, "trial boot refused") {
			t.Fatalf("%+v", info)
		}
	})
}

// TestCancelRollsBack: cancel before the trial boot disarms it (the
// device keeps its slot); cancel while confirming disarms it and asks for
// a reboot into the old slot, and no new job begins until then.
func TestCancelRollsBack(t *testing.T) {
	r := reach(t, fwjob.Rebooting)
	o := r.send(fwjob.KindCancel, small.job1())
	if o.Status.State != fwjob.RolledBack || o.Status.Trial != "" || o.Reboot {
		t.Fatalf("cancel in rebooting: %+v reboot %v", o.Status, o.Reboot)
	}
	if info := r.reboot(); info.Slot != fwjob.SlotA || info.Trial {
		t.Fatalf("%+v", info)
	}

	r = reach(t, fwjob.Confirming)
	o = r.send(fwjob.KindCancel, small.job1())
	if o.Status.State != fwjob.RolledBack || o.Status.Slot != fwjob.SlotB || !o.Reboot || o.Status.Reason != "canceled" {
		t.Fatalf("cancel in confirming: %+v reboot %v", o.Status, o.Reboot)
	}
	r.refused(fwjob.KindBegin, newImage("j2", 10, 3, 10).begin(), "reboot pending")
	info := r.reboot()
	if info.Slot != fwjob.SlotA || info.Trial || info.Status.State != fwjob.RolledBack || info.Status.Security != 0 {
		t.Fatalf("%+v", info)
	}
	if !bytes.Equal(r.slot(fwjob.SlotA), []byte("factory")) {
		t.Fatal("the old slot changed")
	}
	r.must(fwjob.KindBegin, newImage("j2", 10, 3, 10).begin())
}

// TestBootRollback: the health check decides a trial boot; failing,
// hanging past the window, or never finishing within the tries rolls back
// to the old slot with the reason.
func TestBootRollback(t *testing.T) {
	sick := errors.New("application does not start")
	cases := []struct {
		name   string
		health func(ctx context.Context, b fwjob.BootInfo) error
		reason string
	}{
		{"fails", func(context.Context, fwjob.BootInfo) error { return sick }, "health check failed: application does not start"},
		{"hangs", func(ctx context.Context, _ fwjob.BootInfo) error { <-ctx.Done(); return nil }, "did not pass within"},
		{"panics", func(context.Context, fwjob.BootInfo) error { panic("segfault") }, "health check panicked"},
		{"says too much", func(context.Context, fwjob.BootInfo) error {
			return errors.New("bad \xff byte " + strings.Repeat("é", 300))
		}, "health check failed: bad ? byte é"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := reach(t, fwjob.Rebooting)
			r.boot = fwjob.BootConfig{Health: c.health, Window: 50 * time.Millisecond}
			info := r.reboot()
			st := info.Status
			if info.Slot != fwjob.SlotA || info.Trial || st.State != fwjob.RolledBack || !strings.Contains(st.Reason, c.reason) || st.Trial != "" {
				t.Fatalf("%+v", info)
			}
			if len(st.Reason) > fwjob.MaxReasonLen || !utf8.ValidString(st.Reason) {
				t.Fatalf("reason of %d bytes, valid UTF-8 %v", len(st.Reason), utf8.ValidString(st.Reason))
			}
			r.refused(fwjob.KindCommit, small.job1(), "state rolled_back")
		})
	}
	t.Run("tries run out", func(t *testing.T) {
		r := reach(t, fwjob.Rebooting)
		r.s.Close()
		seen := []string{}
		for i := range fwjob.DefaultBootTries {
			// Power lost during each health check: the try was spent first.
			ctx, cancel := context.WithCancel(context.Background())
			_, err := fwjob.Boot(ctx, r.dir, fwjob.BootConfig{Health: func(ctx context.Context, b fwjob.BootInfo) error {
				seen = append(seen, b.Slot)
				cancel()
				return ctx.Err()
			}})
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("boot %d: %v", i, err)
			}
		}
		info := r.reboot()
		if info.Slot != fwjob.SlotA || info.Status.State != fwjob.RolledBack || !strings.Contains(info.Status.Reason, "exhausted") {
			t.Fatalf("%+v after trial boots of %v", info, seen)
		}
		if !slices.Equal(seen, []string{"b", "b", "b"}) {
			t.Fatalf("trial boots %v", seen)
		}
	})
	t.Run("power loss while confirming", func(t *testing.T) {
		r := reach(t, fwjob.Confirming)
		info := r.reboot()
		if info.Slot != fwjob.SlotB || !info.Trial || info.Status.State != fwjob.Confirming || info.Status.Tries != fwjob.DefaultBootTries-2 {
			t.Fatalf("%+v", info)
		}
		r.must(fwjob.KindCommit, small.job1())
	})
}

// TestBadCommands: bodies that do not fit are refused at Check, naming
// what is wrong, before the admit rule.
func TestBadCommands(t *testing.T) {
	r := newRig(t, fwjob.BootConfig{})
	good := small.begin()
	cases := []struct {
		kind string
		body any
		want string
	}{
		{"fw.reboot", small.job1(), `unknown kind "fw.reboot"`},
		{fwjob.KindBegin, map[string]any{"job": "j1"}, "image must be a 32-byte SHA-256"},
		{fwjob.KindBegin, map[string]any{"job": "j1", "image": good.Image, "size": 10, "chunk": 10}, "needs size, version and chunk"},
		{fwjob.KindBegin, func() any { b := good; b.Size = 0; return b }(), "size 0 outside"},
		{fwjob.KindBegin, func() any { b := good; b.Size = fwjob.DefaultMaxImage + 1; return b }(), "outside 1.."},
		{fwjob.KindBegin, func() any { b := good; b.Chunk = fwjob.MaxChunk + 1; return b }(), "chunk 30721 outside"},
		{fwjob.KindBegin, func() any { b := good; b.Job = ""; return b }(), "job id must be"},
		{fwjob.KindBegin, func() any { b := good; b.Job = "a\nb"; return b }(), "job id must be"},
		{fwjob.KindBegin, map[string]any{"job": "j1", "image": good.Image, "size": 10, "chunk": 10, "version": 1, "url": "x"}, `unknown field "url"`},
		{fwjob.KindChunk, map[string]any{"job": "j1", "data": []byte{1}}, "needs off"},
		{fwjob.KindInstall, map[string]any{}, "job missing"},
		{fwjob.KindCommit, "j1", "fw.commit body"},
	}
	for _, c := range cases {
		r.refused(c.kind, c.body, c.want)
	}
	raw, _ := fence.MarshalEnvelope(&fence.Envelope{V: fence.Version, Device: dev, Token: 99, Seq: 1, ID: "x", Kind: fwjob.KindInstall})
	if o := r.d.Handle(r.s, raw); o.Ack.Verdict != fence.Invalid || !strings.Contains(o.Ack.Reason, "needs a body") {
		t.Fatalf("%+v", o.Ack)
	}
	if st := r.s.Stats(); st.Invalid != uint64(len(cases))+1 || st.Accepted != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestNotBooted: a device whose database Boot never touched refuses.
func TestNotBooted(t *testing.T) {
	r := newRig(t, fwjob.BootConfig{})
	r.s.Close()
	if err := os.Remove(fwjob.DBPath(r.dir)); err != nil {
		t.Fatal(err)
	}
	var err error
	if r.s, err = shim.Open(fwjob.DBPath(r.dir), nil); err != nil {
		t.Fatal(err)
	}
	if o := r.send(fwjob.KindBegin, small.begin()); o.Ack.Verdict != fence.Invalid || !strings.Contains(o.Ack.Reason, "not booted") {
		t.Fatalf("%+v", o.Ack)
	}
}
