package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/edgefence/edgefence/agent/bridge"
	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth/authtest"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/offline"
	"github.com/edgefence/edgefence/shadow"
	"github.com/edgefence/edgefence/transport/modbus"
	"github.com/edgefence/edgefence/transport/modbus/profile"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// Observability against real parts: embedded etcd, an in-process
// mochi broker, a simulated thermostat (sim.Fleet, the device-side shim),
// a legacy meter behind the home gateway's fence bridge (fence table on
// bbolt, MQTT-link device), the agent commanding both over MQTT with an
// outbox and the twin reconciler on.

const (
	obsThermo = "thermo-1" // simulated device with its own fence point; twins
	obsMeter  = "meter-1"  // legacy device behind the gateway fence table
	obsIdle   = "idle-1"   // configured, nothing answers: its commands stay queued
)

var obsDevices = []string{obsThermo, obsMeter, obsIdle}

// logBuffer is a goroutine-safe buffer for the agent's JSON log.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// lines parses every JSON log line so far.
func (l *logBuffer) lines(t *testing.T) []map[string]any {
	t.Helper()
	l.mu.Lock()
	data := append([]byte(nil), l.b.Bytes()...)
	l.mu.Unlock()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("log line is not JSON: %v: %s", err, sc.Bytes())
		}
		out = append(out, m)
	}
	return out
}

// obsWorld is the running setup; close order is the test's cleanup.
type obsWorld struct {
	agent  *testAgent
	srv    *httptest.Server
	logs   *logBuffer
	broker *sandbox.Broker
	topics mqtt.Topics
	app    *shadow.Store // an application writing desired states
	fleet  *sim.Fleet
}

func startObsWorld(t *testing.T) *obsWorld {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	closeCtx := func(f func(context.Context) error) {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		f(c)
	}
	w := &obsWorld{logs: &logBuffer{}, topics: mqtt.Topics{Prefix: "obs"}}
	log := slog.New(slog.NewJSONHandler(w.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	prefix := twinPrefix(t)

	br, err := sandbox.StartBroker(sandbox.BrokerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { br.Close() })
	w.broker = br
	fresh := mqtt.Config{CleanStart: true, SessionExpiry: -1}

	// The thermostat.
	fleet, err := sim.NewFleet(ctx, sim.FleetConfig{Devices: []string{obsThermo}, DataDir: t.TempDir(), Broker: br.URL(),
		Prefix: w.topics.Prefix, ClientID: "obs-fleet", MQTT: fresh})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeCtx(fleet.Close) })
	w.fleet = fleet

	// The home gateway's fence bridge in front of the meter.
	tbl, err := fence.OpenTable(filepath.Join(t.TempDir(), "fence.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tbl.Close() })
	// And a Modbus bus whose endpoint is not there (its series exist from
	// the start), with a profiled device the bridge polls in vain.
	hvac, err := profile.Load("../configs/profiles/hvac-controller.yaml")
	if err != nil {
		t.Fatal(err)
	}
	bri, err := bridge.New(bridge.Config{Table: tbl, Topics: w.topics, Logger: log,
		Devices: []bridge.Device{{ID: obsMeter, Topic: "site/" + obsMeter}, {ID: "obs-plc", Modbus: &bridge.ModbusUnit{Bus: "obs-bus", Unit: 1, Profile: hvac}}},
		Buses:   []bridge.Bus{{BusConfig: modbus.BusConfig{Name: "obs-bus", TCP: "127.0.0.1:1", Timeout: 100 * time.Millisecond}}}})
	if err != nil {
		t.Fatal(err)
	}
	bc := fresh
	bc.Brokers, bc.ClientID, bc.Subscriptions = []string{br.URL()}, "obs-home", bri.Subscriptions()
	bcli, err := mqtt.Dial(context.Background(), bc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeCtx(bcli.Close) })
	if err := bcli.AwaitSubscribed(ctx); err != nil {
		t.Fatal(err)
	}
	if err := bri.Start(context.Background(), bcli); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bri.Close() })

	// The agent's transport.
	mc := fresh
	mc.Brokers, mc.ClientID = []string{br.URL()}, "obs-agent"
	cmdr, err := mqtt.NewCommander(context.Background(), mc, w.topics, obsDevices)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeCtx(cmdr.Close) })
	if err := fleet.AwaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if err := cmdr.Client().AwaitSubscribed(ctx); err != nil {
		t.Fatal(err)
	}

	cfg := twinAgentConfig("gw-obs", prefix, br.URL(), obsDevices...)
	cfg.MQTT.Prefix = w.topics.Prefix
	cfg.Metrics.PerDevice = true
	// The operator's trust, for the trust series; the devices take plain
	// envelopes (auth: off).
	cfg.Auth = obsTrust(t)
	for i := range cfg.Devices {
		cfg.Devices[i].Auth = AuthOff
	}
	ob := openOutbox(t, filepath.Join(t.TempDir(), "outbox.db"), nil)
	w.agent = runAgent(t, cfg, etcdClient(t), cmdr, Options{Logger: log, Outbox: ob, Twins: twinStore(t, prefix, "gw-obs"),
		BridgeStatus: func() any { return bri.Stats() }})
	w.srv = httptest.NewServer(w.agent.MetricsHandler("v0.0.0-obs", bri.Collector()))
	t.Cleanup(w.srv.Close)
	w.app = twinStore(t, prefix, "app")
	waitFor(t, "agent holds its devices", holdingAll(w.agent, obsDevices))
	return w
}

