package history_test

import (
	"strings"
	"testing"

	"github.com/edgefence/edgefence/fence/history"
)

// fw builds the fence and outbox events of one firmware step: created,
// the device's verdict, terminal (i, i+1, i+2 ms after t0).
func fw(i int, gw, dev, id string, tok, seq uint64, kind, job, verdict string) []history.Event {
	evs := []history.Event{
		ev(i, "outbox:"+gw, history.OpCreated, dev, id, tok, seq, ""),
		ev(i+1, "fw:"+dev, history.OpVerdict, dev, id, tok, seq, verdict),
		ev(i+2, "outbox:"+gw, history.OpTerminal, dev, id, tok, seq, verdict),
	}
	for j := range evs {
		evs[j].Kind, evs[j].Job = kind, job
	}
	return evs
}

// fwJob is a clean firmware job at fw-1: gw1 (token 10) begins and sends
// two chunks and is deposed; its third chunk, sent late, is stale; gw2
// (token 20) resumes, installs, activates (the activation redelivered by
// the broker, decided duplicate) and commits.
func fwJob() []history.Event {
	var h []history.Event
	for _, s := range []struct {
		gw, id        string
		tok, seq      uint64
		kind, verdict string
	}{
		{"gw1", "a1", 10, 1, "fw.begin", "accepted"},
		{"gw1", "a2", 10, 2, "fw.chunk", "accepted"},
		{"gw1", "a3", 10, 3, "fw.chunk", "accepted"},
		{"gw2", "b1", 20, 1, "fw.chunk", "accepted"},
		{"gw1", "a4", 10, 4, "fw.chunk", "stale"},
		{"gw2", "b2", 20, 2, "fw.install", "accepted"},
		{"gw2", "b3", 20, 3, "fw.activate", "accepted"},
		{"gw2", "b4", 20, 4, "fw.commit", "accepted"},
	} {
		h = append(h, fw(len(h)+1, s.gw, "fw-1", s.id, s.tok, s.seq, s.kind, "j1", s.verdict)...)
	}
	redelivery := ev(len(h)+1, "fw:fw-1", history.OpVerdict, "fw-1", "b3", 20, 3, "duplicate")
	redelivery.Kind, redelivery.Job = "fw.activate", "j1"
	return append(h, redelivery)
}

func TestCheckFirmwareClean(t *testing.T) {
	r := history.Check(fwJob())
	if !r.OK() {
		t.Fatalf("clean firmware history:\n%s", r)
	}
	fw := r.Firmware
	if fw.Jobs != 1 || fw.Activated != 1 || fw.Accepted["fw.chunk"] != 3 || fw.Accepted["fw.activate"] != 1 {
		t.Fatalf("firmware counts %+v\n%s", fw, r)
	}
	if s := r.String(); !strings.Contains(s, "firmware steps:  fw.activate=1 fw.begin=1 fw.chunk=3") {
		t.Fatalf("String:\n%s", s)
	}
}

// TestCheckFirmwareViolations: the checker fails a firmware history in
// which a job was activated twice at a device, and one in which a
// deposed holder's chunk was accepted.
func TestCheckFirmwareViolations(t *testing.T) {
	t.Run("two activations of one job", func(t *testing.T) {
		h := append(fwJob(), fw(100, "gw2", "fw-1", "b5", 20, 5, "fw.activate", "j1", "accepted")...)
		want(t, history.Check(h), history.InvariantActivation, "b5", `job "j1" activated 2 times: b3 (20/3 by fw:fw-1), b5`)
	})
	t.Run("stale-token chunk accepted", func(t *testing.T) {
		h := fwJob()
		for i := range h {
			if h[i].ID == "a4" {
				h[i].Verdict = "accepted"
			}
		}
		want(t, history.Check(h), history.InvariantOrder, "a4", "stale accept: token 10/4 accepted by fw:fw-1 after token 20/1")
	})
	t.Run("activations of two jobs, or at two devices, are fine", func(t *testing.T) {
		h := append(fwJob(), fw(100, "gw2", "fw-1", "b5", 20, 5, "fw.activate", "j2", "accepted")...)
		h = append(h, fw(200, "gw2", "fw-2", "c1", 21, 1, "fw.activate", "j1", "accepted")...)
		if r := history.Check(h); !r.OK() || r.Firmware.Activated != 3 {
			t.Fatalf("%+v\n%s", r.Firmware, r)
		}
	})
	t.Run("an uncommitted activation does not count", func(t *testing.T) {
		// The device logged an accept of b5 and died before its commit
		// (its reopened fence point found the mark at 20/4); the holder's
		// activation b3 is then the only one.
		h := fwJob()
		late := fw(100, "gw2", "fw-1", "b5", 20, 5, "fw.activate", "j1", "accepted")[1]
		opened := history.Event{Time: late.Time.Add(1), Source: "fw:fw-1", Op: history.OpOpened, Device: "fw-1", Token: 20, Seq: 4}
		h = append(h, late, opened)
		if r := history.Check(h); !r.OK() || r.Uncommitted != 1 || r.Firmware.Activated != 1 {
			t.Fatalf("%+v\n%s", r.Firmware, r)
		}
	})
}
