package agent

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/offline"
)

// fanoutRig runs gw-1 over n labelled devices (dev-00.., site a for the
// even ones, b for the odd) plus "elsewhere", which gw-2 holds first, on
// one in-process fence point, and serves gw-1's local API.
type fanoutRig struct {
	fp   *fencePoint
	a    *testAgent
	c    *APIClient
	devs []string
}

func newFanoutRig(t *testing.T, n int) *fanoutRig {
	t.Helper()
	return newFanoutRigOpts(t, n, Options{})
}

// newFanoutRigOpts is newFanoutRig with gw-1's Options o, and its config
// as tweak sets it.
func newFanoutRigOpts(t *testing.T, n int, o Options, tweak ...func(*Config)) *fanoutRig {
	t.Helper()
	prefix := "/t/" + t.Name()
	r := &fanoutRig{fp: newFencePoint()}
	other := startAgent(t, "gw-2", prefix, []string{"elsewhere"}, r.fp, Options{})
	waitFor(t, "gw-2 holds elsewhere", holdingAll(other, []string{"elsewhere"}))
	cfg := &Config{Gateway: "gw-1", Etcd: EtcdConfig{Endpoints: testEtcd.Endpoints(), Prefix: prefix, LeaseTTL: 2 * time.Second},
		MQTT: MQTTConfig{Brokers: []string{"mqtt://127.0.0.1:1"}}, Command: CommandConfig{Timeout: 20 * time.Second}}
	for i := range n {
		id := fmt.Sprintf("dev-%02d", i)
		r.devs = append(r.devs, id)
		cfg.Devices = append(cfg.Devices, DeviceConfig{ID: id, Auth: AuthOff, Labels: map[string]string{"site": string(rune('a' + i%2)), "kind": "meter"}})
	}
	cfg.Devices = append(cfg.Devices, DeviceConfig{ID: "elsewhere", Auth: AuthOff, Labels: map[string]string{"site": "a"}})
	for _, f := range tweak {
		f(cfg)
	}
	r.a = runAgent(t, cfg, etcdClient(t), r.fp, o)
	waitFor(t, "gw-1 holds its devices", holdingAll(r.a, r.devs))
	r.c = serveAPI(t, r.a.Agent)
	return r
}

func (r *fanoutRig) fanOut(t *testing.T, req FanoutRequest) (map[string]SendResult, *FanoutSummary, int) {
	t.Helper()
	got := map[string]SendResult{}
	selected := -1
	sum, err := r.c.FanOut(t.Context(), req, func(ev FanoutEvent) {
		switch {
		case ev.Selected != nil:
			selected = ev.Selected.Devices
		case ev.Result != nil:
			if _, dup := got[ev.Result.Device]; dup {
				t.Errorf("%s reported twice", ev.Result.Device)
			}
			got[ev.Result.Device] = *ev.Result
		}
	})
	if err != nil {
		t.Fatalf("fan-out: %v", err)
	}
	if len(got) != sum.Devices || selected != sum.Devices {
		t.Fatalf("%d results, %d selected, summary %+v", len(got), selected, sum)
	}
	return got, sum, selected
}

