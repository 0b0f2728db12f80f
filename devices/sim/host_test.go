package sim_test

import (
	"bytes"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fxamacker/cbor/v2"
	"go.uber.org/goleak"

	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func ptr[T any](v T) *T { return &v }

// cmd encodes a command envelope.
func cmd(tb testing.TB, dev string, token fence.Token, seq uint64, kind string, body any) []byte {
	tb.Helper()
	e := &fence.Envelope{V: fence.Version, Device: dev, Token: token, Seq: seq,
		ID: fmt.Sprintf("%s-%d-%d", dev, token, seq), Kind: kind, Holder: fmt.Sprintf("gw-%d", token)}
	if body != nil {
		b, err := fence.EncodeBody(body)
		if err != nil {
			tb.Fatal(err)
		}
		e.Body = b
	}
	raw, err := fence.MarshalEnvelope(e)
	if err != nil {
		tb.Fatal(err)
	}
	return raw
}

// rawEnvelope builds an envelope by hand, bypassing validation, to make the
// malformed ones a fence point must refuse.
func rawEnvelope(tb testing.TB, fields map[int]any) []byte {
	tb.Helper()
	b, err := cbor.Marshal(fields)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

func openHost(tb testing.TB, path string, cfg sim.HostConfig) *sim.Host {
	tb.Helper()
	h, err := sim.OpenHost(path, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { h.Close() })
	return h
}

func state(tb testing.TB, h interface {
	State(string) (sim.State, error)
}, dev string) sim.State {
	tb.Helper()
	s, err := h.State(dev)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// badCommands are inputs a device must refuse as Invalid without changing
// anything, addressed to dev-1.
func badCommands(tb testing.TB) []struct {
	name string
	raw  []byte
} {
	hugeBody := map[string]int{}
	for i := range 300 {
		hugeBody[fmt.Sprintf("k%03d", i)] = i
	}
	hugeRaw, _ := cbor.Marshal(hugeBody)
	envWith := func(body any) map[int]any {
		m := map[int]any{1: 1, 2: "dev-1", 3: 500, 4: 1, 5: "bad-1", 6: "set"}
		if body != nil {
			b, _ := cbor.Marshal(body)
			m[7] = cbor.RawMessage(b)
		}
		return m
	}
	good := cmd(tb, "dev-1", 500, 1, "set", sim.SetBody{Setpoint: ptr(25.0)})
	return []struct {
		name string
		raw  []byte
	}{
		{"envelope for another device", cmd(tb, "dev-2", 500, 1, "set", sim.SetBody{Setpoint: ptr(25.0)})},
		{"garbage", []byte("\x00\x01 definitely not CBOR \xff")},
		{"empty", nil},
		{"truncated", good[:len(good)-4]},
		{"trailing bytes", append(append([]byte{}, good...), 0x00)},
		{"huge map envelope", hugeRaw},
		{"huge map body", rawEnvelope(tb, envWith(hugeBody))},
		{"oversized", bytes.Repeat([]byte{0x41}, fence.MaxEnvelopeSize+1)},
		{"wrong type token", rawEnvelope(tb, map[int]any{1: 1, 2: "dev-1", 3: "five hundred", 4: 1, 5: "bad-1", 6: "set"})},
		{"token zero", rawEnvelope(tb, map[int]any{1: 1, 2: "dev-1", 3: 0, 4: 1, 5: "bad-1", 6: "ping"})},
		{"unknown envelope field", rawEnvelope(tb, map[int]any{1: 1, 2: "dev-1", 3: 500, 4: 1, 5: "bad-1", 6: "ping", 12: "x"})},
		{"set wrong type setpoint", rawEnvelope(tb, envWith(map[string]any{"setpoint": "hot"}))},
		{"set wrong type relay", rawEnvelope(tb, envWith(map[string]any{"relay": 1}))},
		{"set unknown field", rawEnvelope(tb, envWith(map[string]any{"setpoint": 21.0, "fan": "high"}))},
		{"set bad mode", cmd(tb, "dev-1", 500, 1, "set", sim.SetBody{Mode: ptr("turbo")})},
		{"set setpoint out of range", cmd(tb, "dev-1", 500, 1, "set", sim.SetBody{Setpoint: ptr(1e6)})},
		{"set setpoint NaN", cmd(tb, "dev-1", 500, 1, "set", map[string]float64{"setpoint": math.NaN()})},
		{"set nothing", cmd(tb, "dev-1", 500, 1, "set", map[string]any{})},
		{"set no body", cmd(tb, "dev-1", 500, 1, "set", nil)},
		{"set body not a map", cmd(tb, "dev-1", 500, 1, "set", []int{1, 2})},
		{"ping with body", cmd(tb, "dev-1", 500, 1, "ping", map[string]int{"x": 1})},
		{"unknown kind", cmd(tb, "dev-1", 500, 1, "reboot", nil)},
	}
}

func TestHostCommands(t *testing.T) {
	var log bytes.Buffer
	now := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	h := openHost(t, filepath.Join(t.TempDir(), "devsim.db"), sim.HostConfig{VerdictLog: &log, Now: func() time.Time { return now }})

	if s := state(t, h, "dev-1"); s != sim.InitialState() {
		t.Fatalf("initial state %+v", s)
	}
	steps := []struct {
		raw  []byte
		want fence.Verdict
	}{
		{cmd(t, "dev-1", 7, 1, "set", sim.SetBody{Setpoint: ptr(22.5), Mode: ptr("heat")}), fence.Accepted},
		{cmd(t, "dev-1", 7, 2, "set", map[string]any{"relay": true, "setpoint": 23}), fence.Accepted}, // integer setpoint
		{cmd(t, "dev-1", 7, 3, "ping", nil), fence.Accepted},
		{cmd(t, "dev-1", 7, 2, "set", map[string]any{"relay": true, "setpoint": 23}), fence.Duplicate},
		{cmd(t, "dev-1", 6, 9, "set", sim.SetBody{Mode: ptr("cool")}), fence.Stale},
		{cmd(t, "dev-1", 8, 1, "set", sim.SetBody{Mode: ptr("auto"), Relay: ptr(false)}), fence.Accepted},
	}
	for i, st := range steps {
		if out := h.Handle("dev-1", st.raw); out.Ack.Verdict != st.want {
			t.Fatalf("step %d: %v (%s), want %v", i, out.Ack.Verdict, out.Ack.Reason, st.want)
		}
	}
	want := sim.State{Setpoint: 23, Mode: "auto", Relay: false, Applied: 4, LastToken: 8, LastSeq: 1, LastID: "dev-1-8-1"}
	if s := state(t, h, "dev-1"); s != want {
		t.Fatalf("state %+v, want %+v", s, want)
	}

	recs, err := sim.ReadVerdictLog(&log)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != len(steps) {
		t.Fatalf("%d verdict log lines, want %d", len(recs), len(steps))
	}
	r := recs[4] // the stale one
	if r.Verdict != fence.Stale || r.Token != 6 || r.Seq != 9 || r.ID != "dev-1-6-9" || r.Kind != "set" || r.Holder != "gw-6" ||
		r.Device != "dev-1" || r.Mark() != (fence.Mark{Token: 7, Seq: 3}) || !strings.Contains(r.Reason, "below") ||
		r.State == nil || r.State.Mode != "heat" || !r.Time.Equal(now) {
		t.Fatalf("stale record %+v", r)
	}
	if last := recs[len(recs)-1]; last.State == nil || *last.State != want {
		t.Fatalf("last record state %+v", last.State)
	}
}

func TestHostBadInput(t *testing.T) {
	var log bytes.Buffer
	h := openHost(t, filepath.Join(t.TempDir(), "devsim.db"), sim.HostConfig{VerdictLog: &log})
	if out := h.Handle("dev-1", cmd(t, "dev-1", 400, 1, "set", sim.SetBody{Setpoint: ptr(19.0)})); out.Ack.Verdict != fence.Accepted {
		t.Fatal(out.Ack)
	}
	before := state(t, h, "dev-1")
	bad := badCommands(t)
	for _, c := range bad {
		t.Run(c.name, func(t *testing.T) {
			out := h.Handle("dev-1", c.raw)
			if out.Ack.Verdict != fence.Invalid || out.Ack.Device != "dev-1" || out.Ack.Reason == "" || out.Applied {
				t.Fatalf("ack %+v", out.Ack)
			}
			if _, err := fence.MarshalAck(&out.Ack); err != nil {
				t.Fatal(err)
			}
			if s := state(t, h, "dev-1"); s != before {
				t.Fatalf("state changed: %+v → %+v", before, s)
			}
			if m, _ := h.Mark("dev-1"); m != (fence.Mark{Token: 400, Seq: 1}) {
				t.Fatalf("mark moved to %v", m)
			}
			t.Logf("reason: %s", out.Ack.Reason)
		})
	}
	if st := h.Stats(); st.Invalid != uint64(len(bad)) || st.Accepted != 1 {
		t.Fatalf("stats %+v", st)
	}
	recs, err := sim.ReadVerdictLog(&log)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1+len(bad) {
		t.Fatalf("%d records", len(recs))
	}
	for _, r := range recs[1:] {
		if r.Verdict != fence.Invalid || r.Device != "dev-1" || r.State == nil || *r.State != before {
			t.Fatalf("record %+v", r)
		}
	}
	if out := h.Handle("dev/1", cmd(t, "dev-1", 401, 1, "ping", nil)); out.Ack.Verdict != fence.Invalid || out.Ack.Device != "" || out.Record.State != nil {
		t.Fatalf("bad addressed device: %+v", out)
	}
}

func TestHostRestartResumes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "devsim.db")
	h, err := sim.OpenHost(path, sim.HostConfig{})
	if err != nil {
		t.Fatal(err)
	}
	h.Handle("dev-1", cmd(t, "dev-1", 10, 1, "set", sim.SetBody{Setpoint: ptr(30.0)}))
	h.Handle("dev-1", cmd(t, "dev-1", 11, 1, "set", sim.SetBody{Mode: ptr("cool")}))
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	h = openHost(t, path, sim.HostConfig{})
	want := sim.State{Setpoint: 30, Mode: "cool", Applied: 2, LastToken: 11, LastSeq: 1, LastID: "dev-1-11-1"}
	if s := state(t, h, "dev-1"); s != want {
		t.Fatalf("after restart %+v", s)
	}
	if out := h.Handle("dev-1", cmd(t, "dev-1", 10, 2, "set", sim.SetBody{Mode: ptr("heat")})); out.Ack.Verdict != fence.Stale {
		t.Fatalf("stale after restart: %+v", out.Ack)
	}
	if s := state(t, h, "dev-1"); s != want {
		t.Fatalf("stale command changed state: %+v", s)
	}
}

// frozenHolder is the schedule of the fencing-token argument: holder A
// (token 10) sets heat, pauses; B (token 11) takes over and sets cool;
// A wakes and, still believing it holds the lease, sets heat at 30°.
func frozenHolder(tb testing.TB, dev string) [][]byte {
	return [][]byte{
		cmd(tb, dev, 10, 1, "set", sim.SetBody{Mode: ptr("heat"), Setpoint: ptr(21.0)}),
		cmd(tb, dev, 11, 1, "set", sim.SetBody{Mode: ptr("cool"), Setpoint: ptr(18.0)}),
		cmd(tb, dev, 10, 2, "set", sim.SetBody{Mode: ptr("heat"), Setpoint: ptr(30.0), Relay: ptr(true)}),
	}
}

// TestHostFrozenHolderFenced: behind the fence the new holder's state
// stands (the unfenced kind, in test builds, loses it: unfenced_test.go).
func TestHostFrozenHolderFenced(t *testing.T) {
	h := openHost(t, filepath.Join(t.TempDir(), "devsim.db"), sim.HostConfig{})
	var vs []fence.Verdict
	for _, raw := range frozenHolder(t, "dev-1") {
		vs = append(vs, h.Handle("dev-1", raw).Ack.Verdict)
	}
	if s := state(t, h, "dev-1"); fmt.Sprint(vs) != "[accepted accepted stale]" || s.Mode != "cool" || s.Setpoint != 18 || s.Relay {
		t.Fatalf("%v %+v", vs, s)
	}
}

func TestReadVerdictLogErrors(t *testing.T) {
	if _, err := sim.ReadVerdictLog(strings.NewReader("{\"device\":\"d\",\"verdict\":\"accepted\"}\n\n{\"device\":")); err == nil ||
		!strings.Contains(err.Error(), "line 3") {
		t.Fatalf("truncated log: %v", err)
	}
	if _, err := sim.ReadVerdictLog(strings.NewReader(`{"verdict":"maybe"}`)); err == nil {
		t.Fatal("unknown verdict parsed")
	}
}

func TestStateCodec(t *testing.T) {
	s := sim.State{Setpoint: 21.5, Mode: "auto", Relay: true, Applied: 3, LastToken: 9, LastSeq: 2, LastID: "x"}
	b, err := sim.MarshalState(s)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := cbor.Unmarshal(b, &m); err != nil || m["mode"] != "auto" || m["relay"] != true {
		t.Fatalf("state is not a text-keyed map: %v %v", m, err)
	}
	got, err := sim.UnmarshalState(b)
	if err != nil || got != s {
		t.Fatalf("%+v %v", got, err)
	}
}