// waitSample scrapes until name{labels} has the value want.
func (w *obsWorld) waitSample(t *testing.T, want float64, name string, labels ...string) {
	t.Helper()
	var last float64
	var ok bool
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if last, ok = sample(scrape(t, w.srv), name, labels...); ok && last == want {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s%v = %v (present %v), want %v", name, labels, last, ok, want)
}

// TestObservabilityEndToEnd drives a scenario and checks, in one real
// scrape after each step, that each metric appears and moves, and that
// every lease change and refusal is exactly one structured log line with
// device, token and reason.
func TestObservabilityEndToEnd(t *testing.T) {
	w := startObsWorld(t)
	a := w.agent
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	first := map[string]fence.Token{}
	for _, d := range obsDevices {
		first[d], _ = a.Holding(d)
	}

	// 1. Holding everything.
	mf := scrape(t, w.srv)
	wantSample(t, mf, 3, "edgefence_leases_held")
	wantSample(t, mf, 3, "edgefence_devices_configured")
	wantSample(t, mf, 3, "edgefence_lease_acquisitions_total")
	wantSample(t, mf, 0, "edgefence_lease_losses_total")
	wantSample(t, mf, 1, "edgefence_etcd_session_up")
	wantSample(t, mf, 1, "edgefence_etcd_sessions_total")
	wantSample(t, mf, 1, "edgefence_mqtt_connected")
	wantSample(t, mf, 1, "edgefence_twin_watching")
	wantSample(t, mf, 1, "edgefence_build_info", "version", "v0.0.0-obs")
	for _, d := range obsDevices {
		wantSample(t, mf, float64(first[d]), "edgefence_device_token", "device", d)
		wantSample(t, mf, 0, "edgefence_twin_delta_fields", "device", d)
		for _, v := range verdictNames {
			wantSample(t, mf, 0, "edgefence_device_commands_total", "device", d, "verdict", v)
		}
	}

	// 2. Commands accepted by the device shim and by the fence table.
	if _, err := a.Send(ctx, obsThermo, sim.KindPing, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Send(ctx, obsMeter, "set", mustBody(t, map[string]any{"limit": 10})); err != nil {
		t.Fatal(err)
	}
	mf = scrape(t, w.srv)
	wantSample(t, mf, 1, "edgefence_device_commands_total", "device", obsThermo, "verdict", "accepted")
	wantSample(t, mf, 1, "edgefence_device_commands_total", "device", obsMeter, "verdict", "accepted")
	wantSample(t, mf, 2, "edgefence_commands_total", "verdict", "accepted")
	wantSample(t, mf, 1, "edgefence_fence_table_commands_total", "verdict", "accepted")

	// 3. A twin that does not converge: the thermostat has no "fan", so it
	// refuses the delta (invalid) and the delta stays; without the field
	// it converges and the gauge goes back to 0.
	if _, err := w.app.UpdateDesiredAny(ctx, obsThermo, map[string]any{"setpoint": 21.5, "fan": "high"}); err != nil {
		t.Fatal(err)
	}
	w.waitSample(t, 1, "edgefence_twin_set_refused_total")
	mf = scrape(t, w.srv)
	wantSample(t, mf, 2, "edgefence_twin_delta_fields", "device", obsThermo)
	wantSample(t, mf, 1, "edgefence_twin_devices_unconverged")
	wantSample(t, mf, 1, "edgefence_device_commands_total", "device", obsThermo, "verdict", "invalid")
	if _, err := w.app.UpdateDesiredAny(ctx, obsThermo, map[string]any{"fan": nil}); err != nil {
		t.Fatal(err)
	}
	w.waitSample(t, 0, "edgefence_twin_delta_fields", "device", obsThermo)
	mf = scrape(t, w.srv)
	wantSample(t, mf, 0, "edgefence_twin_devices_unconverged")
	wantSample(t, mf, 2, "edgefence_device_commands_total", "device", obsThermo, "verdict", "accepted")
	if v, _ := sample(mf, "edgefence_twin_reported_written_total"); v < 1 {
		t.Errorf("edgefence_twin_reported_written_total = %v after convergence", v)
	}

	// 4. A newer holder reaches the meter through the fence table (a
	// second gateway's commander, its token far above ours): our next
	// command is refused stale by the table, counted for the meter only.
	intruder, err := mqtt.NewCommander(context.Background(), mqtt.Config{Brokers: []string{w.broker.URL()}, ClientID: "obs-intruder",
		CleanStart: true, SessionExpiry: -1}, w.topics, []string{obsMeter})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		intruder.Close(c)
	}()
	if err := intruder.Client().AwaitSubscribed(ctx); err != nil {
		t.Fatal(err)
	}
	newer := first[obsMeter] + 1000
	if ack, err := intruder.Send(ctx, &fence.Envelope{V: fence.Version, Device: obsMeter, Token: newer, Seq: 1, ID: "intruder-1",
		Kind: "set", Body: mustBody(t, map[string]any{"limit": 99}), Holder: "gw-other"}); err != nil || ack.Verdict != fence.Accepted {
		t.Fatalf("newer holder: %+v %v", ack, err)
	}
	ack, err := a.Send(ctx, obsMeter, "set", mustBody(t, map[string]any{"limit": 11}))
	if ack == nil || ack.Verdict != fence.Stale {
		t.Fatalf("our command after the newer holder: %+v %v", ack, err)
	}
	staleID := ack.ID
	mf = scrape(t, w.srv)
	wantSample(t, mf, 1, "edgefence_device_commands_total", "device", obsMeter, "verdict", "stale")
	wantSample(t, mf, 0, "edgefence_device_commands_total", "device", obsThermo, "verdict", "stale")
	wantSample(t, mf, 1, "edgefence_commands_total", "verdict", "stale")
	wantSample(t, mf, 1, "edgefence_fence_table_commands_total", "verdict", "stale")
	wantSample(t, mf, 2, "edgefence_fence_table_commands_total", "verdict", "accepted") // ours and the intruder's
	// Send returns on the verdict; the deposed controller stops just after.
	// The intruder's token came from no lock key of this etcd — ours still
	// holds the lock — so the agent takes it for a token regression: the
	// meter is refused, and its lock is let go.
	w.waitSample(t, 1, "edgefence_device_state", "device", obsMeter, "state", StateRefused)
	waitFor(t, "the meter's lock let go", func() bool { v, _ := sample(scrape(t, w.srv), "edgefence_lock_releases_total"); return v >= 1 })
	mf = scrape(t, w.srv)
	// The stale verdict is the loss of the meter's lock: counted once.
	wantSample(t, mf, 1, "edgefence_lease_losses_total")
	wantSample(t, mf, 1, "edgefence_token_regressions_total")

	// 5. A device nobody answers: its command waits in the outbox and the
	// device's oldest-pending age grows.
	if _, err := a.Enqueue(ctx, obsIdle, sim.KindPing, nil); err != nil {
		t.Fatal(err)
	}
	w.waitSample(t, 1, "edgefence_outbox_device_pending_commands", "device", obsIdle)
	waitFor(t, "idle-1's oldest pending age grows", func() bool {
		v, _ := sample(scrape(t, w.srv), "edgefence_outbox_device_oldest_pending_age_seconds", "device", obsIdle)
		return v > 0
	})
	mf = scrape(t, w.srv)
	if _, ok := sample(mf, "edgefence_outbox_device_oldest_pending_age_seconds", "device", obsThermo); ok {
		t.Errorf("edgefence_outbox_device_oldest_pending_age_seconds present for %s, whose queue is empty", obsThermo)
	}
	if v, _ := sample(mf, "edgefence_outbox_oldest_pending_age_seconds"); v <= 0 {
		t.Errorf("edgefence_outbox_oldest_pending_age_seconds = %v with a command pending", v)
	}

	// 6. The session is lost (lease revoked under the agent): every lock
	// is lost, then acquired again under new tokens.
	revokeSession(t, a)
	waitFor(t, "new tokens", func() bool {
		for _, d := range []string{obsThermo, obsIdle} {
			if tok, ok := a.Holding(d); !ok || tok <= first[d] {
				return false
			}
		}
		return true
	})
	mf = scrape(t, w.srv)
	wantSample(t, mf, 2, "edgefence_etcd_sessions_total")
	if v, _ := sample(mf, "edgefence_lease_losses_total"); v < 3 {
		t.Errorf("edgefence_lease_losses_total = %v after the session loss, want >= 3", v)
	}
	if v, _ := sample(mf, "edgefence_lease_acquisitions_total"); v < 5 {
		t.Errorf("edgefence_lease_acquisitions_total = %v, want >= 5", v)
	}
	tok, _ := a.Holding(obsThermo)
	wantSample(t, mf, float64(tok), "edgefence_device_token", "device", obsThermo)
	if t.Failed() {
		_, body := get(t, w.srv, "/metrics")
		t.Log(body)
	}

	// 7. Shutdown releases the locks.
	a.stop()

	// The log: one line per event, with device, token and reason.
	lines := w.logs.lines(t)
	find := func(msg string, attrs ...any) []map[string]any {
		var out []map[string]any
	next:
		for _, l := range lines {
			if l["msg"] != msg {
				continue
			}
			for i := 0; i+1 < len(attrs); i += 2 {
				k := attrs[i].(string)
				want := attrs[i+1]
				if f, ok := want.(fence.Token); ok {
					want = float64(f)
				}
				if want == nil {
					if _, has := l[k]; has {
						continue next
					}
				} else if l[k] != want {
					continue next
				}
			}
			out = append(out, l)
		}
		return out
	}
	one := func(what, msg string, attrs ...any) map[string]any {
		t.Helper()
		got := find(msg, attrs...)
		if len(got) != 1 {
			t.Errorf("%s: %d lines %q %v, want exactly one: %v", what, len(got), msg, attrs, got)
			return nil
		}
		return got[0]
	}
	for _, d := range obsDevices {
		if l := one("acquisition of "+d, "holding device", "device", d, "token", first[d]); l != nil &&
			(l["reason"] != "acquired" || l["holder"] != "gw-obs" || l["level"] != "INFO") {
			t.Errorf("acquisition line: %v", l)
		}
	}
	for _, d := range []string{obsThermo, obsIdle} {
		if l := one("session loss of "+d, "lease lost", "device", d, "token", first[d]); l != nil && !strings.Contains(l["reason"].(string), "session lost") {
			t.Errorf("loss line: %v", l)
		}
	}
	// The meter: deposed by the stale verdict, found to be a token
	// regression, its lock let go; it held nothing when the session went.
	one("meter deposed", "lease lost", "device", obsMeter, "token", first[obsMeter], "fence_token", newer)
	if l := one("meter's regression", "lease refused", "device", obsMeter, "token", first[obsMeter]); l != nil &&
		(l["fence_token"] != float64(newer) || !strings.Contains(l["reason"].(string), "token regression") || l["level"] != "ERROR") {
		t.Errorf("regression line: %v", l)
	}
	one("meter's lock let go", "lock released after a refusal", "device", obsMeter, "token", first[obsMeter])
	if got := find("lease lost", "device", obsMeter, "reason", "etcd session lost"); len(got) != 0 {
		t.Errorf("the meter's lock, let go after the refusal, lost again with the session: %v", got)
	}
	// The stale refusal: one line from the agent, one from the fence table
	// that refused it.
	if l := one("agent's stale refusal", "command refused", "id", staleID, "by", nil); l != nil &&
		(l["device"] != obsMeter || l["token"] != float64(first[obsMeter]) || l["verdict"] != "stale" || l["fence_token"] != float64(newer) || l["level"] != "WARN") {
		t.Errorf("stale refusal line: %v", l)
	}
	if l := one("fence table's stale refusal", "command refused", "id", staleID, "by", "fence table"); l != nil &&
		(l["device"] != obsMeter || l["token"] != float64(first[obsMeter]) || l["verdict"] != "stale") {
		t.Errorf("fence table refusal line: %v", l)
	}
	one("thermostat's invalid twin.set", "command refused", "device", obsThermo, "verdict", "invalid", "kind", KindTwinSet)
	// Released at shutdown: each device held, under its second token.
	for _, d := range []string{obsThermo, obsIdle} {
		if got := find("lease released", "device", d, "reason", "shutdown"); len(got) != 1 {
			t.Errorf("release of %s: %d lines, want one", d, len(got))
		}
	}
	// Every lease-change and refusal line carries device, token and a
	// reason; accepted commands are logged at debug only.
	for _, l := range lines {
		switch l["msg"] {
		case "holding device", "lease lost", "lease released", "lease refused", "lease refused again", "command refused":
			if _, ok := l["device"].(string); !ok {
				t.Errorf("no device: %v", l)
			}
			if tok, ok := l["token"].(float64); !ok || tok <= 0 {
				t.Errorf("no token: %v", l)
			}
			if r, _ := l["reason"].(string); r == "" {
				t.Errorf("no reason: %v", l)
			}
		}
		if l["verdict"] == "accepted" && l["level"] != "DEBUG" {
			t.Errorf("accepted command logged above debug: %v", l)
		}
	}
	if t.Failed() {
		for _, l := range lines {
			t.Log(l)
		}
	}
}

// TestDashboardAndDocsMatchScrape: the Grafana dashboard is valid
// Grafana structure and queries only metrics a running agent exposes, and
// docs/ARCHITECTURE.md's metric table lists exactly the edgefence_* series
// of a real scrape, with their types and labels.
func TestDashboardAndDocsMatchScrape(t *testing.T) {
	w := startObsWorld(t)
	// A command nobody answers: the per-device outbox age exists only
	// for devices with pending commands.
	if _, err := w.agent.Enqueue(context.Background(), obsIdle, sim.KindPing, nil); err != nil {
		t.Fatal(err)
	}
	w.waitSample(t, 1, "edgefence_outbox_device_pending_commands", "device", obsIdle)
	mf := scrape(t, w.srv)

	// The docs' table.
	doc, err := os.ReadFile("../docs/ARCHITECTURE.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for line := range strings.Lines(string(doc)) {
		if !strings.HasPrefix(line, "| `edgefence_") {
			continue
		}
		cells := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
		if len(cells) != 4 {
			t.Errorf("docs: metric row with %d cells, want 4: %s", len(cells), line)
			continue
		}
		name := strings.Trim(strings.TrimSpace(cells[0]), "`")
		typ := strings.TrimSpace(cells[1])
		var labels []string
		for _, m := range backticked.FindAllStringSubmatch(cells[2], -1) {
			labels = append(labels, m[1])
		}
		if documented[name] {
			t.Errorf("docs: %s listed twice", name)
		}
		documented[name] = true
		f := mf[name]
		if f == nil {
			t.Errorf("docs list %s; the scrape has no such metric", name)
			continue
		}
		if got := strings.ToLower(f.GetType().String()); got != typ {
			t.Errorf("docs: %s is a %s, the scrape says %s", name, typ, got)
		}
		var have []string
		for _, l := range f.GetMetric()[0].GetLabel() {
			have = append(have, l.GetName())
		}
		slices.Sort(have)
		slices.Sort(labels)
		if !slices.Equal(have, labels) {
			t.Errorf("docs: %s labels %v, the scrape has %v", name, labels, have)
		}
	}
	for name := range mf {
		if strings.HasPrefix(name, "edgefence_") && !documented[name] {
			t.Errorf("the scrape has %s; docs/ARCHITECTURE.md's Metrics table does not list it", name)
		}
	}

	// The dashboard.
	raw, err := os.ReadFile("../deploy/grafana/edgefence-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	type target struct {
		RefID      string `json:"refId"`
		Expr       string `json:"expr"`
		Datasource struct {
			Type string `json:"type"`
			UID  string `json:"uid"`
		} `json:"datasource"`
	}
	type panel struct {
		ID      int                       `json:"id"`
		Type    string                    `json:"type"`
		Title   string                    `json:"title"`
		GridPos *struct{ H, W, X, Y int } `json:"gridPos"`
		Targets []target                  `json:"targets"`
		Panels  []json.RawMessage         `json:"panels"`
	}
	var dash struct {
		Inputs []struct {
			Name, Type, PluginID string
		} `json:"__inputs"`
		SchemaVersion int     `json:"schemaVersion"`
		Title         string  `json:"title"`
		UID           string  `json:"uid"`
		Panels        []panel `json:"panels"`
		Templating    struct {
			List []struct {
				Name       string `json:"name"`
				Type       string `json:"type"`
				Definition string `json:"definition"`
				Datasource struct {
					UID string `json:"uid"`
				} `json:"datasource"`
			} `json:"list"`
		} `json:"templating"`
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if err := dec.Decode(&dash); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	const ds = "${DS_PROMETHEUS}"
	if len(dash.Inputs) != 1 || dash.Inputs[0].Name != "DS_PROMETHEUS" || dash.Inputs[0].Type != "datasource" || dash.Inputs[0].PluginID != "prometheus" {
		t.Errorf("dashboard __inputs %+v, want one Prometheus datasource input DS_PROMETHEUS", dash.Inputs)
	}
	if dash.SchemaVersion < 36 || dash.Title == "" || dash.UID == "" {
		t.Errorf("dashboard schemaVersion %d (want Grafana 10+, >= 36), title %q, uid %q", dash.SchemaVersion, dash.Title, dash.UID)
	}
	used := map[string][]string{} // metric → where
	use := func(where, expr string) {
		for _, n := range metricName.FindAllString(expr, -1) {
			// A histogram's series are its family's name plus a suffix.
			for _, suf := range []string{"_bucket", "_sum", "_count"} {
				if base, ok := strings.CutSuffix(n, suf); ok && mf[n] == nil && mf[base].GetType() == dto.MetricType_HISTOGRAM {
					n = base
				}
			}
			used[n] = append(used[n], where)
		}
	}
	vars := map[string]bool{}
	for _, v := range dash.Templating.List {
		vars[v.Name] = true
		if v.Type != "query" || v.Datasource.UID != ds || v.Definition == "" {
			t.Errorf("variable %s: type %q, datasource %q, query %q", v.Name, v.Type, v.Datasource.UID, v.Definition)
		}
		use("variable "+v.Name, v.Definition)
	}
	if !vars["instance"] || !vars["device"] {
		t.Errorf("dashboard variables %v, want instance and device", vars)
	}
	ids := map[int]string{}
	nPanels := 0
	for _, p := range dash.Panels {
		if p.ID <= 0 || ids[p.ID] != "" {
			t.Errorf("panel %q: id %d is not unique and positive", p.Title, p.ID)
		}
		ids[p.ID] = p.Title
		if g := p.GridPos; g == nil || g.H <= 0 || g.W <= 0 || g.X < 0 || g.Y < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q: gridPos %+v", p.Title, g)
		}
		if p.Type == "row" {
			if len(p.Panels) != 0 {
				t.Errorf("row %q is collapsed with panels inside: keep rows open", p.Title)
			}
			continue
		}
		nPanels++
		if p.Title == "" || p.Type == "" || len(p.Targets) == 0 {
			t.Errorf("panel %d %q: type %q, %d targets", p.ID, p.Title, p.Type, len(p.Targets))
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if tg.Expr == "" || tg.RefID == "" || refs[tg.RefID] || tg.Datasource.UID != ds || tg.Datasource.Type != "prometheus" {
				t.Errorf("panel %q: target %+v", p.Title, tg)
			}
			refs[tg.RefID] = true
			if len(metricName.FindAllString(tg.Expr, -1)) == 0 {
				t.Errorf("panel %q: expr %q names no metric", p.Title, tg.Expr)
			}
			use("panel "+p.Title, tg.Expr)
		}
	}
	if nPanels < 10 {
		t.Errorf("dashboard has %d panels", nPanels)
	}
	for name, where := range used {
		if mf[name] == nil {
			t.Errorf("dashboard queries %s (%s); a running agent does not expose it", name, strings.Join(where, "; "))
		}
	}
	// The panels the fencing picture needs.
	for _, name := range []string{"edgefence_device_commands_total", "edgefence_device_token", "edgefence_leases_held",
		"edgefence_devices_configured", "edgefence_devices", "edgefence_twin_devices_unconverged", "edgefence_commands_total", "edgefence_outbox_device_pending_commands",
		"edgefence_outbox_device_oldest_pending_age_seconds", "edgefence_etcd_session_up", "edgefence_mqtt_connected",
		"edgefence_mqtt_reconnects_total", "edgefence_etcd_sessions_total", "edgefence_twin_delta_fields",
		"edgefence_fence_table_commands_total", "edgefence_build_info"} {
		if used[name] == nil {
			t.Errorf("no panel shows %s", name)
		}
	}
	var unused []string
	for name := range documented {
		if used[name] == nil {
			unused = append(unused, name)
		}
	}
	slices.Sort(unused)
	t.Logf("documented metrics no panel shows: %v", unused)
}

var (
	backticked = regexp.MustCompile("`([a-z_]+)`")
	metricName = regexp.MustCompile(`\b(?:edgefence|go|process)_[a-zA-Z0-9_]+`)
)

// idleMetrics serves /metrics of an agent configured for n devices, with
// an outbox, not running: no session, so no tokens; no twins, nothing
// pending.
func idleMetrics(tb testing.TB, n int, perDevice bool) *httptest.Server {
	tb.Helper()
	devs := make([]DeviceConfig, n)
	for i := range devs {
		devs[i] = DeviceConfig{ID: fmt.Sprintf("dev-%05d", i), Auth: AuthOff}
	}
	cfg := &Config{Gateway: "gw-bench", Etcd: EtcdConfig{Endpoints: []string{"http://127.0.0.1:1"}, Prefix: "/bench", LeaseTTL: 2 * time.Second},
		MQTT: MQTTConfig{Brokers: []string{"mqtt://127.0.0.1:1"}}, Metrics: MetricsConfig{PerDevice: perDevice}, Devices: devs}
	ob, err := offline.Open(filepath.Join(tb.TempDir(), "outbox.db"), nil)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ob.Close() })
	a, err := New(cfg, nil, benchNopSender{}, Options{Outbox: ob})
	if err != nil {
		tb.Fatal(err)
	}
	srv := httptest.NewServer(a.MetricsHandler("bench"))
	tb.Cleanup(srv.Close)
	return srv
}