// TestFanOutOwnEnvelopes: one request to every device of site a; each gets
// its own envelope under its own token with its next seq, applied once;
// the entries share one outbox commit; the device gw-2 holds is refused
// with its reason while the others are accepted. A second fan-out carries
// on with seq 2 and meets a device whose fence has a newer holder's token:
// stale there, accepted everywhere else. Every id begins with its
// envelope's issue time (in time order: offline.NewCommandID).
func TestFanOutOwnEnvelopes(t *testing.T) {
	const n = 40
	r := newFanoutRig(t, n)
	got, sum, _ := r.fanOut(t, FanoutRequest{Selection: Selection{Selector: "site=a,kind!=pump"}, Kind: "set", Body: []byte(`{"setpoint":21}`)})
	if sum.Devices != n/2+1 || sum.ByOutcome["accepted"] != n/2 || sum.ByOutcome["refused"] != 1 || sum.Commits != 1 {
		t.Fatalf("summary %+v: want %d accepted in one commit and elsewhere refused", sum, n/2)
	}
	if e := got["elsewhere"]; !strings.Contains(e.Error, ErrNotHolder.Error()) || e.Verdict != "" {
		t.Fatalf("elsewhere: %+v, want refused as not the holder", e)
	}
	r.fp.mu.Lock()
	for i, d := range r.devs {
		tok, _ := r.a.Holding(d)
		res, applied := got[d], r.fp.applied[d]
		switch {
		case i%2 == 1 && (len(applied) != 0 || res != SendResult{}):
			t.Errorf("%s (site b): selected %+v, applied %d", d, res, len(applied))
		case i%2 == 0 && (len(applied) != 1 || res.Verdict != "accepted" || fence.Token(res.Token) != tok || res.Seq != 1 || applied[0].ID != res.ID || applied[0].Token != tok):
			t.Errorf("%s: %+v, applied %+v; want its own token %d, seq 1, applied once", d, res, applied, tok)
		case i%2 == 0 && applied[0].ID[:12] != fmt.Sprintf("%012x", applied[0].IssuedAt):
			t.Errorf("%s: id %s does not begin with its issue time, %d ms (offline.NewCommandID)", d, applied[0].ID, applied[0].IssuedAt)
		}
	}
	stale := r.devs[2]
	tok, _ := r.a.Holding(stale)
	r.fp.marks[stale] = fence.Mark{Token: tok + 1000, Seq: 1} // a newer holder reached it
	r.fp.mu.Unlock()

	got, sum, _ = r.fanOut(t, FanoutRequest{Selection: Selection{Glob: "dev-0[0-4]"}, Kind: "set", Body: []byte(`{"setpoint":22}`)})
	if sum.ByOutcome["accepted"] != 4 || sum.ByOutcome["stale"] != 1 || got[stale].Verdict != "stale" {
		t.Fatalf("summary %+v, %s: %+v; want 4 accepted and %s stale", sum, stale, got[stale], stale)
	}
	for i, d := range r.devs[:5] {
		if want := uint64(2 - i%2); got[d].Seq != want {
			t.Errorf("%s: seq %d in the second fan-out, want %d", d, got[d].Seq, want)
		}
	}

	srv := httptest.NewServer(r.a.MetricsHandler("test"))
	defer srv.Close()
	mf := scrape(t, srv)
	wantSample(t, mf, 2, "edgefence_fanout_requests_total")
	for o, n := range map[string]float64{"accepted": n/2 + 4, "stale": 1, "refused": 1, "queued": 0} {
		wantSample(t, mf, n, "edgefence_fanout_devices_total", "outcome", o)
	}
}

// TestWaitersToldOnceDurable: with outbox.verdict_delay an hour, a
// fan-out's results and Pending.Wait's ack come only once the verdicts
// are durable (invariant I9): nothing is left waiting for a commit when
// they are reported. Before, they were reported as the device answered,
// the records left to ride on a commit an hour away.
func TestWaitersToldOnceDurable(t *testing.T) {
	hour := time.Hour
	r := newFanoutRigOpts(t, 8, Options{}, func(c *Config) { c.Outbox.VerdictDelay = &hour })
	_, sum, _ := r.fanOut(t, FanoutRequest{Selection: Selection{Glob: "dev-*"}, Kind: "ping"})
	if sum.ByOutcome["accepted"] != 8 {
		t.Fatalf("summary %+v, want 8 accepted", sum)
	}
	if n := r.a.outbox.Waiting(); n != 0 {
		t.Errorf("fan-out reported its verdicts with %d still waiting for their commit", n)
	}
	p, err := r.a.Issue(t.Context(), r.devs[0], "ping", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if ack, err := p.Wait(t.Context()); err != nil || ack.Verdict != fence.Accepted {
		t.Fatalf("Wait: %+v %v", ack, err)
	}
	if n := r.a.outbox.Waiting(); n != 0 {
		t.Errorf("Pending.Wait returned its ack with %d verdicts still waiting for their commit", n)
	}
}

// TestFanOutBurst: a fan-out to BurstDevices devices or more calls
// Options.OnBurst once, before its first device; a smaller one does not.
func TestFanOutBurst(t *testing.T) {
	var bursts atomic.Int32
	r := newFanoutRigOpts(t, 4, Options{OnBurst: func() { bursts.Add(1) }})
	_, sum, _ := r.fanOut(t, FanoutRequest{Selection: Selection{Glob: "dev-*"}, Kind: "ping"})
	if sum.ByOutcome["accepted"] != 4 || bursts.Load() != 0 {
		t.Fatalf("a fan-out to 4: summary %+v, %d bursts; want 4 accepted, none", sum, bursts.Load())
	}
	devs := slices.Clone(r.devs)
	for i := len(devs); i < BurstDevices; i++ {
		devs = append(devs, fmt.Sprintf("unknown-%03d", i))
	}
	_, sum, _ = r.fanOut(t, FanoutRequest{Selection: Selection{Devices: devs}, Kind: "ping"})
	if sum.Devices != BurstDevices || sum.ByOutcome["accepted"] != 4 || bursts.Load() != 1 {
		t.Fatalf("a fan-out to %d: summary %+v, %d bursts; want 4 accepted, one burst", BurstDevices, sum, bursts.Load())
	}
}

// TestFanOutRefusals: a list naming a device the agent does not know is
// answered per device (that one refused as unknown, the rest accepted);
// bad selections and bodies are refused before any device, with a
// reason, a log line and a counter; no_wait reports every device queued.
func TestFanOutRefusals(t *testing.T) {
	r := newFanoutRig(t, 4)
	got, sum, _ := r.fanOut(t, FanoutRequest{Selection: Selection{Devices: []string{"dev-00", "nope", "dev-01", "dev-00"}}, Kind: "ping"})
	if sum.Devices != 3 || sum.ByOutcome["accepted"] != 2 || !strings.Contains(got["nope"].Error, "unknown device") {
		t.Fatalf("summary %+v, nope %+v", sum, got["nope"])
	}
	for _, tc := range []struct {
		name string
		req  FanoutRequest
		want string
	}{
		{"two selections", FanoutRequest{Selection: Selection{Glob: "*", Selector: "site=a"}, Kind: "ping"}, "exactly one of devices, glob and selector"},
		{"none", FanoutRequest{Kind: "ping"}, "exactly one of"},
		{"bad glob", FanoutRequest{Selection: Selection{Glob: "dev-["}, Kind: "ping"}, "syntax error in pattern"},
		{"nothing selected", FanoutRequest{Selection: Selection{Glob: "pump-*"}, Kind: "ping"}, `glob "pump-*" selects no configured device`},
		{"bad selector", FanoutRequest{Selection: Selection{Selector: "site"}, Kind: "ping"}, `selector term "site": want key=value`},
		{"bad label value", FanoutRequest{Selection: Selection{Selector: "site=a b"}, Kind: "ping"}, `character ' '`},
		{"bad kind", FanoutRequest{Selection: Selection{Glob: "*"}, Kind: ""}, "command refused before any device"},
		{"body too big", FanoutRequest{Selection: Selection{Glob: "*"}, Kind: "set", Body: []byte(`"` + strings.Repeat("x", fence.MaxBodySize) + `"`)}, "limit 32768"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := r.c.FanOut(t.Context(), tc.req, func(FanoutEvent) { t.Error("a line for a refused request") })
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), fmt.Sprint(http.StatusBadRequest)) {
				t.Fatalf("%v, want 400 and %q", err, tc.want)
			}
		})
	}
	if n := r.a.api.refusedCounts()[refusedSelection]; n != 6 {
		t.Errorf("%d bad_selection refusals, want 6", n)
	}
	got, sum, _ = r.fanOut(t, FanoutRequest{Selection: Selection{Glob: "dev-*"}, Kind: "ping", NoWait: true})
	if sum.ByOutcome["queued"] != 4 || got["dev-03"].ID == "" || !got["dev-03"].Queued {
		t.Fatalf("no_wait: %+v %+v", sum, got["dev-03"])
	}
}

