package agent

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/edgefence/edgefence/fence"
)

// get fetches path from srv and returns the status and body.
func get(t *testing.T, srv *httptest.Server, path string) (int, string) {
	t.Helper()
	res, err := srv.Client().Get(srv.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, string(b)
}

// scrape parses /metrics.
func scrape(t *testing.T, srv *httptest.Server) map[string]*dto.MetricFamily {
	t.Helper()
	code, body := get(t, srv, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d %s", code, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mf, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v\n%s", err, body)
	}
	return mf
}

// sample returns the value of the series name{labels} (pairs of label name
// and value), and whether it exists.
func sample(mf map[string]*dto.MetricFamily, name string, labels ...string) (float64, bool) {
	f := mf[name]
	if f == nil {
		return 0, false
	}
next:
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for i := 0; i+1 < len(labels); i += 2 {
			if have[labels[i]] != labels[i+1] {
				continue next
			}
		}
		switch {
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Untyped != nil:
			return m.Untyped.GetValue(), true
		}
	}
	return 0, false
}

func wantSample(t *testing.T, mf map[string]*dto.MetricFamily, want float64, name string, labels ...string) {
	t.Helper()
	v, ok := sample(mf, name, labels...)
	if !ok {
		t.Errorf("%s%v: missing", name, labels)
	} else if v != want {
		t.Errorf("%s%v = %v, want %v", name, labels, v, want)
	}
}

func TestMetricsEndpoint(t *testing.T) {
	prefix := "/t/" + t.Name()
	fp := newFencePoint()
	ob := openOutbox(t, filepath.Join(t.TempDir(), "outbox.db"), nil)
	cfg := &Config{Gateway: "gw-m", Etcd: EtcdConfig{Endpoints: testEtcd.Endpoints(), Prefix: prefix, LeaseTTL: 2 * time.Second},
		MQTT: MQTTConfig{Brokers: []string{"mqtt://127.0.0.1:1"}}, Command: CommandConfig{Timeout: 5 * time.Second},
		Metrics: MetricsConfig{PerDevice: true}, Devices: devCfgs("d1", "d2")}
	// New, not runAgent: /readyz is checked before the session exists.
	a, err := New(cfg, etcdClient(t), fp, Options{Outbox: ob})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a.MetricsHandler("v1.2.3-test"))
	defer srv.Close()

	if code, body := get(t, srv, "/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Fatalf("/healthz: %d %q", code, body)
	}
	if code, body := get(t, srv, "/readyz"); code != http.StatusServiceUnavailable || body != "etcd session down\n" {
		t.Fatalf("/readyz before the session: %d %q", code, body)
	}
	mf := scrape(t, srv)
	wantSample(t, mf, 0, "edgefence_etcd_session_up")
	wantSample(t, mf, 0, "edgefence_leases_held")

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := a.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	defer wg.Wait()
	defer cancel()

	ta := &testAgent{Agent: a}
	waitFor(t, "holding d1, d2", holdingAll(ta, []string{"d1", "d2"}))
	// The fencePoint sender reports no transport state: readiness is the
	// etcd session alone.
	if code, body := get(t, srv, "/readyz"); code != http.StatusOK || body != "ready\n" {
		t.Fatalf("/readyz with the session up: %d %q", code, body)
	}

	bg := context.Background()
	for range 2 {
		if _, err := a.Send(bg, "d1", "ping", nil); err != nil {
			t.Fatal(err)
		}
	}
	tok, _ := a.Holding("d1")
	mf = scrape(t, srv)
	wantSample(t, mf, 2, "edgefence_commands_total", "verdict", "accepted")
	wantSample(t, mf, 2, "edgefence_leases_held")
	wantSample(t, mf, 2, "edgefence_lease_acquisitions_total")
	wantSample(t, mf, float64(tok), "edgefence_device_token", "device", "d1")
	wantSample(t, mf, 1, "edgefence_device_state", "device", "d1", "state", StateHolding)
	wantSample(t, mf, 0, "edgefence_device_state", "device", "d1", "state", StateLost)

	// A newer holder reached d1 (as if another gateway had): the next
	// command is refused as stale.
	fp.mu.Lock()
	fp.marks["d1"] = fence.Mark{Token: tok + 1000}
	fp.mu.Unlock()
	if _, err := a.Send(bg, "d1", "ping", nil); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("send after a newer holder: %v, want ErrStale", err)
	}
	waitFor(t, "outbox drained", pendingZero(ob))
	// That "newer holder" came from no lock of this etcd while the
	// agent's key held d1's lock: the agent tells it for a token
	// regression (recampaign.go), after the verdict.
	waitFor(t, "the regression counted", func() bool { return a.Status().Counters.Regressions == 1 })
	waitFor(t, "three ended, recorded", func() bool { return ob.Ended() == 3 })

	mf = scrape(t, srv)
	wantSample(t, mf, 1, "edgefence_build_info", "version", "v1.2.3-test")
	wantSample(t, mf, 2, "edgefence_commands_total", "verdict", "accepted")
	wantSample(t, mf, 1, "edgefence_commands_total", "verdict", "stale")
	wantSample(t, mf, 0, "edgefence_commands_total", "verdict", "duplicate")
	wantSample(t, mf, 0, "edgefence_commands_total", "verdict", "invalid")
	wantSample(t, mf, 0, "edgefence_commands_total", "verdict", "expired")
	wantSample(t, mf, 3, "edgefence_commands_queued_total")
	wantSample(t, mf, 0, "edgefence_commands_resent_total")
	wantSample(t, mf, 0, "edgefence_outbox_full_total")
	wantSample(t, mf, 0, "edgefence_outbox_device_pending_commands", "device", "d1")
	wantSample(t, mf, 0, "edgefence_outbox_pending_commands")
	wantSample(t, mf, 0, "edgefence_outbox_oldest_pending_age_seconds")
	wantSample(t, mf, 3, "edgefence_outbox_ended_commands")
	wantSample(t, mf, 1, "edgefence_token_regressions_total")
	wantSample(t, mf, 2, "edgefence_devices_auth_off") // said auth: off (devCfgs): plain envelopes
	// The stale refusal tells the agent d1 has a newer holder, and it
	// may campaign again meanwhile: check that the scrape is one
	// consistent snapshot (one state per device, leases_held = holding).
	holding := 0.0
	for _, dev := range []string{"d1", "d2"} {
		sum := 0.0
		for _, st := range deviceStates {
			v, _ := sample(mf, "edgefence_device_state", "device", dev, "state", st)
			sum += v
			if st == StateHolding {
				holding += v
			}
		}
		if sum != 1 {
			t.Errorf("%s: %v states at 1, want one", dev, sum)
		}
	}
	wantSample(t, mf, holding, "edgefence_leases_held")
	wantSample(t, mf, holding, "edgefence_devices", "state", StateHolding)
	wantSample(t, mf, 1, "edgefence_device_state", "device", "d2", "state", StateHolding)
	for _, name := range []string{"go_goroutines", "process_start_time_seconds"} {
		if mf[name] == nil {
			t.Errorf("%s: missing (Go and process collectors)", name)
		}
	}
	// Absent, not zero, where the source is absent.
	for _, name := range []string{"edgefence_mqtt_connected", "edgefence_fence_table_commands_total", "edgefence_twin_set_sent_total"} {
		if mf[name] != nil {
			t.Errorf("%s present without its source", name)
		}
	}
	if t.Failed() {
		_, body := get(t, srv, "/metrics")
		t.Log(body)
	}
}

