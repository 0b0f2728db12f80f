//go:build edgefence_unsafe

package main

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/history"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// TestDevsimUnsafeNoFence: a test build's --unsafe-no-fence runs unfenced
// devices (sim.DeviceUnfenced): a stale command is applied, and the ack,
// the verdict log and the history show it.
func TestDevsimUnsafeNoFence(t *testing.T) {
	url := startBroker(t)
	topics := mqtt.Topics{}
	k := sandbox.NewCommander(t, url, topics)
	tmp := t.TempDir()
	vpath, hpath := filepath.Join(tmp, "v.jsonl"), filepath.Join(tmp, "h.jsonl")
	d := startDevsim(t, "--mqtt", url, "--devices", "boiler", "--dir", t.TempDir(), "--unsafe-no-fence", "--log", vpath, "--history", hpath)
	d.awaitReady(t)
	k.Send(t, "boiler", 5, 1, sim.SetBody{Mode: ptr("cool")})
	if a := k.Send(t, "boiler", 4, 1, sim.SetBody{Mode: ptr("heat")}); a.Verdict != fence.Accepted || !strings.Contains(a.Reason, "FENCE DISABLED") {
		t.Fatalf("unfenced stale: %+v", a)
	}
	d.stop(t, syscall.SIGTERM)

	recs := readVerdictLog(t, vpath)
	if n := len(recs); n != 2 || recs[1].Token != 4 || recs[1].Verdict != fence.Accepted || recs[1].State == nil || recs[1].State.Mode != "heat" {
		t.Fatalf("verdict log %+v: want the stale command applied, mode heat", recs)
	}
	evs, err := history.Read(hpath)
	if err != nil {
		t.Fatal(err)
	}
	if r := history.Check(evs); len(r.Violations) != 1 || r.Violations[0].ID != recs[1].ID || r.Violations[0].Invariant != history.InvariantOrder {
		t.Fatalf("history check:\n%s", r)
	}
}