// TestScrapeSeriesByFleetSize counts the series of a real scrape (one per
// sample line of the text format) at 10 and 1,000 idle devices, with
// metrics.per_device off and on. Off, the edgefence_* series do not grow
// with the fleet and none has a device label; on, each idle device adds
// 13 (6 states, 6 verdicts, its outbox depth). docs/BENCHMARKS.md records
// the counts (go test -v).
func TestScrapeSeriesByFleetSize(t *testing.T) {
	count := func(n int, perDevice bool) (all, ours int) {
		_, body := get(t, idleMetrics(t, n, perDevice), "/metrics")
		labelled := 0
		for l := range strings.Lines(body) {
			if l == "\n" || strings.HasPrefix(l, "#") {
				continue
			}
			all++
			if strings.HasPrefix(l, "edgefence_") {
				ours++
				if !perDevice && strings.Contains(l, `device="`) {
					if labelled++; labelled == 1 {
						t.Errorf("per_device off, %d devices: series with a device label: %s", n, strings.TrimSpace(l))
					}
				}
			}
		}
		return all, ours
	}
	const idlePerDevice = 13
	for _, perDevice := range []bool{false, true} {
		all10, ours10 := count(10, perDevice)
		all1k, ours1k := count(1000, perDevice)
		t.Logf("per_device %-5v: 10 devices %5d series (%5d edgefence_*), 1,000 devices %5d series (%5d edgefence_*)",
			perDevice, all10, ours10, all1k, ours1k)
		want := 0
		if perDevice {
			want = idlePerDevice
		}
		if got := ours1k - ours10; got != want*990 {
			t.Errorf("per_device %v: 990 more devices add %d edgefence_* series, want %d (%d each)", perDevice, got, want*990, want)
		}
	}
}

