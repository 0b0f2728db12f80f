package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgefence/edgefence/agent"
)

// TestMQTTReconnectCeiling: mqtt.reconnect_backoff_max reaches the agent's
// MQTT client — status shows it, the log line of the lost connection names
// it — and across a broker outage a command sent meanwhile waits in the
// outbox and is accepted once the broker is back.
func TestMQTTReconnectCeiling(t *testing.T) {
	e := newEnv(t, "dev-1")
	c := e.world.AgentConfig("gw-1", e.dir, e.devices)
	c.LogFormat = "json"
	c.MQTTReconnectMax = time.Second
	cfg := filepath.Join(e.dir, "gw-1.yaml")
	if err := c.Write(cfg); err != nil {
		t.Fatal(err)
	}
	p := e.startAgent("gw-1", cfg)
	st := e.waitHolding(p, c.Socket)
	if got := st.Transport["reconnect_backoff_max"]; got != "1s" {
		t.Fatalf("status transport reconnect_backoff_max = %v, want 1s; transport %v", got, st.Transport)
	}

	connected := func() bool {
		st, r := status(t, c.Socket)
		if st == nil {
			t.Fatalf("status: %s", r)
		}
		return st.Transport["connected"] == true
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(60 * time.Second); !cond(); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 60s", what)
			}
		}
	}
	if err := e.world.Broker.Stop(); err != nil {
		t.Fatal(err)
	}
	waitFor("the agent sees the broker gone", func() bool { return !connected() })
	r := edgefence(t, "send", "--json", "--socket", c.Socket, "--no-wait", "dev-1", "set", `{"setpoint": 21}`)
	var res agent.SendResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || r.code != exitQueued || res.ID == "" {
		t.Fatalf("send during the outage: want queued (exit %d)\n%s", exitQueued, r)
	}
	// Long enough for an uncapped backoff to grow well past the ceiling
	// (250ms doubling: 0.5, 1, 2, 4 s).
	time.Sleep(5 * time.Second)
	if err := e.world.Broker.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	waitFor("the agent reconnects", connected)
	t.Logf("reconnected %v after the broker came back (ceiling 1s)", time.Since(back).Round(time.Millisecond))
	waitFor("the queued command is accepted", func() bool {
		r := edgefence(t, "outbox", "show", "--socket", c.Socket, res.ID)
		return r.code == 0 && strings.Contains(r.stdout, "state     accepted")
	})

	log, err := os.ReadFile(filepath.Join(e.dir, "gw-1.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), `"msg":"mqtt connection lost; reconnecting"`) || !strings.Contains(string(log), `"backoff_max":"1s"`) {
		t.Errorf("no lost-connection line naming the ceiling in the agent's log:\n%s", log)
	}
}
