package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fxamacker/cbor/v2"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/offline"
)

// TestStateReasons: a device that is refused or
// lost says why in Status — the token regression with both tokens, the
// fence point's newer token — and a reason never outlives its state.
func TestStateReasons(t *testing.T) {
	fp := newFencePoint()
	ob := openOutbox(t, filepath.Join(t.TempDir(), offline.File), nil)
	const held = fence.Token(1 << 40)
	if err := ob.SetHeld("d1", held); err != nil {
		t.Fatal(err)
	}
	a := startOutboxAgent(t, "gw-a", "/t/"+t.Name(), devCfgs("d1", "d2"), fp, ob)
	waitFor(t, "d2 held, d1 refused", func() bool {
		st := a.Status()
		return st.Devices[0].State == StateRefused && st.Devices[1].State == StateHolding
	})
	d1 := a.Status().Devices[0]
	if !strings.Contains(d1.Reason, "token regression") || !strings.Contains(d1.Reason, fmt.Sprint(held)) {
		t.Errorf("refused d1: reason %q, want the token regression and the token held before (%d)", d1.Reason, held)
	}
	if d2 := a.Status().Devices[1]; d2.Reason != "" {
		t.Errorf("holding d2 has a reason: %q", d2.Reason)
	}

	// Deposed by the fence point: lost, with the fence point's token.
	tok, _ := a.Holding("d2")
	fp.mu.Lock()
	fp.marks["d2"] = fence.Mark{Token: tok + 100, Seq: 1}
	fp.mu.Unlock()
	if _, err := a.Send(context.Background(), "d2", "set", nil); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("send under a deposed token: %v", err)
	}
	// (A deposed agent may release the lock and campaign again at once;
	// the reason is checked while the device is still lost.)
	if d2 := a.Status().Devices[1]; d2.State == StateLost && !strings.Contains(d2.Reason, fmt.Sprintf("deposed: the fence point holds newer token %d", tok+100)) {
		t.Errorf("deposed d2: reason %q", d2.Reason)
	}

	// A reason belongs to the state it was given for.
	d := &device{}
	t0 := time.Unix(100, 0)
	d.setStateLocked(StateLost, "etcd session lost", t0)
	if r := d.reason.current(d); r != "etcd session lost" {
		t.Errorf("reason %q", r)
	}
	d.state, d.since = StateCampaigning, t0 // a direct change of state, even at the same instant
	if r := d.reason.current(d); r != "" {
		t.Errorf("campaigning still shows the reason of lost: %q", r)
	}
	d.state, d.since = StateLost, t0.Add(time.Second) // lost again, later, without a reason
	if r := d.reason.current(d); r != "" {
		t.Errorf("a later lost shows an earlier reason: %q", r)
	}
}

// TestMalformedStateReports: a state report that
// does not decode is counted and logged at WARN, at most once per device
// per malformedLogEvery, the next line saying how many were left out;
// devices the agent does not know share one limit. A good report is not
// counted.
func TestMalformedStateReports(t *testing.T) {
	logs := &logBuffer{}
	clk := time.Unix(1000, 0)
	cfg := &Config{Gateway: "gw-m", Etcd: EtcdConfig{Endpoints: testEtcd.Endpoints(), Prefix: "/t/" + t.Name(), LeaseTTL: 2 * time.Second},
		MQTT: MQTTConfig{Brokers: []string{"mqtt://127.0.0.1:1"}}, Devices: devCfgs("d1", "d2")}
	a, err := newAgent(t, cfg, nil, newFencePoint(), Options{Logger: slog.New(slog.NewJSONHandler(logs, nil)), Now: func() time.Time { return clk }})
	if err != nil {
		t.Fatal(err)
	}
	bad := []byte{0xa1, 0x61} // a map whose key is cut off
	for range 5 {
		a.DeviceStateReport("d1", bad)
	}
	a.DeviceStateReport("d2", bad)
	for i := range 50 {
		a.DeviceStateReport(fmt.Sprintf("ghost-%d", i), bad)
	}
	good, _ := cbor.Marshal(map[string]any{"setpoint": 21})
	a.DeviceStateReport("d1", good)
	clk = clk.Add(malformedLogEvery)
	a.DeviceStateReport("d1", bad)

	if n := a.Status().Counters.StateMalformed; n != 5+1+50+1 {
		t.Errorf("state_reports_malformed %d, want 57", n)
	}
	var lines []map[string]any
	for _, l := range logs.lines(t) {
		if l["msg"] == "device state report malformed; dropped" {
			lines = append(lines, l)
		}
	}
	// d1, d2, the first ghost, then d1 again saying 4 were left out.
	if len(lines) != 4 {
		t.Fatalf("%d lines, want 4: %v", len(lines), lines)
	}
	want := []struct {
		dev        string
		suppressed float64
	}{{"d1", 0}, {"d2", 0}, {"ghost-0", 0}, {"d1", 4}}
	for i, l := range lines {
		if l["level"] != "WARN" || l["device"] != want[i].dev || l["suppressed"] != want[i].suppressed || l["err"] == "" {
			t.Errorf("line %d: %v, want device %s suppressed %v", i, l, want[i].dev, want[i].suppressed)
		}
	}
	if len(a.reports.logs.last) != 3 {
		t.Errorf("rate-limit entries %d, want 3 (d1, d2, unknown devices together)", len(a.reports.logs.last))
	}
}