// statusSender is a fencePoint whose transport reports a connection state,
// as mqtt.Commander does.
type statusSender struct {
	*fencePoint
	connected atomic.Bool
}

func (s *statusSender) Status() map[string]any {
	return map[string]any{"connected": s.connected.Load(), "reconnects": uint64(3)}
}

func TestReadyzNeedsTheTransport(t *testing.T) {
	s := &statusSender{fencePoint: newFencePoint()}
	// startAgent takes a *fencePoint; this sender wraps one.
	cfg := &Config{Gateway: "gw-r", Etcd: EtcdConfig{Endpoints: testEtcd.Endpoints(), Prefix: "/t/" + t.Name(), LeaseTTL: 2 * time.Second},
		MQTT: MQTTConfig{Brokers: []string{"mqtt://127.0.0.1:1"}}, Devices: devCfgs("d1")}
	ra := runAgent(t, cfg, etcdClient(t), s, Options{})
	srv := httptest.NewServer(ra.MetricsHandler("test"))
	defer srv.Close()
	waitFor(t, "holding d1", holdingAll(ra, []string{"d1"}))
	if code, body := get(t, srv, "/readyz"); code != http.StatusServiceUnavailable || body != "transport not connected\n" {
		t.Fatalf("/readyz, transport down: %d %q", code, body)
	}
	mf := scrape(t, srv)
	wantSample(t, mf, 0, "edgefence_mqtt_connected")
	wantSample(t, mf, 3, "edgefence_mqtt_reconnects_total")
	s.connected.Store(true)
	if code, body := get(t, srv, "/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz, all up: %d %q", code, body)
	}
	wantSample(t, scrape(t, srv), 1, "edgefence_mqtt_connected")
}