// TestSelectorAndLabels: the selector grammar and the config's label rule.
func TestSelectorAndLabels(t *testing.T) {
	s, err := ParseSelector("site=a, kind!=pump")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		labels map[string]string
		want   bool
	}{
		{map[string]string{"site": "a"}, true},
		{map[string]string{"site": "a", "kind": "meter"}, true},
		{map[string]string{"site": "a", "kind": "pump"}, false},
		{map[string]string{"site": "b"}, false},
		{nil, false},
	} {
		if got := s.Matches(tc.labels); got != tc.want {
			t.Errorf("%v: %v, want %v", tc.labels, got, tc.want)
		}
	}
	for _, bad := range []string{"", "site", "=a", "Site=a", "site=", "site=a,", "a b=c"} {
		if _, err := ParseSelector(bad); !errors.Is(err, ErrSelection) {
			t.Errorf("%q: %v, want ErrSelection", bad, err)
		}
	}
	base := "gateway: g\netcd: {endpoints: [http://127.0.0.1:2379]}\nmqtt: {brokers: [mqtt://127.0.0.1:1883]}\n"
	c, err := ParseConfig([]byte(base + "devices:\n  - id: a\n    auth: off\n    labels: {site: north-1, kind: meter}\n"))
	if err != nil || c.Devices[0].Labels["site"] != "north-1" {
		t.Fatalf("%+v %v", c, err)
	}
	_, err = ParseConfig([]byte(base + "devices:\n  - id: a\n    auth: off\n    labels:\n      site: north-1\n      Kind: meter\n"))
	ces := ConfigErrors(err)
	if len(ces) != 1 || ces[0].Key != "devices[0].labels.Kind" || ces[0].Line != 9 || !strings.Contains(ces[0].Msg, "a-z or 0-9") {
		t.Fatalf("bad label key: %v", err)
	}
}

