package main

import (
	"context"
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/edgefence/edgefence/devices/legacy"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/transport/serial"
)

// A home gateway: `edgefence run` bridges a legacy serial device through its
// fence table; commands through the agent reach the device; `fence list`
// and `fence show` ask the running agent (it holds the table's lock); the
// status shows the bridge's counters.
func TestHomeGatewayBridge(t *testing.T) {
	e := newEnv(t, "dev-1")
	master, slave, err := sandbox.OpenPty()
	if err != nil {
		t.Fatal(err)
	}
	regs := legacy.NewRegisters("plc-1", 8, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = serial.Serve(ctx, master, regs.Handle)
	}()
	t.Cleanup(func() { cancel(); master.Close(); <-done; slave.Close() })

	cfg, sock := e.config("gw-1", 10*time.Second)
	f, err := os.OpenFile(cfg, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("  - id: plc-1\n    fence: gateway\n    home: gw-1\n    auth: off\n    serial:\n      port: " + slave.Name() + "\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	p := e.startAgent("gw-1", cfg)
	e.devices = append(e.devices, "plc-1") // the agent campaigns for it too
	st := e.waitHolding(p, sock)
	if err := p.WaitLine(t.Context(), "bridge ready"); err != nil {
		t.Fatal(err)
	}

	r := edgefence(t, "send", "--json", "--socket", sock, "plc-1", "write_register", `{"addr": 3, "value": 4242}`)
	if res := sendResult(t, r); r.code != 0 || res.Verdict != "accepted" {
		t.Fatalf("write_register: %+v\n%s", res, r)
	}
	if v, _ := regs.Register(3); v != 4242 {
		t.Fatalf("register 3 = %d", v)
	}
	var tok fence.Token
	for _, d := range st.Devices {
		if d.ID == "plc-1" {
			tok = d.Token
		}
	}

	r = edgefence(t, "fence", "list", "--config", cfg, "--json")
	var recs []fence.Record
	if err := json.Unmarshal([]byte(r.stdout), &recs); r.code != 0 || err != nil || len(recs) != 1 ||
		recs[0].Device != "plc-1" || recs[0].Mark != (fence.Mark{Token: tok, Seq: 1}) || recs[0].Holder != "gw-1" {
		t.Fatalf("fence list via the agent: %+v %v\n%s", recs, err, r)
	}
	if r := edgefence(t, "fence", "show", "--config", cfg, "plc-1"); r.code != 0 {
		t.Fatalf("fence show: %s", r)
	}
	if r := edgefence(t, "fence", "show", "--socket", sock, "nope"); r.code == 0 {
		t.Fatalf("fence show of an unknown device succeeded: %s", r)
	}
	st2, _ := status(t, sock)
	b, _ := json.Marshal(st2.Bridge)
	var bs struct {
		Accepted uint64 `json:"accepted"`
	}
	if err := json.Unmarshal(b, &bs); err != nil || bs.Accepted != 1 {
		t.Fatalf("bridge status %s", b)
	}
}
