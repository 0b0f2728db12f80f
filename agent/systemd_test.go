package agent

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// fakeClock is a clock the test moves by hand.
type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// The watchdog's probe: a live Run loop is healthy; a goroutine stuck
// holding a device's lock (a wedged controller) stalls the heartbeat, and
// Healthy says so once it is older than maxAge; it recovers when the lock
// is let go.
func TestHealthyStalledHeartbeat(t *testing.T) {
	clk := &fakeClock{}
	clk.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	prefix := "/t/" + t.Name()
	a := startAgent(t, "gw-a", prefix, []string{"d1", "d2"}, newFencePoint(), Options{Now: clk.now})

	const maxAge = 5 * time.Second
	select {
	case <-a.Campaigning():
	case <-time.After(30 * time.Second):
		t.Fatal("the agent did not start campaigning")
	}
	waitFor(t, "a holds both devices", holdingAll(a, []string{"d1", "d2"}))
	if err := a.Healthy(maxAge); err != nil {
		t.Fatalf("Healthy with a live loop: %v", err)
	}
	if s := a.Summary(); !strings.HasPrefix(s, "holding 2/2 devices") || !strings.Contains(s, "etcd session up") {
		t.Errorf("Summary() = %q", s)
	}

	// Wedge: hold d2's lock as a stuck controller would.
	d := a.devices["d2"]
	d.mu.Lock()
	// The loop's next beat blocks on d2 (it beats every second); time
	// moves on past maxAge and no beat records it.
	time.Sleep(2 * heartbeatEvery) // let the loop reach the blocked beat
	clk.advance(maxAge + time.Second)
	// Real time passes too: a loop whose beat did not take d2's lock would
	// have beaten at the new time by now, and Healthy would pass.
	time.Sleep(2 * heartbeatEvery)
	err := a.Healthy(maxAge)
	d.mu.Unlock()
	if err == nil || !strings.Contains(err.Error(), "last beat") {
		t.Fatalf("Healthy with a stuck device lock: %v, want a stale heartbeat", err)
	}

	// Unstuck: the blocked beat completes at the new time.
	waitFor(t, "healthy again", func() bool { return a.Healthy(maxAge) == nil })
}

func TestHealthyBeforeRun(t *testing.T) {
	cfg := &Config{Gateway: "gw", Etcd: EtcdConfig{Endpoints: []string{"http://127.0.0.1:1"}},
		MQTT: MQTTConfig{Brokers: []string{"mqtt://127.0.0.1:1"}}, Devices: []DeviceConfig{{ID: "d1", Auth: AuthOff}}}
	a, err := newAgent(t, cfg, nil, newFencePoint(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Healthy(time.Hour); err == nil {
		t.Fatal("Healthy before Run: nil, want an error")
	}
	select {
	case <-a.Campaigning():
		t.Fatal("Campaigning closed before Run")
	default:
	}
	if s := a.Summary(); s != "holding 0/1 devices; etcd session down" {
		t.Errorf("Summary() = %q", s)
	}
}
