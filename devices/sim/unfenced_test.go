//go:build edgefence_unsafe

package sim_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/history"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// TestHostUnfencedCorrupts: the frozen-holder schedule on a fenced and an
// unfenced thermostat. Only the fence keeps the new holder's state; the
// unfenced device acks everything, says so in the ack, and its mark still
// only rises.
func TestHostUnfencedCorrupts(t *testing.T) {
	run := func(kind sim.DeviceKind) (*sim.Host, sim.State, []fence.Ack) {
		h := openHost(t, filepath.Join(t.TempDir(), "devsim.db"), sim.HostConfig{Kind: kind})
		var acks []fence.Ack
		for _, raw := range frozenHolder(t, "dev-1") {
			acks = append(acks, h.Handle("dev-1", raw).Ack)
		}
		return h, state(t, h, "dev-1"), acks
	}
	verdicts := func(acks []fence.Ack) string {
		var vs []fence.Verdict
		for _, a := range acks {
			vs = append(vs, a.Verdict)
		}
		return fmt.Sprint(vs)
	}
	_, fenced, acks := run(sim.DeviceThermostat)
	if verdicts(acks) != "[accepted accepted stale]" || fenced.Mode != "cool" || fenced.Setpoint != 18 || fenced.Relay {
		t.Fatalf("fenced: %v %+v", acks, fenced)
	}
	h, unfenced, acks := run(sim.DeviceUnfenced)
	if verdicts(acks) != "[accepted accepted accepted]" || unfenced.Mode != "heat" || unfenced.Setpoint != 30 || !unfenced.Relay || unfenced.Applied != 3 {
		t.Fatalf("unfenced: %v %+v", acks, unfenced)
	}
	if acks[1].Reason != "" || !strings.HasPrefix(acks[2].Reason, "FENCE DISABLED") || acks[2].Mark() != (fence.Mark{Token: 11, Seq: 1}) {
		t.Fatalf("unfenced acks %+v: want the stale one flagged, the mark at 11/1", acks)
	}
	if m, err := h.Mark("dev-1"); err != nil || m != (fence.Mark{Token: 11, Seq: 1}) {
		t.Fatalf("unfenced mark %v %v: it must still only rise", m, err)
	}
	if st := h.Stats(); st.Accepted != 3 || st.Stale != 0 || st.Invalid != 0 {
		t.Fatalf("unfenced stats %+v", st)
	}
	// A duplicate is applied again; bad input is still refused.
	if o := h.Handle("dev-1", frozenHolder(t, "dev-1")[1]); !o.Applied || !strings.Contains(o.Ack.Reason, "duplicate") {
		t.Fatalf("duplicate: %+v", o)
	}
	if o := h.Handle("dev-1", cmd(t, "dev-1", 12, 1, "set", sim.SetBody{Mode: ptr("warm")})); o.Applied || o.Ack.Verdict != fence.Invalid {
		t.Fatalf("bad mode: %+v", o)
	}
	t.Logf("fenced: the new holder's %s/%v stands; unfenced: the paused holder overwrote it with %s/%v",
		fenced.Mode, fenced.Setpoint, unfenced.Mode, unfenced.Setpoint)
}

// TestHostUnfencedHistory: the unfenced device's history shows the stale
// and the duplicate command it applied, and the checker finds them.
func TestHostUnfencedHistory(t *testing.T) {
	dir := t.TempDir()
	hpath := filepath.Join(dir, "history.jsonl")
	w, err := history.Create(hpath, "devsim")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	h := openHost(t, filepath.Join(dir, "devsim.db"), sim.HostConfig{Kind: sim.DeviceUnfenced, History: w})
	for _, c := range []struct {
		tok fence.Token
		seq uint64
	}{{10, 1}, {11, 1}, {10, 2}, {11, 1}} {
		h.Handle("dev-1", cmd(t, "dev-1", c.tok, c.seq, "ping", nil))
	}
	evs, err := history.Read(hpath)
	if err != nil {
		t.Fatal(err)
	}
	r := history.Check(evs)
	if len(r.Violations) != 2 || r.Violations[0].ID != "dev-1-10-2" || r.Violations[1].ID != "dev-1-11-1" {
		t.Fatalf("check:\n%s", r)
	}
}

// TestFleetUnfenced runs the frozen-holder schedule over MQTT against a
// fenced and an unfenced fleet: only the fence keeps the new holder's state.
func TestFleetUnfenced(t *testing.T) {
	url := startBroker(t)
	topics := mqtt.Topics{}
	a := newAgentClient(t, url, topics)
	run := func(dev string, kind sim.DeviceKind) (sim.State, []fence.Verdict) {
		f := startFleet(t, sim.FleetConfig{Devices: []string{dev}, DataDir: t.TempDir(), Broker: url,
			ClientID: "fleet-" + dev, Kind: kind})
		var vs []fence.Verdict
		for _, raw := range frozenHolder(t, dev) {
			vs = append(vs, a.send(t, dev, raw, "").ack.Verdict)
		}
		return state(t, f, dev), vs
	}
	fenced, vs := run("fenced-1", "")
	if fmt.Sprint(vs) != "[accepted accepted stale]" || fenced.Mode != "cool" || fenced.Setpoint != 18 {
		t.Fatalf("fenced: %v %+v", vs, fenced)
	}
	unfenced, vs := run("unfenced-1", sim.DeviceUnfenced)
	if fmt.Sprint(vs) != "[accepted accepted accepted]" || unfenced.Mode != "heat" || unfenced.Setpoint != 30 {
		t.Fatalf("unfenced: %v %+v", vs, unfenced)
	}
}
