package sim_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/shadow"
)

// twinBody encodes a twin delta as the agent's reconciler does.
func twinBody(tb testing.TB, delta map[string]any) map[string]any {
	tb.Helper()
	b, err := shadow.EncodeCBOR(delta, shadow.Limits{})
	if err != nil {
		tb.Fatal(err)
	}
	var m map[string]any
	if err := fence.DecodeBody(b, &m); err != nil {
		tb.Fatal(err)
	}
	return m
}

func TestTwinSet(t *testing.T) {
	h := openHost(t, filepath.Join(t.TempDir(), "dev.db"), sim.HostConfig{})
	// Whole numbers travel as CBOR integers (shadow.EncodeCBOR): the
	// setpoint still decodes.
	body := twinBody(t, map[string]any{"setpoint": 21.0, "mode": "heat"})
	out := h.Handle("dev-1", cmd(t, "dev-1", 5, 1, sim.KindTwinSet, body))
	if out.Ack.Verdict != fence.Accepted || !out.Applied {
		t.Fatalf("twin.set: %+v", out.Ack)
	}
	if st := state(t, h, "dev-1"); st.Setpoint != 21 || st.Mode != "heat" || st.Applied != 1 {
		t.Fatalf("state %+v", st)
	}
	out = h.Handle("dev-1", cmd(t, "dev-1", 5, 2, sim.KindTwinSet, twinBody(t, map[string]any{"setpoint": 19.5, "relay": true})))
	if out.Ack.Verdict != fence.Accepted {
		t.Fatalf("twin.set: %+v", out.Ack)
	}
	if st := state(t, h, "dev-1"); st.Setpoint != 19.5 || st.Mode != "heat" || !st.Relay {
		t.Fatalf("state %+v", st)
	}

	for _, tc := range []struct {
		name   string
		body   any
		reason string
	}{
		{"unknown field", map[string]any{"setpoint": 20, "fan": "high"}, `unknown field "fan"`},
		{"wrong type", map[string]any{"mode": 3}, "twin.set body"},
		{"bad mode", map[string]any{"mode": "turbo"}, `mode "turbo"`},
		{"setpoint out of range", map[string]any{"setpoint": 500}, "outside"},
		{"empty", map[string]any{}, "changes nothing"},
		{"not a map", []any{1, 2}, "not a map"},
		{"no body", nil, "needs a body"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := state(t, h, "dev-1")
			out := h.Handle("dev-1", cmd(t, "dev-1", 5, 3, sim.KindTwinSet, tc.body))
			if out.Ack.Verdict != fence.Invalid || out.Applied || !strings.Contains(out.Ack.Reason, tc.reason) {
				t.Fatalf("want Invalid with %q, got %+v", tc.reason, out.Ack)
			}
			if after := state(t, h, "dev-1"); after != before {
				t.Fatalf("state changed: %+v → %+v", before, after)
			}
		})
	}
}

// A set command with a field a thermostat does not have is refused naming
// the field and the ones it has (not "cbor: found unknown field at map
// element index 0").
func TestSetNamesUnknownField(t *testing.T) {
	h := openHost(t, filepath.Join(t.TempDir(), "dev.db"), sim.HostConfig{})
	for i, tc := range []struct {
		body  map[string]any
		field string
	}{
		{map[string]any{"foo": 1}, "foo"},
		{map[string]any{"mode": "heat", "setpoint": 21.0, "zzz": true}, "zzz"},
	} {
		out := h.Handle("dev-1", cmd(t, "dev-1", 5, uint64(i+1), sim.KindSet, tc.body))
		if out.Ack.Verdict != fence.Invalid || out.Applied || !strings.Contains(out.Ack.Reason, `unknown field "`+tc.field+`"`) ||
			strings.Contains(out.Ack.Reason, "index") || !strings.Contains(out.Ack.Reason, `"setpoint" "mode" "relay"`) {
			t.Fatalf("set %v: %+v, want Invalid naming %q and a thermostat's fields", tc.body, out.Ack, tc.field)
		}
	}
}
