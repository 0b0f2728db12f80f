package linear_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"pgregory.net/rapid"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/history"
	"github.com/edgefence/edgefence/fence/history/linear"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// simulate returns the outbox view (created and terminal events) of
// holders sending concurrently to a few devices whose fence points decide
// honestly with fence.Admit, each decision inside its command's interval.
// Some commands are never delivered (expired) or never finish (no terminal).
func simulate(t *rapid.T) []history.Event {
	type cmd struct {
		e   history.Event
		dev int
	}
	ndev := rapid.IntRange(1, 3).Draw(t, "devices")
	marks := make([]fence.Mark, ndev)
	tokens := make([][]fence.Token, ndev) // per device, per holder: its token
	seqs := make([][]uint64, ndev)        // and the last seq it issued
	rev := fence.Token(rapid.IntRange(1, 100).Draw(t, "rev"))
	clock := t0
	var out []history.Event
	var inflight []*cmd
	rec := func(e history.Event) {
		clock = clock.Add(time.Microsecond)
		e.Time = clock
		out = append(out, e)
	}
	for i := range rapid.IntRange(1, 60).Draw(t, "steps") {
		d := rapid.IntRange(0, ndev-1).Draw(t, "device")
		switch a := rapid.IntRange(0, 3).Draw(t, "action"); {
		case a == 0 || len(tokens[d]) == 0:
			rev += fence.Token(rapid.IntRange(1, 3).Draw(t, "gap"))
			tokens[d] = append(tokens[d], rev)
			seqs[d] = append(seqs[d], 0)
		case a == 1:
			h := rapid.IntRange(0, len(tokens[d])-1).Draw(t, "holder")
			seqs[d][h]++
			c := &cmd{e: history.Event{Op: history.OpCreated, Device: fmt.Sprintf("dev-%d", d), ID: fmt.Sprintf("c%d", i),
				Token: uint64(tokens[d][h]), Seq: seqs[d][h]}, dev: d}
			rec(c.e)
			inflight = append(inflight, c)
		case len(inflight) > 0:
			j := rapid.IntRange(0, len(inflight)-1).Draw(t, "deliver")
			c := inflight[j]
			inflight = append(inflight[:j], inflight[j+1:]...)
			verdict := fence.Expired.String()
			if rapid.IntRange(0, 5).Draw(t, "lost") != 0 {
				var v fence.Verdict
				v, marks[c.dev] = fence.Admit(marks[c.dev], fence.Token(c.e.Token), c.e.Seq)
				verdict = v.String()
			}
			if rapid.IntRange(0, 7).Draw(t, "unfinished") == 0 {
				continue // decided, but the agent never recorded the fate
			}
			c.e.Op, c.e.Verdict = history.OpTerminal, verdict
			rec(c.e)
		}
	}
	return out
}

// checkTimeout bounds one linearizability check. A check the bound cuts
// short (porcupine.Unknown: the machine was slow, or the search big) proves
// nothing either way and is counted, not failed; a property fails only on
// a decided wrong answer, or when no case at all was decided.
const checkTimeout = 10 * time.Second

// decided counts the cases whose check ended within checkTimeout.
type decided struct{ yes, unknown int }

func (d *decided) require(t *testing.T) {
	t.Logf("%d cases decided, %d cut short by the %v bound", d.yes, d.unknown, checkTimeout)
	if d.yes == 0 && d.unknown > 0 {
		t.Fatalf("no case decided within %v", checkTimeout)
	}
}

func TestHonestHistoriesAreLinearizable(t *testing.T) {
	var d decided
	rapid.Check(t, func(t *rapid.T) {
		h := simulate(t)
		res, err := linear.Check(h, checkTimeout)
		switch {
		case errors.Is(err, linear.ErrNoOperations):
			return
		case err == nil && res == porcupine.Unknown:
			d.unknown++
			return
		case err != nil || res != porcupine.Ok:
			t.Fatalf("honest history: %v %v\n%v", res, err, h)
		}
		d.yes++
	})
	d.require(t)
}

// TestStaleAcceptIsNotLinearizable: after everything else, a command with a
// token below one accepted earlier is acked accepted.
func TestStaleAcceptIsNotLinearizable(t *testing.T) {
	var d decided
	defer d.require(t)
	rapid.Check(t, func(t *rapid.T) {
		h := simulate(t)
		var hi history.Event
		for _, e := range h {
			if e.Op == history.OpTerminal && e.Verdict == "accepted" && e.Token > hi.Token {
				hi = e
			}
		}
		if hi.Token == 0 {
			return
		}
		end := h[len(h)-1].Time
		bad := history.Event{Op: history.OpCreated, Device: hi.Device, ID: "injected", Token: hi.Token - 1, Seq: 1,
			Time: end.Add(time.Millisecond)}
		h = append(h, bad)
		bad.Op, bad.Verdict, bad.Time = history.OpTerminal, "accepted", end.Add(2*time.Millisecond)
		h = append(h, bad)
		res, err := linear.Check(h, checkTimeout)
		switch {
		case err == nil && res == porcupine.Unknown:
			d.unknown++
		case err != nil || res != porcupine.Illegal:
			t.Fatalf("stale accept of %d after %d: %v %v", bad.Token, hi.Token, res, err)
		default:
			d.yes++
		}
	})
}

func TestNoOperations(t *testing.T) {
	if _, err := linear.Check([]history.Event{{Op: history.OpVerdict}}, 0); !errors.Is(err, linear.ErrNoOperations) {
		t.Fatal(err)
	}
}
