package sim_test

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// syncBuffer is a verdict log the test can read while the fleet writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) records(tb testing.TB) []sim.VerdictRecord {
	tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	recs, err := sim.ReadVerdictLog(bytes.NewReader(s.b.Bytes()))
	if err != nil {
		tb.Fatal(err)
	}
	return recs
}

func startFleet(tb testing.TB, cfg sim.FleetConfig) *sim.Fleet {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f, err := sim.NewFleet(ctx, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := f.Close(ctx); err != nil {
			tb.Error(err)
		}
	})
	if err := f.AwaitReady(ctx); err != nil {
		tb.Fatal(err)
	}
	return f
}

type ackMsg struct {
	topic string
	ack   fence.Ack
	corr  string
}

type stateMsg struct {
	device string
	state  sim.State
}

// agentClient plays the agent's side: it publishes commands and collects
// acks and states.
type agentClient struct {
	c      *mqtt.Client
	topics mqtt.Topics
	acks   chan ackMsg
	states chan stateMsg
	n      int
}

func newAgentClient(tb testing.TB, url string, topics mqtt.Topics) *agentClient {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := mqtt.Dial(context.Background(), mqtt.Config{Brokers: []string{url},
		ClientID: "agent-" + strings.NewReplacer("/", "-").Replace(tb.Name()), CleanStart: true})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c.Close(ctx)
	})
	a := &agentClient{c: c, topics: topics, acks: make(chan ackMsg, 256), states: make(chan stateMsg, 256)}
	onAck := func(m mqtt.Message) {
		ack, err := fence.UnmarshalAck(m.Payload)
		if err != nil {
			tb.Errorf("undecodable ack on %s: %v", m.Topic, err)
			return
		}
		a.acks <- ackMsg{topic: m.Topic, ack: *ack, corr: string(m.CorrelationData)}
	}
	c.Subscribe(topics.AllAck(), onAck)
	c.Subscribe("reply/#", onAck)
	c.Subscribe(strings.TrimSuffix(topics.State("x"), "x/state")+"+/state", func(m mqtt.Message) {
		dev, _, _ := topics.Parse(m.Topic)
		s, err := sim.UnmarshalState(m.Payload)
		if err != nil {
			tb.Errorf("undecodable state on %s: %v", m.Topic, err)
			return
		}
		a.states <- stateMsg{device: dev, state: s}
	})
	if err := c.AwaitSubscribed(ctx); err != nil {
		tb.Fatal(err)
	}
	return a
}

// send publishes raw on dev's command topic and waits for the ack with the
// same correlation data.
func (a *agentClient) send(tb testing.TB, dev string, raw []byte, responseTopic string) ackMsg {
	tb.Helper()
	a.n++
	corr := fmt.Sprintf("corr-%d", a.n)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.c.Publish(ctx, mqtt.Message{Topic: a.topics.Cmd(dev), Payload: raw,
		CorrelationData: []byte(corr), ResponseTopic: responseTopic}); err != nil {
		tb.Fatal(err)
	}
	for {
		select {
		case m := <-a.acks:
			if m.corr == corr {
				return m
			}
			tb.Logf("ignoring ack %q (waiting for %q)", m.corr, corr)
		case <-ctx.Done():
			tb.Fatalf("no ack for %s", corr)
		}
	}
}

func (a *agentClient) nextState(tb testing.TB) stateMsg {
	tb.Helper()
	select {
	case s := <-a.states:
		return s
	case <-time.After(10 * time.Second):
		tb.Fatal("no state published")
		return stateMsg{}
	}
}