// TestFanOutFullQueueRefusesOnlyThatDevice: a chunk's entries go in one
// AppendAll, all or none; when a device's queue is full the fan-out
// appends the chunk's entries one by one instead, so that only that
// device is refused (naming the limit) and the others are stored.
func TestFanOutFullQueueRefusesOnlyThatDevice(t *testing.T) {
	ob, err := offline.Open(filepath.Join(t.TempDir(), offline.File), &offline.Options{MaxPerDevice: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ob.Close() })
	devs := []string{"dev-0", "dev-1", "dev-2"}
	cfg := &Config{Gateway: "gw-1", Etcd: EtcdConfig{Endpoints: testEtcd.Endpoints(), Prefix: "/t/" + t.Name(), LeaseTTL: 2 * time.Second},
		MQTT: MQTTConfig{Brokers: []string{"mqtt://127.0.0.1:1"}}, Command: CommandConfig{Timeout: 5 * time.Second}}
	for _, d := range devs {
		cfg.Devices = append(cfg.Devices, DeviceConfig{ID: d, Auth: AuthOff})
	}
	a := runAgent(t, cfg, etcdClient(t), awaySender{}, Options{Outbox: ob})
	waitFor(t, "held", holdingAll(a, devs))
	if _, err := a.Enqueue(t.Context(), "dev-1", "ping", nil); err != nil { // dev-1's queue is now full
		t.Fatal(err)
	}
	got := map[string]SendResult{}
	sum := a.FanOut(t.Context(), devs, "ping", nil, false, func(r SendResult) { got[r.Device] = r })
	if sum.ByOutcome["queued"] != 2 || sum.ByOutcome["refused"] != 1 || !strings.Contains(got["dev-1"].Error, offline.ErrFull.Error()) {
		t.Fatalf("%+v %+v: want dev-1 refused as full, the others queued", sum, got)
	}
	for _, d := range []string{"dev-0", "dev-2"} {
		if n, _ := ob.Pending(d); n != 1 || got[d].Seq != 1 {
			t.Errorf("%s: %d pending, result %+v; want its command stored with seq 1", d, n, got[d])
		}
	}
	for _, d := range a.Status().Devices {
		if d.ID == "dev-1" && d.Seq != 1 {
			t.Errorf("dev-1 at seq %d: the refused command used up a seq", d.Seq)
		}
	}
}

// TestFanOutWorkersTakeFreshEntries: a device whose queue was empty gets
// its fan-out entry handed to its worker (hint.go), not read back from
// the outbox; a device with two commands still queued has its worker read
// the queue as before, and gets all three in order, each applied once
// (a hint there would skip the second: answered duplicate, never
// applied). Without the hint no entry is taken unread.
func TestFanOutWorkersTakeFreshEntries(t *testing.T) {
	const n = 8
	r := newFanoutRig(t, n)
	busy := r.devs[3]
	gate := make(chan struct{})
	r.fp.mu.Lock()
	r.fp.gates = map[string]chan struct{}{busy: gate}
	r.fp.mu.Unlock()
	ps, err := r.a.IssueAll(t.Context(), busy, "ping", [][]byte{nil, nil}) // two queued: the fan-out's comes third
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		defer p.Close()
	}
	q := r.a.delivery
	before := q.stats.hinted.Load()
	done := make(chan struct{})
	got := map[string]SendResult{}
	var sum *FanoutSummary
	go func() { // the fan-out waits for busy's verdict: the test opens the gate meanwhile
		defer close(done)
		sum, err = r.c.FanOut(t.Context(), FanoutRequest{Selection: Selection{Glob: "dev-*"}, Kind: "set", Body: []byte(`{"setpoint":21}`)},
			func(ev FanoutEvent) {
				if ev.Result != nil {
					got[ev.Result.Device] = *ev.Result
				}
			})
	}()
	waitFor(t, "the others accepted", func() bool { return q.stats.hinted.Load()-before == n-1 && q.stats.accepted.Load() >= n-1 })
	close(gate)
	<-done
	if err != nil || sum.ByOutcome["accepted"] != n {
		t.Fatalf("summary %+v, %v; want %d accepted", sum, err, n)
	}
	if h := q.stats.hinted.Load() - before; h != n-1 {
		t.Errorf("%d entries taken unread, want %d (every device but %s)", h, n-1, busy)
	}
	for i, p := range ps {
		if ack, err := p.Wait(t.Context()); err != nil || ack.Verdict != fence.Accepted {
			t.Fatalf("%s's command %d: %v, %v", busy, i+1, ack, err)
		}
	}
	r.fp.mu.Lock()
	defer r.fp.mu.Unlock()
	for _, d := range r.devs {
		applied, want := r.fp.applied[d], 1
		if d == busy {
			want = 3
		}
		if len(applied) != want || applied[len(applied)-1].ID != got[d].ID || got[d].Seq != uint64(want) {
			t.Errorf("%s: applied %d (want %d), fan-out result %+v", d, len(applied), want, got[d])
		}
	}
}
