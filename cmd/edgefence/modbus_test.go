package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/internal/modbustest"
	"github.com/edgefence/edgefence/shadow"
)

// A home gateway of a Modbus device: `edgefence run` with a modbus bus and
// a device profile, the slave pymodbus on 127.0.0.1. A profile command
// through `edgefence send` reaches the slave (mbpoll reads it back); a
// kind the profile does not have is refused before the bus; `edgefence
// devices` shows the device's bus, unit, profile and last poll.
func TestHomeGatewayModbus(t *testing.T) {
	modbustest.Require(t)
	slave := modbustest.StartTCP(t, modbustest.Options{Units: []byte{3}})
	e := newEnv(t, "dev-1")
	cfg, sock := e.config("gw-1", 10*time.Second)
	prof, err := filepath.Abs(filepath.Join("..", "..", "configs", "profiles", "hvac-controller.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(cfg, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("  - id: tc-1\n    fence: gateway\n    home: gw-1\n    auth: off\n    modbus: {bus: plc-net, unit: 3, profile: acme-tc20}\n" +
		"modbus:\n  profiles: [" + prof + "]\n  buses:\n    - name: plc-net\n      tcp: " + slave.Addr() + "\ntwins:\n  enabled: true\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if r := edgefence(t, "config", "check", cfg); r.code != 0 {
		t.Fatalf("config check: %s", r)
	}
	p := e.startAgent("gw-1", cfg)
	e.devices = append(e.devices, "tc-1")
	e.waitHolding(p, sock)
	if err := p.WaitLine(t.Context(), "bridge ready"); err != nil {
		t.Fatal(err)
	}
	r := edgefence(t, "send", "--json", "--socket", sock, "tc-1", "set_mode", `{"value": "cool"}`)
	if res := sendResult(t, r); r.code != 0 || res.Verdict != "accepted" {
		t.Fatalf("set_mode: %+v\n%s", res, r)
	}
	if v := modbustest.MbpollRead(t, slave.TCPTarget(), 3, modbustest.HoldingRegisters, 1, 1); v[0] != 2 {
		t.Fatalf("mode register %d, want 2 (cool)", v[0])
	}
	r = edgefence(t, "send", "--json", "--socket", sock, "tc-1", "write_register", `{"addr": 1, "value": 4}`)
	if res := sendResult(t, r); r.code != 3 || res.Verdict != "invalid" {
		t.Fatalf("raw kind on a profiled device: %+v\n%s", res, r)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		r = edgefence(t, "devices", "--socket", sock)
		if strings.Contains(r.stdout, "MODBUS DEVICE") && strings.Contains(r.stdout, "acme-tc20") && strings.Contains(r.stdout, " ago") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("devices shows no polled Modbus device:\n%s", r)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !strings.Contains(r.stdout, "plc-net") || !strings.Contains(r.stdout, slave.Addr()) {
		t.Fatalf("devices: no bus row:\n%s", r)
	}

	// The twin, both ways: a desired setpoint reaches the register through
	// the fenced path (twin.set, planned by the profile), and the polled
	// fields land in reported, written by the holder under its token.
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	app := shadow.NewStore(e.etcd, shadow.StoreConfig{Prefix: agent.DefaultEtcdPrefix, Writer: "app"})
	if _, err := app.UpdateDesired(ctx, "tc-1", map[string]any{"setpoint": 19.5}, 0); err != nil {
		t.Fatal(err)
	}
	for {
		if v := modbustest.MbpollRead(t, slave.TCPTarget(), 3, modbustest.HoldingRegisters, 0, 1); v[0] == 195 {
			break
		}
		if ctx.Err() != nil {
			r := edgefence(t, "twin", "get", "--config", cfg, "tc-1")
			t.Fatalf("the desired setpoint did not reach the register:\n%s", r)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for {
		rep, err := app.GetReported(ctx, "tc-1")
		// pymodbus starts input register 0 of unit 3 at 3<<8 = 768: 76.8 °C.
		if err == nil && rep.Fields["room_temperature"] == 76.8 && rep.Fields["setpoint"] == 19.5 {
			break
		}
		if ctx.Err() != nil {
			r := edgefence(t, "twin", "get", "--config", cfg, "tc-1")
			t.Logf("twin get: %s", r)
			t.Fatalf("reported %+v, %v: want the polled room_temperature 76.8 and setpoint 19.5", rep, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