func TestFleetCommands(t *testing.T) {
	url := startBroker(t)
	topics := mqtt.Topics{Prefix: "test/fleet"}
	var vlog syncBuffer
	dir := t.TempDir()
	f := startFleet(t, sim.FleetConfig{Devices: []string{"dev-1", "dev-2"}, DataDir: dir, Broker: url,
		Prefix: topics.Prefix, ClientID: "fleet-commands", VerdictLog: &vlog})
	a := newAgentClient(t, url, topics)

	m := a.send(t, "dev-1", cmd(t, "dev-1", 50, 1, "set", sim.SetBody{Setpoint: ptr(24.0), Mode: ptr("heat")}), "")
	if m.topic != topics.Ack("dev-1") || m.ack.Verdict != fence.Accepted || m.ack.ID != "dev-1-50-1" || m.ack.Mark() != (fence.Mark{Token: 50, Seq: 1}) {
		t.Fatalf("ack %+v", m)
	}
	if s := a.nextState(t); s.device != "dev-1" || s.state.Setpoint != 24 || s.state.Mode != "heat" || s.state.Applied != 1 {
		t.Fatalf("state %+v", s)
	}
	// The broker (or the agent's outbox) redelivers: acked again, not re-applied.
	m = a.send(t, "dev-1", cmd(t, "dev-1", 50, 1, "set", sim.SetBody{Setpoint: ptr(24.0), Mode: ptr("heat")}), "")
	if m.ack.Verdict != fence.Duplicate {
		t.Fatalf("redelivery: %+v", m.ack)
	}
	m = a.send(t, "dev-2", cmd(t, "dev-2", 51, 1, "ping", nil), "")
	if m.topic != topics.Ack("dev-2") || m.ack.Verdict != fence.Accepted {
		t.Fatalf("dev-2 ping: %+v", m)
	}
	if s := a.nextState(t); s.device != "dev-2" || s.state.Applied != 1 || s.state.Mode != "off" {
		t.Fatalf("dev-2 state %+v", s)
	}
	m = a.send(t, "dev-1", cmd(t, "dev-1", 52, 1, "set", sim.SetBody{Relay: ptr(true)}), "")
	if m.ack.Verdict != fence.Accepted {
		t.Fatal(m.ack)
	}
	a.nextState(t)
	m = a.send(t, "dev-1", cmd(t, "dev-1", 50, 2, "set", sim.SetBody{Relay: ptr(false)}), "")
	if m.ack.Verdict != fence.Stale || m.ack.Mark() != (fence.Mark{Token: 52, Seq: 1}) {
		t.Fatalf("stale: %+v", m.ack)
	}

	want := sim.State{Setpoint: 24, Mode: "heat", Relay: true, Applied: 2, LastToken: 52, LastSeq: 1, LastID: "dev-1-52-1"}
	if s := state(t, f, "dev-1"); s != want {
		t.Fatalf("dev-1 %+v, want %+v", s, want)
	}
	if _, err := f.State("dev-9"); err == nil {
		t.Fatal("State of a device not in the fleet")
	}
	recs := vlog.records(t)
	var got []string
	for _, r := range recs {
		got = append(got, fmt.Sprintf("%s:%d/%d:%s", r.Device, r.Token, r.Seq, r.Verdict))
	}
	if w := "[dev-1:50/1:accepted dev-1:50/1:duplicate dev-2:51/1:accepted dev-1:52/1:accepted dev-1:50/2:stale]"; fmt.Sprint(got) != w {
		t.Fatalf("verdict log %v, want %s", got, w)
	}
	// The last ack reached the agent before its publisher saw the PUBACK,
	// so the counter may lag a moment behind.
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := f.Stats()
		if st.Accepted == 3 && st.Duplicate == 1 && st.Stale == 1 && st.AcksPublished == 5 && st.StatesPublished == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestFleetBadInput(t *testing.T) {
	url := startBroker(t)
	topics := mqtt.Topics{} // default prefix
	var vlog syncBuffer
	f := startFleet(t, sim.FleetConfig{Devices: []string{"dev-1", "dev-2"}, DataDir: t.TempDir(), Broker: url,
		ClientID: "fleet-bad", VerdictLog: &vlog})
	a := newAgentClient(t, url, topics)
	if m := a.send(t, "dev-1", cmd(t, "dev-1", 400, 1, "set", sim.SetBody{Setpoint: ptr(19.0)}), ""); m.ack.Verdict != fence.Accepted {
		t.Fatal(m.ack)
	}
	a.nextState(t)
	before := state(t, f, "dev-1")
	bad := badCommands(t)
	for _, c := range bad {
		m := a.send(t, "dev-1", c.raw, "")
		if m.topic != topics.Ack("dev-1") || m.ack.Verdict != fence.Invalid || m.ack.Device != "dev-1" || m.ack.Reason == "" {
			t.Fatalf("%s: ack %+v", c.name, m)
		}
		if m.ack.Mark() != (fence.Mark{Token: 400, Seq: 1}) {
			t.Fatalf("%s: ack mark %v", c.name, m.ack.Mark())
		}
	}
	if s := state(t, f, "dev-1"); s != before {
		t.Fatalf("state changed by bad input: %+v → %+v", before, s)
	}
	if st := f.Stats(); st.Invalid != uint64(len(bad)) || st.StatesPublished != 1 {
		t.Fatalf("stats %+v", st)
	}
	// The fleet keeps serving.
	if m := a.send(t, "dev-1", cmd(t, "dev-1", 400, 2, "set", sim.SetBody{Mode: ptr("cool")}), ""); m.ack.Verdict != fence.Accepted {
		t.Fatal(m.ack)
	}
	if s := a.nextState(t); s.state.Mode != "cool" || s.state.Setpoint != 19 {
		t.Fatalf("state %+v", s)
	}
	select {
	case s := <-a.states:
		t.Fatalf("unexpected state publish %+v", s)
	default:
	}
	if n := len(vlog.records(t)); n != len(bad)+2 {
		t.Fatalf("%d verdict log lines, want %d", n, len(bad)+2)
	}
}

func TestFleetResponseTopic(t *testing.T) {
	url := startBroker(t)
	topics := mqtt.Topics{}
	f := startFleet(t, sim.FleetConfig{Devices: []string{"dev-1", "dev-2"}, DataDir: t.TempDir(), Broker: url, ClientID: "fleet-rt"})
	a := newAgentClient(t, url, topics)
	m := a.send(t, "dev-1", cmd(t, "dev-1", 3, 1, "ping", nil), "reply/agent-7")
	if m.topic != "reply/agent-7" || m.ack.Verdict != fence.Accepted {
		t.Fatalf("ack %+v", m)
	}
	// A response topic pointing at another device's command topic is not
	// honoured: the ack goes to the ack topic.
	m = a.send(t, "dev-1", cmd(t, "dev-1", 3, 2, "ping", nil), topics.Cmd("dev-2"))
	if m.topic != topics.Ack("dev-1") || m.ack.Verdict != fence.Accepted {
		t.Fatalf("ack %+v", m)
	}
	if st := f.Stats(); st.BadResponseTopics != 1 || st.Accepted != 2 || st.Invalid != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestFleetRestartResumes(t *testing.T) {
	url := startBroker(t)
	topics := mqtt.Topics{}
	dir := t.TempDir()
	a := newAgentClient(t, url, topics)
	{
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		f, err := sim.NewFleet(ctx, sim.FleetConfig{Devices: []string{"dev-1"}, DataDir: dir, Broker: url})
		if err != nil {
			t.Fatal(err)
		}
		if err := f.AwaitReady(ctx); err != nil {
			t.Fatal(err)
		}
		if m := a.send(t, "dev-1", cmd(t, "dev-1", 90, 1, "set", sim.SetBody{Setpoint: ptr(26.0)}), ""); m.ack.Verdict != fence.Accepted {
			t.Fatal(m.ack)
		}
		a.nextState(t)
		if err := f.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	f := startFleet(t, sim.FleetConfig{Devices: []string{"dev-1"}, DataDir: dir, Broker: url})
	if m, _ := f.Mark("dev-1"); m != (fence.Mark{Token: 90, Seq: 1}) {
		t.Fatalf("mark after restart %v", m)
	}
	if m := a.send(t, "dev-1", cmd(t, "dev-1", 89, 5, "set", sim.SetBody{Setpoint: ptr(10.0)}), ""); m.ack.Verdict != fence.Stale {
		t.Fatalf("stale after restart: %+v", m.ack)
	}
	if s := state(t, f, "dev-1"); s.Setpoint != 26 || s.Applied != 1 {
		t.Fatalf("state after restart %+v", s)
	}
}

func TestNewFleetConfigErrors(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	for _, cfg := range []sim.FleetConfig{
		{DataDir: dir, Broker: "mqtt://127.0.0.1:1"},
		{Devices: []string{"a/b"}, DataDir: dir, Broker: "mqtt://127.0.0.1:1"},
		{Devices: []string{"a", "a"}, DataDir: dir, Broker: "mqtt://127.0.0.1:1"},
		{Devices: []string{"a"}, Broker: "mqtt://127.0.0.1:1"},
		{Devices: []string{"a"}, DataDir: dir},
		{Devices: []string{"a"}, DataDir: dir, Broker: "ftp://127.0.0.1:1"},
	} {
		if f, err := sim.NewFleet(ctx, cfg); err == nil {
			f.Close(ctx)
			t.Errorf("NewFleet(%+v) succeeded", cfg)
		}
	}
	// The database is free again after a failed dial.
	h := openHost(t, filepath.Join(dir, sim.DBFile), sim.HostConfig{})
	_ = h
}

// TestFleetLanes: a fleet over 8 lanes (MQTT clients) decides commands
// that arrive together in shared transactions (shim.ProcessBatch); every
// device's command is accepted once, acked with its mark, and the marks
// are durable: a fleet reopened on the same file has them and answers a
// repeat as a duplicate.
func TestFleetLanes(t *testing.T) {
	const n = 48
	url := startBroker(t)
	topics := mqtt.Topics{Prefix: "lanes"}
	dir := t.TempDir()
	var devs []string
	for i := range n {
		devs = append(devs, fmt.Sprintf("dev-%02d", i))
	}
	a := newAgentClient(t, url, topics)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	f, err := sim.NewFleet(ctx, sim.FleetConfig{Devices: devs, DataDir: dir, Broker: url, Prefix: topics.Prefix, ClientID: "lanes", Lanes: 8})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.AwaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, d := range devs {
		raw := cmd(t, d, 7, 1, "set", sim.SetBody{Setpoint: ptr(20.0)})
		wg.Go(func() { // together: the lanes' handlers meet in the batch loop
			if err := a.c.Publish(ctx, mqtt.Message{Topic: topics.Cmd(d), Payload: raw}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	acked := map[string]fence.Ack{}
	for len(acked) < n {
		select {
		case m := <-a.acks:
			acked[m.ack.Device] = m.ack
		case <-ctx.Done():
			t.Fatalf("%d of %d acks", len(acked), n)
		}
	}
	for _, d := range devs {
		if ack := acked[d]; ack.Verdict != fence.Accepted || ack.Mark() != (fence.Mark{Token: 7, Seq: 1}) {
			t.Errorf("%s: %+v", d, ack)
		}
	}
	st := f.Stats()
	if st.Accepted != n || st.Batches == 0 || st.Batches > n {
		t.Errorf("stats %+v: want %d accepted in 1..%d batches", st, n, n)
	}
	t.Logf("%d commands in %d transactions", n, st.Batches)
	if err := f.Close(ctx); err != nil {
		t.Fatal(err)
	}
	f = startFleet(t, sim.FleetConfig{Devices: devs, DataDir: dir, Broker: url, Prefix: topics.Prefix, ClientID: "lanes-2", Lanes: 3})
	for _, d := range devs {
		if m, _ := f.Mark(d); m != (fence.Mark{Token: 7, Seq: 1}) {
			t.Errorf("%s: mark %v after reopen", d, m)
		}
	}
	if m := a.send(t, devs[5], cmd(t, devs[5], 7, 1, "set", sim.SetBody{Setpoint: ptr(20.0)}), ""); m.ack.Verdict != fence.Duplicate {
		t.Errorf("repeat after reopen: %+v", m.ack)
	}
}
