package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/edgefence/edgefence/agent"
)

// TestAuthPolicyShown: status has an auth line naming the `auth: off`
// devices (the first five), the mqtt line the unsigned sends, and the
// devices table an AUTH column.
func TestAuthPolicyShown(t *testing.T) {
	devs := []agent.DeviceStatus{{ID: "dev-1", State: agent.StateHolding, Auth: agent.AuthRequired}, {ID: "dev-2", State: agent.StateHolding, Auth: agent.AuthOff}}
	st := &agent.Status{Gateway: "gw-1", Devices: devs, Transport: map[string]any{"connected": true, "unsigned": float64(3)}}
	var b bytes.Buffer
	printStatus(&b, st)
	for _, want := range []string{"auth     1 of 2 devices auth: required (signed commands); OFF for dev-2: plain envelopes", "; 3 sends unsigned"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, b.String())
		}
	}
	var many []agent.DeviceStatus
	for _, id := range []string{"a", "b", "c", "d", "e", "f", "g"} {
		many = append(many, agent.DeviceStatus{ID: id, Auth: agent.AuthOff})
	}
	if l := authLine(many); !strings.Contains(l, "0 of 7 devices") || !strings.Contains(l, "OFF for a, b, c, d, e and 2 more:") {
		t.Errorf("auth line of 7 off devices: %s", l)
	}
	if l := authLine(devs[:1]); strings.Contains(l, "OFF") {
		t.Errorf("auth line with every device required: %s", l)
	}
	b.Reset()
	printDevices(&b, devs, time.Now())
	lines := strings.Split(b.String(), "\n")
	if f := strings.Fields(lines[0]); len(f) < 6 || f[5] != "AUTH" {
		t.Fatalf("devices header %q", lines[0])
	}
	for i, want := range []string{"required", "off"} {
		if f := strings.Fields(lines[i+1]); len(f) < 6 || f[5] != want {
			t.Errorf("devices row %q, want AUTH %s", lines[i+1], want)
		}
	}
}