// TestTailWarning: the lease-tail warning is on exactly while
// the observed tail (max stall + max keep-alive round trip + max fsync over
// the window) is above lease_ttl/3, and the log says so once each way.
func TestTailWarning(t *testing.T) {
	logs := &logBuffer{}
	ob := openOutbox(t, filepath.Join(t.TempDir(), offline.File), nil)
	cfg := &Config{Gateway: "gw-t", Etcd: EtcdConfig{Endpoints: testEtcd.Endpoints(), Prefix: "/t/" + t.Name(), LeaseTTL: 3 * time.Second},
		MQTT: MQTTConfig{Brokers: []string{"mqtt://127.0.0.1:1"}}, Devices: devCfgs("d1")}
	a, err := New(cfg, nil, newFencePoint(), Options{Outbox: ob, Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tl := a.leases.tails
	tl.stall.observe(600*time.Millisecond, now)
	tl.keepAlive.observe(300*time.Millisecond, now)
	a.leases.checkTail(now)
	if s := a.Status().LeaseTail; s.Warning != "" || round3(s.Tail) != 0.9 {
		t.Fatalf("tail 0.9 s of ttl 3 s: %+v", s)
	}
	// The real outbox commit observer: an Append is a commit.
	if err := ob.Append(context.Background(), &offline.Entry{Envelope: fence.Envelope{V: fence.Version, Device: "d1", Token: 1, Seq: 1,
		ID: "c1", Kind: "set"}}); err != nil {
		t.Fatal(err)
	}
	if f := a.Status().LeaseTail.Fsync; f == nil || f.Samples != 1 {
		t.Fatalf("outbox commit not measured: %+v", f)
	}
	tl.fsync.observe(200*time.Millisecond, now) // 1.1 s > 1 s
	a.leases.checkTail(now)
	a.leases.checkTail(now) // still above: no second line
	s := a.Status().LeaseTail
	if s.Warning == "" || s.Margin >= 2 || s.Fsync.Max != 0.2 {
		t.Fatalf("tail above ttl/3: %+v", s)
	}
	// Out of the window, the figures and the warning are gone.
	later := now.Add(tailWindow + tailSlot)
	a.leases.checkTail(later)
	if s := a.leases.tails.status(cfg.Etcd.LeaseTTL, later); s.Warning != "" || s.Stall.Samples != 0 || s.Tail != 0 {
		t.Fatalf("the window did not move: %+v", s)
	}
	var warn, clear int
	for _, l := range logs.lines(t) {
		switch {
		case strings.HasPrefix(fmt.Sprint(l["msg"]), "lease tail above lease_ttl/3"):
			warn++
			if l["level"] != "WARN" || l["tail_s"] != 1.1 || l["lease_ttl_s"] != 3.0 {
				t.Errorf("warning line: %v", l)
			}
		case l["msg"] == "lease tail back under lease_ttl/3":
			clear++
		}
	}
	if warn != 1 || clear != 1 {
		t.Errorf("%d warning and %d all-clear lines, want one each", warn, clear)
	}
}

// TestTailFigures: p99 is the bound of the bucket holding the 99th
// percentile, never above the maximum.
func TestTailFigures(t *testing.T) {
	s := newTailSeries("test_seconds", "test")
	now := time.Now()
	for range 990 {
		s.observe(3*time.Millisecond, now) // bucket ≤ 5 ms
	}
	for range 10 {
		s.observe(40*time.Millisecond, now) // bucket ≤ 50 ms
	}
	if f := s.figures(now); f.Samples != 1000 || f.P99 != 0.005 || f.Max != 0.04 {
		t.Errorf("figures %+v, want 1000 samples, p99 0.005, max 0.04", f)
	}
	s.observe(time.Minute, now) // beyond the last bound
	if f := s.figures(now); f.Max != 60 || f.P99 != 0.05 {
		t.Errorf("figures %+v", f)
	}
}

// TestHiccupInterval: a fortieth of lease_ttl between 100 and 250 ms, so
// that what the meter can miss of a stall (up to one interval) stays at
// most 7.5 % of the warning's threshold, lease_ttl/3, from 4 s up, and the
// interval is never shorter than the 100 ms it was.
func TestHiccupInterval(t *testing.T) {
	for _, tc := range []struct{ ttl, want time.Duration }{
		{MinLeaseTTL, 100 * time.Millisecond},
		{4 * time.Second, 100 * time.Millisecond},
		{6 * time.Second, 150 * time.Millisecond},
		{DefaultLeaseTTL, 250 * time.Millisecond},
		{time.Minute, 250 * time.Millisecond},
	} {
		got := hiccupInterval(tc.ttl)
		if got != tc.want {
			t.Errorf("lease_ttl %v: interval %v, want %v", tc.ttl, got, tc.want)
		}
		if tc.ttl >= 4*time.Second && float64(got) > 0.075*float64(tc.ttl/3)+1 {
			t.Errorf("lease_ttl %v: interval %v is above 7.5 %% of lease_ttl/3", tc.ttl, got)
		}
	}
}