// BenchmarkScrape measures one /metrics scrape of an agent configured for
// 10,000 idle devices (see idleMetrics), with metrics.per_device off and on.
func BenchmarkScrape(b *testing.B) {
	for _, perDevice := range []bool{false, true} {
		b.Run(fmt.Sprintf("per_device=%v", perDevice), func(b *testing.B) {
			srv := idleMetrics(b, 10000, perDevice)
			var size int
			for b.Loop() {
				res, err := srv.Client().Get(srv.URL + "/metrics")
				if err != nil {
					b.Fatal(err)
				}
				n, _ := io.Copy(io.Discard, res.Body)
				res.Body.Close()
				size = int(n)
			}
			b.ReportMetric(float64(size), "bytes/scrape")
		})
	}
}

// TestLogRefusedWithoutSending: the refusals the agent decides itself are
// one line each too — a token regression ("lease refused") and commands
// that expired in the outbox ("command refused", verdict expired,
// sent=false) — and expiries are counted per device.
func TestLogRefusedWithoutSending(t *testing.T) {
	logs := &logBuffer{}
	g := &gate{fp: newFencePoint()}
	ob := openOutbox(t, filepath.Join(t.TempDir(), offline.File), &offline.Options{TTL: 500 * time.Millisecond})
	const held = fence.Token(1 << 40)
	if err := ob.SetHeld("d1", held); err != nil { // as if a run before had held d1 under a token etcd has not reached
		t.Fatal(err)
	}
	cfg := &Config{Gateway: "gw-r", Etcd: EtcdConfig{Endpoints: testEtcd.Endpoints(), Prefix: "/t/" + t.Name(), LeaseTTL: 2 * time.Second},
		MQTT: MQTTConfig{Brokers: []string{"mqtt://127.0.0.1:1"}}, Command: CommandConfig{Timeout: 300 * time.Millisecond},
		Metrics: MetricsConfig{PerDevice: true}, Devices: devCfgs("d1", "d2")}
	a := runAgent(t, cfg, etcdClient(t), g, Options{Outbox: ob, Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	srv := httptest.NewServer(a.MetricsHandler("test"))
	defer srv.Close()
	waitFor(t, "d2 held, d1 refused", func() bool {
		st := a.Status()
		return st.Devices[0].State == StateRefused && st.Devices[1].State == StateHolding
	})
	g.down.Store(true)
	for range 3 {
		if _, err := a.Send(context.Background(), "d2", "set", nil); !errors.Is(err, ErrQueued) {
			t.Fatal(err)
		}
	}
	waitFor(t, "two expired", func() bool { n, _ := ob.Pending("d2"); return n == 1 })
	g.down.Store(false)
	waitFor(t, "head delivered", pendingZero(ob))
	// The verdict is counted just after the outbox records it.
	waitFor(t, "d2's accepted verdict counted", func() bool {
		v, _ := sample(scrape(t, srv), "edgefence_device_commands_total", "device", "d2", "verdict", "accepted")
		return v == 1
	})
	mf := scrape(t, srv)
	wantSample(t, mf, 2, "edgefence_device_commands_total", "device", "d2", "verdict", "expired")
	wantSample(t, mf, 1, "edgefence_device_commands_total", "device", "d2", "verdict", "accepted")
	wantSample(t, mf, 2, "edgefence_commands_total", "verdict", "expired")
	wantSample(t, mf, 1, "edgefence_token_regressions_total")
	wantSample(t, mf, 1, "edgefence_device_state", "device", "d1", "state", StateRefused)
	a.stop()

	var refused, expired []map[string]any
	ids := map[string]bool{}
	for _, l := range logs.lines(t) {
		switch {
		case l["msg"] == "lease refused":
			refused = append(refused, l)
		case l["msg"] == "command refused" && l["verdict"] == "expired":
			expired = append(expired, l)
			ids[l["id"].(string)] = true
		}
	}
	if len(refused) != 1 {
		t.Fatalf("lease refused: %d lines, want one: %v", len(refused), refused)
	}
	if l := refused[0]; l["device"] != "d1" || l["token"].(float64) <= 0 || !strings.Contains(l["reason"].(string), "token regression") ||
		l["max_held"] != float64(held) || l["holder"] != "gw-r" || l["level"] != "ERROR" {
		t.Errorf("lease refused line: %v", l)
	}
	if len(expired) != 2 || len(ids) != 2 {
		t.Fatalf("expired: %d lines (%d ids), want two: %v", len(expired), len(ids), expired)
	}
	for _, l := range expired {
		if l["device"] != "d2" || l["token"].(float64) <= 0 || l["reason"] == "" || l["sent"] != false || l["level"] != "WARN" {
			t.Errorf("expired line: %v", l)
		}
	}
}

// obsTrust is the auth section of an operator's root and a certificate
// for gw-obs.
func obsTrust(t *testing.T) AuthConfig {
	t.Helper()
	op := authtest.NewOperator(t)
	return siteAuth(t, op, op.Certify("gw-obs", "*"), "gw-obs")
}
