package history_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/history"
)

// simulate writes an honest history: lease holders of a few devices (each
// grant a strictly higher etcd revision as token) issue commands with seq
// 1, 2, 3... under their token and keep issuing after being superseded (a
// paused holder that wakes up); every command is created in its holder's
// outbox, decided by the device's fence point with fence.Admit, and given
// exactly one terminal state (the first verdict, or expired if never
// delivered). Delivered commands may be redelivered (QoS 1), and fence
// points restart under another source name keeping their marks. pick(n,
// label) chooses in [0, n).
func simulate(steps int, pick func(n int, label string) int) []history.Event {
	return simulateCrashes(steps, pick, false)
}

// simulateCrashes is simulate where, with crashes, fence points are also
// killed between recording an accept and committing it: they restart under
// the same name, record the recovered mark (OpOpened), and decide the
// outbox's resend of the command.
func simulateCrashes(steps int, pick func(n int, label string) int, crashes bool) []history.Event {
	type holder struct {
		tok fence.Token
		seq uint64
		gw  string
	}
	type device struct {
		mark      fence.Mark
		holders   []holder
		src       string
		delivered []history.Event // commands delivered, for redelivery
	}
	ndev := 1 + pick(3, "devices")
	devs := make([]*device, ndev)
	for i := range devs {
		devs[i] = &device{src: "shim"}
	}
	rev := fence.Token(1 + pick(1000, "firstRevision"))
	clock := t0
	var out []history.Event
	rec := func(e history.Event) {
		clock = clock.Add(time.Millisecond)
		e.Time = clock
		out = append(out, e)
	}
	decide := func(d *device, name string, c history.Event) string {
		v, next := fence.Admit(d.mark, fence.Token(c.Token), c.Seq)
		d.mark = next
		rec(history.Event{Source: d.src, Op: history.OpVerdict, Device: name, ID: c.ID, Token: c.Token,
			Seq: c.Seq, Verdict: v.String()})
		return v.String()
	}
	n, actions := 0, 4
	if crashes {
		actions = 5
	}
	for step := range steps {
		di, action := pick(ndev, "device"), pick(actions, "action")
		if step < 2 {
			di, action = 0, step // grant, then send: every history has an accept
		}
		d, name := devs[di], fmt.Sprintf("dev-%d", di)
		switch {
		case action == 0 || len(d.holders) == 0: // a grant
			rev += fence.Token(1 + pick(3, "revisionGap"))
			d.holders = append(d.holders, holder{tok: rev, gw: fmt.Sprintf("gw%d", pick(3, "gateway"))})
		case action == 1: // a command, delivered at once or expired
			h := &d.holders[pick(len(d.holders), "holder")]
			h.seq++
			n++
			c := history.Event{Source: "outbox:" + h.gw, Op: history.OpCreated, Device: name,
				ID: fmt.Sprintf("c%d", n), Token: uint64(h.tok), Seq: h.seq}
			rec(c)
			verdict := fence.Expired.String()
			if pick(8, "expire") != 0 || step == 1 {
				verdict = decide(d, name, c)
				d.delivered = append(d.delivered, c)
			}
			c.Op, c.Verdict = history.OpTerminal, verdict
			rec(c)
		case action == 2 && len(d.delivered) > 0: // a redelivery
			decide(d, name, d.delivered[pick(len(d.delivered), "redelivered")])
		case action == 3: // the fence point restarts under another name
			d.src = fmt.Sprintf("shim-%d", step)
		case action == 4: // killed between an accept's line and its commit
			h := &d.holders[pick(len(d.holders), "holder")]
			h.seq++
			n++
			c := history.Event{Source: "outbox:" + h.gw, Op: history.OpCreated, Device: name,
				ID: fmt.Sprintf("c%d", n), Token: uint64(h.tok), Seq: h.seq}
			rec(c)
			if v, _ := fence.Admit(d.mark, h.tok, h.seq); v == fence.Accepted {
				rec(history.Event{Source: d.src, Op: history.OpVerdict, Device: name, ID: c.ID, Token: c.Token,
					Seq: c.Seq, Verdict: v.String()})
			}
			rec(history.Event{Source: d.src, Op: history.OpOpened, Device: name, Token: uint64(d.mark.Token), Seq: d.mark.Seq})
			c.Op, c.Verdict = history.OpTerminal, decide(d, name, c) // the outbox resends it
			d.delivered = append(d.delivered, c)
			rec(c)
		}
	}
	return out
}