func TestServeMetricsShutsDownOnCancel(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "hi") })
	done := make(chan error, 1)
	go func() { done <- ServeMetrics(ctx, addr, h) }()
	waitFor(t, "server up", func() bool {
		res, err := http.Get("http://" + addr + "/")
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK
	})
	http.DefaultClient.CloseIdleConnections()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("ServeMetrics after cancel: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ServeMetrics did not return after cancel")
	}
	// An address that cannot be listened on is an error at once.
	if err := ServeMetrics(context.Background(), "256.0.0.1:1", h); err == nil {
		t.Fatal("ServeMetrics on a bad address: nil error")
	}
}

func TestMetricsListenConfig(t *testing.T) {
	base := "gateway: g\netcd: {endpoints: [http://127.0.0.1:2379]}\nmqtt: {brokers: [mqtt://127.0.0.1:1883]}\ndevices: [{id: a, auth: off}]\n"
	for _, tc := range []struct {
		listen string
		ok     bool
	}{
		{"", true}, // off
		{"127.0.0.1:9464", true},
		{":9464", true},
		{"[::1]:9464", true},
		{"localhost:9464", true},
		{"127.0.0.1", false},
		{"127.0.0.1:0", false},
		{"127.0.0.1:65536", false},
		{"127.0.0.1:http", false},
		{"http://127.0.0.1:9464", false},
	} {
		c, err := ParseConfig([]byte(base + "metrics: {listen: '" + tc.listen + "'}\n"))
		switch {
		case tc.ok && err != nil:
			t.Errorf("%q: %v", tc.listen, err)
		case tc.ok && c.Metrics.Listen != tc.listen:
			t.Errorf("%q: parsed as %q", tc.listen, c.Metrics.Listen)
		case !tc.ok && (!errors.Is(err, ErrConfig) || !strings.Contains(fmtErr(err), "metrics.listen")):
			t.Errorf("%q: %v, want an error naming metrics.listen", tc.listen, err)
		}
	}
}

func fmtErr(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestPprofOnlyWhenSwitchedOn: a profiling build (-tags edgefence_pprof,
// as make test builds) serves /debug/pprof/ with metrics.pprof and not
// without it (the default).
func TestPprofOnlyWhenSwitchedOn(t *testing.T) {
	if !pprofBuild {
		t.Skip("a shipped build has no profiler: TestUnsafePprofRefused")
	}
	for _, on := range []bool{false, true} {
		cfg := &Config{Gateway: "gw-p", Etcd: EtcdConfig{Endpoints: testEtcd.Endpoints(), Prefix: "/t/" + t.Name(), LeaseTTL: 2 * time.Second},
			MQTT: MQTTConfig{Brokers: []string{"mqtt://127.0.0.1:1"}}, Metrics: MetricsConfig{Pprof: on}, Devices: devCfgs("d1")}
		ob := openOutbox(t, filepath.Join(t.TempDir(), "outbox.db"), nil)
		a, err := New(cfg, etcdClient(t), newFencePoint(), Options{Outbox: ob})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(a.MetricsHandler("test"))
		code, _ := get(t, srv, "/debug/pprof/")
		want := http.StatusNotFound
		if on {
			want = http.StatusOK
		}
		if code != want {
			t.Errorf("pprof %v: /debug/pprof/ answered %d, want %d", on, code, want)
		}
		if on {
			if code, body := get(t, srv, "/debug/pprof/profile?seconds=1"); code != http.StatusOK || len(body) == 0 {
				t.Errorf("pprof on: a 1 s CPU profile answered %d with %d bytes", code, len(body))
			}
		}
		srv.Close()
	}
}

// TestUnsafePprofRefused: a shipped build (no -tags edgefence_pprof; make
// test runs it in its shipped-build pass, with the Unsafe switches) refuses
// metrics.pprof as a config error naming the key, and serves no profiler.
func TestUnsafePprofRefused(t *testing.T) {
	if pprofBuild {
		t.Skip("a profiling build honours it")
	}
	cfg := Config{Gateway: "gw-p", Etcd: EtcdConfig{Endpoints: []string{"http://127.0.0.1:1"}},
		MQTT: MQTTConfig{Brokers: []string{"mqtt://127.0.0.1:1"}}, Metrics: MetricsConfig{Pprof: true}, Devices: devCfgs("d1")}
	err := cfg.Validate()
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Key != "metrics.pprof" || !errors.Is(err, ErrConfig) {
		t.Fatalf("Validate with metrics.pprof in a shipped build: %v, want a config error naming metrics.pprof", err)
	}
	mux := http.NewServeMux()
	servePprof(mux)
	if _, pattern := mux.Handler(httptest.NewRequest("GET", "/debug/pprof/", nil)); pattern != "" {
		t.Errorf("a shipped build serves %q", pattern)
	}
}
