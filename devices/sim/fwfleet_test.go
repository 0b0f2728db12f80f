package sim_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/history"
	"github.com/edgefence/edgefence/transport/mqtt"
)

func TestStartFirmwareFleetConfigErrors(t *testing.T) {
	dir := t.TempDir()
	dev := sim.FirmwareConfig{Broker: "mqtt://127.0.0.1:1"}
	for name, cfg := range map[string]sim.FirmwareFleetConfig{
		"no devices":   {Dir: dir, Device: dev},
		"bad id":       {Devices: []string{"a/b"}, Dir: dir, Device: dev},
		"listed twice": {Devices: []string{"a", "a"}, Dir: dir, Device: dev},
		"no dir":       {Devices: []string{"a"}, Device: dev},
		"no broker":    {Devices: []string{"a"}, Dir: dir},
		"history":      {Devices: []string{"a"}, Dir: dir, Device: dev, HistoryPath: filepath.Join(dir, "none", "h.jsonl")},
	} {
		if f, err := sim.StartFirmwareFleet(cfg); err == nil {
			f.Close(context.Background())
			t.Errorf("%s: StartFirmwareFleet(%+v) succeeded", name, cfg)
		}
	}
}

// TestFirmwareFleet runs three firmware devices in this process: each
// boots, reports and takes commands on its own topic; a device whose
// directory cannot be made fails AwaitReady with the reason and is tried
// again; Close stops every goroutine (goleak in TestMain) and the history
// names each device's source.
func TestFirmwareFleet(t *testing.T) {
	url, dir := startBroker(t), t.TempDir()
	hpath := filepath.Join(dir, "h.jsonl")
	if err := os.WriteFile(filepath.Join(dir, "fw-bad"), nil, 0o600); err != nil { // a file where its directory goes
		t.Fatal(err)
	}
	a := newAgentClient(t, url, mqtt.Topics{})
	f, err := sim.StartFirmwareFleet(sim.FirmwareFleetConfig{Devices: []string{"fw-1", "fw-2", "fw-bad"}, Dir: dir,
		HistoryPath: hpath, HistorySource: "fleet", RestartDelay: 10 * time.Millisecond, Device: sim.FirmwareConfig{Broker: url}})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := f.AwaitReady(ctx); err == nil || ctx.Err() != nil {
		t.Fatalf("AwaitReady with fw-bad's directory a file: %v", err)
	}
	if err := os.Remove(filepath.Join(dir, "fw-bad")); err != nil {
		t.Fatal(err)
	}
	if err := f.AwaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	for i, dev := range []string{"fw-1", "fw-2", "fw-bad"} {
		if m := a.send(t, dev, cmd(t, dev, fence.Token(10+i), 1, sim.KindSet, sim.SetBody{Setpoint: ptr(19.5)}), ""); m.ack.Verdict != fence.Accepted {
			t.Fatalf("%s: %+v", dev, m.ack)
		}
	}
	if err := f.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if st := f.Stats(); st.Accepted != 3 || st.Restarts == 0 || st.Reboots != 0 {
		t.Fatalf("stats %+v", st)
	}
	evs, err := history.Read(hpath)
	if err != nil {
		t.Fatal(err)
	}
	if r := history.Check(evs); !r.OK() || len(evs) != 3 {
		t.Fatalf("history %+v:\n%s", evs, r)
	}
	for _, e := range evs {
		if e.Source != "fleet:"+e.Device {
			t.Fatalf("event of %s under source %s", e.Device, e.Source)
		}
	}
}