func rapidPick(t *rapid.T) func(int, string) int {
	return func(n int, label string) int { return rapid.IntRange(0, n-1).Draw(t, label) }
}

func TestPropertyHonestHistoriesPass(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		h := simulate(rapid.IntRange(2, 200).Draw(t, "steps"), rapidPick(t))
		if r := history.Check(h); !r.OK() {
			t.Fatalf("honest history fails:\n%s", r)
		}
	})
}

// TestPropertyCrashedHistoriesPass: with fence points killed between an
// accept's line and its commit, the histories check clean because of the
// OpOpened events, and without them the resent commands are applied twice.
func TestPropertyCrashedHistoriesPass(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		h := simulateCrashes(rapid.IntRange(2, 200).Draw(t, "steps"), rapidPick(t), true)
		r := history.Check(h)
		if !r.OK() {
			t.Fatalf("crashed history fails:\n%s", r)
		}
		var opened int
		without := slices.DeleteFunc(slices.Clone(h), func(e history.Event) bool {
			if e.Op == history.OpOpened {
				opened++
				return true
			}
			return false
		})
		old := history.Check(without)
		if r.Uncommitted > opened || (r.Uncommitted > 0) == old.OK() {
			t.Fatalf("%d OpOpened, %d accepts discarded; without the events:\n%s", opened, r.Uncommitted, old)
		}
		for _, v := range old.Violations {
			if !strings.Contains(v.Detail, "applied twice") {
				t.Fatalf("without the events: %v", v)
			}
		}
	})
}

func TestPropertyStaleAcceptFails(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		h := simulate(rapid.IntRange(2, 200).Draw(t, "steps"), rapidPick(t))
		var acc []int
		for i, e := range h {
			if e.Op == history.OpVerdict && e.Verdict == "accepted" {
				acc = append(acc, i)
			}
		}
		i := acc[rapid.IntRange(0, len(acc)-1).Draw(t, "after")]
		bad := h[i]
		bad.ID, bad.Token, bad.Seq = "injected", bad.Token-1, 1+rapid.Uint64Range(0, 100).Draw(t, "seq")
		h = slices.Insert(h, i+1, bad)
		r := history.Check(h)
		if !slices.ContainsFunc(r.Violations, func(v history.Violation) bool {
			return v.Invariant == history.InvariantOrder && v.ID == "injected"
		}) {
			t.Fatalf("stale accept of token %d after %d not found:\n%s", bad.Token, bad.Token+1, r)
		}
	})
}

func TestPropertyLostTerminalFails(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		h := simulate(rapid.IntRange(2, 200).Draw(t, "steps"), rapidPick(t))
		var terms []int
		for i, e := range h {
			if e.Op == history.OpTerminal {
				terms = append(terms, i)
			}
		}
		i := terms[rapid.IntRange(0, len(terms)-1).Draw(t, "dropped")]
		id := h[i].ID
		r := history.Check(slices.Delete(h, i, i+1))
		if len(r.Violations) != 1 || r.Violations[0].Invariant != history.InvariantFate || r.Violations[0].ID != id {
			t.Fatalf("dropped terminal of %s:\n%s", id, r)
		}
	})
}

// TestVerdictNames pins the verdict names Check relies on to fence's.
func TestVerdictNames(t *testing.T) {
	if fence.Accepted.String() != "accepted" || fence.Duplicate.String() != "duplicate" {
		t.Fatal("fence verdict names changed; update check.go")
	}
}

func BenchmarkCheck(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	h := simulate(40_000, func(n int, _ string) int { return r.IntN(n) })
	for len(h) < 100_000 {
		h = append(h, simulate(1000, func(n int, _ string) int { return r.IntN(n) })...)
	}
	h = h[:100_000]
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		history.Check(h)
	}
	b.ReportMetric(float64(len(h)), "events/op")
}
