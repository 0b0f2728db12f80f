package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/offline"
	"github.com/edgefence/edgefence/shadow"
	"github.com/edgefence/edgefence/transport/mqtt"
)

var twinRuns atomic.Uint64

// twinPrefix is a fresh etcd prefix for each run of a test (-count N).
func twinPrefix(t *testing.T) string { return fmt.Sprintf("/t/%s/%d", t.Name(), twinRuns.Add(1)) }

// twinStore returns a shadow.Store on the test etcd writing as writer.
func twinStore(t testing.TB, prefix, writer string) *shadow.Store {
	t.Helper()
	cli, err := testEtcd.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return shadow.NewStore(cli, shadow.StoreConfig{Prefix: prefix, Writer: writer})
}

// twinAgentConfig is an agent config for twin tests: a long command
// timeout (the machine may be busy), a short lease.
func twinAgentConfig(gw, prefix, broker string, devs ...string) *Config {
	cfg := &Config{Gateway: gw, Etcd: EtcdConfig{Endpoints: testEtcd.Endpoints(), Prefix: prefix, LeaseTTL: 2 * time.Second},
		MQTT: MQTTConfig{Brokers: []string{broker}, Prefix: "twin"}, Command: CommandConfig{Timeout: 20 * time.Second}}
	for _, d := range devs {
		cfg.Devices = append(cfg.Devices, DeviceConfig{ID: d, Auth: AuthOff})
	}
	return cfg
}

// synced reports whether a's reconciler has found dev converged at the
// current desired version (so it has acted on that version).
func (a *Agent) twinSynced(dev string, version int64) bool {
	a.twin.mu.Lock()
	defer a.twin.mu.Unlock()
	td := a.twin.devs[dev]
	return td != nil && td.synced == version
}

// twinIdle reports whether no reconciler runs for dev.
func (a *Agent) twinIdle(dev string) bool {
	a.twin.mu.Lock()
	defer a.twin.mu.Unlock()
	td := a.twin.devs[dev]
	return td == nil || !td.running
}

func ptrTo[T any](v T) *T { return &v }

func mustBody(t *testing.T, v any) []byte {
	t.Helper()
	b, err := fence.EncodeBody(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func reportedFields(t *testing.T, s *shadow.Store, dev string) map[string]any {
	t.Helper()
	st, err := s.GetReported(context.Background(), dev)
	if err != nil {
		t.Fatal(err)
	}
	return st.Fields
}

// TestTwinConvergesEndToEnd: desired put → twin.set through the outbox, a
// real broker and a simulated thermostat → reported written under the
// holder's token; a repeated desired value sends nothing; a field the
// device does not know is refused once, not resent.
func TestTwinConvergesEndToEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	prefix := twinPrefix(t)
	dev := "thermo-1"
	br, err := sandbox.StartBroker(sandbox.BrokerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { br.Close() })
	topics := mqtt.Topics{Prefix: "twin"}
	fresh := mqtt.Config{CleanStart: true, SessionExpiry: -1}
	fleet, err := sim.NewFleet(ctx, sim.FleetConfig{Devices: []string{dev}, DataDir: t.TempDir(), Broker: br.URL(),
		Prefix: topics.Prefix, ClientID: "twin-fleet", MQTT: fresh})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		fleet.Close(c)
	})
	mc := fresh
	mc.Brokers, mc.ClientID = []string{br.URL()}, "twin-agent"
	// Device state reports go to the agent, as edgefence run wires them.
	var reportTo atomic.Pointer[Agent]
	mc.Subscriptions = []mqtt.Subscription{{Filter: topics.State("+"), Handler: func(m mqtt.Message) {
		d, _, ok := topics.Parse(m.Topic)
		fields, err := shadow.DecodeCBOR(m.Payload, shadow.Limits{})
		if a := reportTo.Load(); ok && err == nil && a != nil {
			a.DeviceState(d, fields)
		}
	}}}
	cmdr, err := mqtt.NewCommander(context.Background(), mc, topics, []string{dev})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		cmdr.Close(c)
	})
	if err := fleet.AwaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if err := cmdr.Client().AwaitSubscribed(ctx); err != nil {
		t.Fatal(err)
	}

	agentStore := twinStore(t, prefix, "gw-a")
	ob := openOutbox(t, filepath.Join(t.TempDir(), "outbox.db"), nil)
	a := runAgent(t, twinAgentConfig("gw-a", prefix, br.URL(), dev), etcdClient(t), cmdr,
		Options{Outbox: ob, Twins: agentStore})
	reportTo.Store(a.Agent)
	waitFor(t, "a holds", holdingAll(a, []string{dev}))
	token, _ := a.Holding(dev)

	app := twinStore(t, prefix, "app")
	want := map[string]any{"setpoint": 22.5, "mode": "heat"}
	des, err := app.UpdateDesired(ctx, dev, want, 0)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "device converges and reported is written", func() bool {
		doc, err := app.Get(ctx, dev)
		return err == nil && len(doc.Delta) == 0 && len(doc.Reported.Fields) > 0
	})
	st, err := fleet.State(dev)
	if err != nil || st.Setpoint != 22.5 || st.Mode != "heat" || st.LastToken != token {
		t.Fatalf("device state %+v, %v (token %d)", st, err, token)
	}
	// The device's own state report follows the ack: reported gains the
	// fields only the device knows.
	waitFor(t, "device report written", func() bool {
		return reportedFields(t, app, dev)["last_token"] == float64(token)
	})
	rep, err := app.GetReported(ctx, dev)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range want {
		if !shadow.Equal(rep.Fields[k], v) {
			t.Fatalf("reported %v, want %v", rep.Fields, want)
		}
	}
	for _, p := range []string{"/setpoint", "/mode"} {
		if m := rep.Meta[p]; m.Token != int64(token) || m.By != "gw-a" {
			t.Fatalf("reported meta %s = %+v, want token %d by gw-a", p, m, token)
		}
	}
	waitFor(t, "reconciler sees convergence", func() bool { return a.twinSynced(dev, des.Version) })
	// ReportState counts the report after etcd's commit, which the
	// application can see first.
	waitFor(t, "device report counted", func() bool { return a.TwinStats().Reports > 0 })
	if s := a.TwinStats(); s.Sent != 1 || s.Written != 1 || s.Fenced != 0 || s.Reports == 0 {
		t.Fatalf("stats after one change: %+v", s)
	}

	// The same desired value again: a new version, an empty delta,
	// nothing sent.
	des, err = app.UpdateDesired(ctx, dev, want, des.Version)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "reconciler looks at the repeat", func() bool { return a.twinSynced(dev, des.Version) })
	if s := a.TwinStats(); s.Sent != 1 || s.Written != 1 {
		t.Fatalf("a repeated desired value sent something: %+v", s)
	}

	// One field changes: only it is sent.
	applied := fleet.Stats().Accepted
	if des, err = app.UpdateDesiredAny(ctx, dev, map[string]any{"setpoint": 18}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "second change converges", func() bool { return a.twinSynced(dev, des.Version) })
	if st, _ := fleet.State(dev); st.Setpoint != 18 || st.Mode != "heat" || fleet.Stats().Accepted != applied+1 {
		t.Fatalf("device state %+v after the second change (accepted %d, before %d)", st, fleet.Stats().Accepted, applied)
	}
	if got := reportedFields(t, app, dev); got["setpoint"] != 18.0 || got["mode"] != "heat" {
		t.Fatalf("reported %v", got)
	}

	// A change made on the device's side (here a plain set command, not
	// from the twin): its state report updates reported, the difference
	// shows as delta, and the reconciler leaves it alone.
	sentBefore := a.TwinStats().Sent
	if _, err := a.Send(ctx, dev, sim.KindSet, mustBody(t, sim.SetBody{Setpoint: ptrTo(30.0)})); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "local change reported", func() bool { return reportedFields(t, app, dev)["setpoint"] == 30.0 })
	waitFor(t, "reconciler idle", func() bool { return a.twinIdle(dev) })
	if doc, err := app.Get(ctx, dev); err != nil || !shadow.Equal(doc.Delta, map[string]any{"setpoint": 18.0}) {
		t.Fatalf("delta after a local change: %+v %v", doc, err)
	}
	if s := a.TwinStats(); s.Sent != sentBefore {
		t.Fatalf("a local change caused a twin.set: %+v", s)
	}

	// A field the thermostat does not have: refused as invalid, once.
	if _, err = app.UpdateDesiredAny(ctx, dev, map[string]any{"fan": "high"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "device refuses the unknown field", func() bool { return a.TwinStats().Refused == 1 })
	sent := a.TwinStats().Sent
	// A later good change still goes through (with the bad field, the
	// whole delta is refused: the application must remove it).
	if des, err = app.UpdateDesiredAny(ctx, dev, map[string]any{"fan": nil, "setpoint": 19}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "third change converges", func() bool { return a.twinSynced(dev, des.Version) })
	if s := a.TwinStats(); s.Sent != sent+1 || s.Refused != 1 {
		t.Fatalf("stats: %+v (sent before %d)", s, sent)
	}
	if st, _ := fleet.State(dev); st.Setpoint != 19 {
		t.Fatalf("device state %+v", st)
	}
}

// ackGate passes commands to the fence point at once but, while armed,
// holds the ack back until released: a holder frozen after the device
// accepted its command and before it wrote reported.
type ackGate struct {
	next    Sender
	armed   atomic.Bool
	held    chan *fence.Envelope
	release chan struct{}
}

func (g *ackGate) Send(ctx context.Context, env *fence.Envelope) (*fence.Ack, error) {
	ack, err := g.next.Send(ctx, env)
	if err != nil || !g.armed.Load() {
		return ack, err
	}
	g.held <- env
	select {
	case <-g.release:
		return ack, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// TestTwinDeposedHolderFenced (invariant I5): holder A's twin.set is
// accepted by the device, then A freezes past its lease; B takes over and
// reconciles; when A resumes, etcd refuses its reported write, the twin
// shows only B's writes, and A's twin controller for the device stops.
func TestTwinDeposedHolderFenced(t *testing.T) {
	needUnsafeBuild(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	prefix := twinPrefix(t)
	dev := "d1"
	fp := newFencePoint()
	gate := &ackGate{next: fp, held: make(chan *fence.Envelope, 1), release: make(chan struct{})}
	gate.armed.Store(true)
	a := runAgent(t, twinAgentConfig("gw-a", prefix, "mqtt://127.0.0.1:1", dev), etcdClient(t), gate,
		Options{Twins: twinStore(t, prefix, "gw-a"), UnsafeIgnoreSessionLoss: true})
	waitFor(t, "a holds", holdingAll(a, []string{dev}))
	ta, _ := a.Holding(dev)

	app := twinStore(t, prefix, "app")
	if _, err := app.UpdateDesired(ctx, dev, map[string]any{"setpoint": 21}, 0); err != nil {
		t.Fatal(err)
	}
	var envA *fence.Envelope
	select {
	case envA = <-gate.held:
	case <-ctx.Done():
		t.Fatal("a's twin.set never reached the device")
	}
	if envA.Kind != KindTwinSet || envA.Token != ta {
		t.Fatalf("a sent %+v", envA)
	}

	// A is frozen: its lease ends, B (waiting in line for the lock) takes
	// over and reconciles.
	b := runAgent(t, twinAgentConfig("gw-b", prefix, "mqtt://127.0.0.1:1", dev), etcdClient(t), fp,
		Options{Twins: twinStore(t, prefix, "gw-b")})
	waitFor(t, "b waits for the lock", func() bool {
		r, err := a.cli.Get(ctx, a.LockPrefix(dev)+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && r.Count == 2
	})
	revokeSession(t, a)
	waitFor(t, "b holds", holdingAll(b, []string{dev}))
	tb, _ := b.Holding(dev)
	waitFor(t, "b writes reported", func() bool { return b.TwinStats().Written == 1 })
	before, err := app.GetReported(ctx, dev)
	if err != nil {
		t.Fatal(err)
	}

	// A resumes: the device's ack arrives, its reported write is refused.
	close(gate.release)
	waitFor(t, "a's reported write is fenced", func() bool { return a.TwinStats().Fenced == 1 })
	after, err := app.GetReported(ctx, dev)
	if err != nil {
		t.Fatal(err)
	}
	if after.Version != before.Version || !shadow.Equal(after.Fields, map[string]any{"setpoint": 21.0}) {
		t.Fatalf("reported moved after the fenced write: %+v → %+v", before, after)
	}
	for p, m := range after.Meta {
		if m.Token != int64(tb) || m.By != "gw-b" {
			t.Fatalf("reported field %s written by %s under token %d; only b (token %d) may write", p, m.By, m.Token, tb)
		}
	}
	// The direct write under A's key and token is refused as well.
	key, tok, ok := a.holder(dev)
	if !ok || tok != ta {
		t.Fatalf("frozen a lost its controller: %q %d %v", key, tok, ok)
	}
	if _, err := app.UpdateReported(ctx, dev, map[string]any{"setpoint": 5}, key, int64(ta)); !errors.Is(err, shadow.ErrFenced) {
		t.Fatalf("write under a's token: %v, want ErrFenced", err)
	}

	// A's controller has stopped: a new desired value is B's alone.
	gate.armed.Store(false)
	sentA := a.TwinStats().Sent
	des, err := app.UpdateDesiredAny(ctx, dev, map[string]any{"setpoint": 23})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b converges the new value", func() bool { return b.twinSynced(dev, des.Version) })
	waitFor(t, "a has seen the new value", func() bool {
		a.twin.mu.Lock()
		defer a.twin.mu.Unlock()
		return a.twin.devs[dev].desired.Version == des.Version
	})
	a.twin.kick(dev) // even when asked, a does nothing under its fenced token
	waitFor(t, "a's reconciler idle", func() bool { return a.twinIdle(dev) })
	if s := a.TwinStats(); s.Sent != sentA || s.Written != 0 {
		t.Fatalf("fenced a kept reconciling: %+v", s)
	}
	for _, e := range fp.appliedOf(dev) {
		if e.Token == ta && e.ID != envA.ID {
			t.Fatalf("a's command %s applied after a was fenced", e.ID)
		}
	}
	if got := reportedFields(t, app, dev); !shadow.Equal(got, map[string]any{"setpoint": 23.0}) {
		t.Fatalf("reported %v", got)
	}
}

// TestTwinLocalChangeStays: a device's own report updates reported and
// shows as delta without a command; desired wins again when the
// application writes it (even with the same value).
func TestTwinLocalChangeStays(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	prefix := twinPrefix(t)
	dev := "d1"
	fp := newFencePoint()
	a := runAgent(t, twinAgentConfig("gw-a", prefix, "mqtt://127.0.0.1:1", dev), etcdClient(t), fp,
		Options{Twins: twinStore(t, prefix, "gw-a")})
	waitFor(t, "a holds", holdingAll(a, []string{dev}))
	app := twinStore(t, prefix, "app")
	des, err := app.UpdateDesired(ctx, dev, map[string]any{"setpoint": 21, "mode": "heat"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "converged", func() bool { return a.twinSynced(dev, des.Version) })

	// An operator turns the knob on the device.
	if err := a.ReportState(ctx, dev, map[string]any{"setpoint": 25}); err != nil {
		t.Fatal(err)
	}
	doc, err := app.Get(ctx, dev)
	if err != nil {
		t.Fatal(err)
	}
	if !shadow.Equal(doc.Delta, map[string]any{"setpoint": 21.0}) {
		t.Fatalf("delta after a local change: %v", doc.Delta)
	}
	a.twin.kick(dev)
	waitFor(t, "reconciler idle", func() bool { return a.twinIdle(dev) })
	if s := a.TwinStats(); s.Sent != 1 || s.Reports != 1 {
		t.Fatalf("a local change caused a command: %+v", s)
	}
	// The application says so again: desired wins.
	des, err = app.UpdateDesired(ctx, dev, map[string]any{"setpoint": 21}, des.Version)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "converged again", func() bool { return a.twinSynced(dev, des.Version) })
	if s := a.TwinStats(); s.Sent != 2 {
		t.Fatalf("stats %+v", s)
	}
	applied := fp.appliedOf(dev)
	last := applied[len(applied)-1]
	var body map[string]any
	if err := fence.DecodeBody(last.Body, &body); err != nil || fmt.Sprint(body) != "map[setpoint:21]" {
		t.Fatalf("second twin.set body %v (%v): want only the delta", body, err)
	}
	// A device the agent does not know: refused.
	if err := a.ReportState(ctx, "nope", map[string]any{"x": 1}); !errors.Is(err, ErrUnknownDevice) {
		t.Fatalf("unknown device: %v", err)
	}
}

// TestTwinReacquireReadsReported: an agent that takes a device back under a
// new token must not trust what it remembers of reported — another holder
// may have written since (shadow.Store.Forget on acquisition). A converges
// the device to 21; B takes over and the device reports a local change to
// 25; A takes the device back and, seeing reported 25 in etcd (not the 21
// it wrote itself), sends the delta and brings reported back to 21. Without
// the Forget, A computes an empty delta from its memory and sends nothing.
func TestTwinReacquireReadsReported(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	prefix := twinPrefix(t)
	dev := "d1"
	fp := newFencePoint()
	a := runAgent(t, twinAgentConfig("gw-a", prefix, "mqtt://127.0.0.1:1", dev), etcdClient(t), fp,
		Options{Twins: twinStore(t, prefix, "gw-a")})
	waitFor(t, "a holds", holdingAll(a, []string{dev}))
	app := twinStore(t, prefix, "app")
	des, err := app.UpdateDesired(ctx, dev, map[string]any{"setpoint": 21}, 0)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a converges", func() bool { return a.twinSynced(dev, des.Version) })

	// B waits in line, A's session ends, B holds and the device reports a
	// local change through B.
	b := runAgent(t, twinAgentConfig("gw-b", prefix, "mqtt://127.0.0.1:1", dev), etcdClient(t), fp,
		Options{Twins: twinStore(t, prefix, "gw-b")})
	waitFor(t, "b waits for the lock", func() bool {
		r, err := a.cli.Get(ctx, a.LockPrefix(dev)+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && r.Count == 2
	})
	ta, _ := a.Holding(dev)
	revokeSession(t, a)
	waitFor(t, "b holds", holdingAll(b, []string{dev}))
	if err := b.ReportState(ctx, dev, map[string]any{"setpoint": 25}); err != nil {
		t.Fatal(err)
	}
	if got := reportedFields(t, app, dev); !shadow.Equal(got, map[string]any{"setpoint": 25.0}) {
		t.Fatalf("reported after b's report: %v", got)
	}

	// A campaigned again behind B: B's session ends, A holds under a new
	// token and reconciles from etcd's reported.
	waitFor(t, "a waits for the lock", func() bool {
		r, err := a.cli.Get(ctx, a.LockPrefix(dev)+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && r.Count == 2
	})
	sentA := a.TwinStats().Sent
	revokeSession(t, b)
	waitFor(t, "a holds again", holdingAll(a, []string{dev}))
	ta2, _ := a.Holding(dev)
	if ta2 <= ta {
		t.Fatalf("a's token %d after taking the device back, not above %d", ta2, ta)
	}
	waitFor(t, "a brings reported back to desired", func() bool {
		return shadow.Equal(reportedFields(t, app, dev), map[string]any{"setpoint": 21.0})
	})
	if s := a.TwinStats(); s.Sent != sentA+1 {
		t.Fatalf("a sent %d twin.set after taking the device back, want 1: %+v", s.Sent-sentA, s)
	}
	applied := fp.appliedOf(dev)
	if last := applied[len(applied)-1]; last.Token != ta2 || last.Kind != KindTwinSet {
		t.Fatalf("last applied %+v, want a's twin.set under token %d", last, ta2)
	}
}

// BenchmarkTwinConvergence measures desired put → twin.set through the
// outbox, a real broker and simulated thermostats → reported written in
// etcd (seen by a watch), for 1 and 100 devices changing at once; beside
// it, in the same run, a bare etcd put → watch event.
//
//	go test -run '^$' -bench TwinConvergence -benchtime 200x ./agent/
func BenchmarkTwinConvergence(b *testing.B) {
	br, err := sandbox.StartBroker(sandbox.BrokerConfig{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { br.Close() })
	for _, n := range []int{1, 100} {
		b.Run(fmt.Sprintf("devices=%d", n), func(b *testing.B) {
			benchTwins(b, br.URL(), n)
		})
	}
}

func benchTwins(b *testing.B, url string, n int) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	prefix := fmt.Sprintf("/bench/twin/%d", benchPrefixes.Add(1))
	devs := make([]string, n)
	for i := range devs {
		devs[i] = fmt.Sprintf("dev-%03d", i)
	}
	topics := mqtt.Topics{Prefix: "twin"}
	fresh := mqtt.Config{CleanStart: true, SessionExpiry: -1}
	fleet, err := sim.NewFleet(ctx, sim.FleetConfig{Devices: devs, DataDir: b.TempDir(), Broker: url, Prefix: topics.Prefix,
		ClientID: "twin-bench-fleet" + prefix, MQTT: fresh})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		fleet.Close(c)
	})
	mc := fresh
	mc.Brokers, mc.ClientID = []string{url}, "twin-bench-agent"+prefix
	cmdr, err := mqtt.NewCommander(context.Background(), mc, topics, devs)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		cmdr.Close(c)
	})
	if err := fleet.AwaitReady(ctx); err != nil {
		b.Fatal(err)
	}
	if err := cmdr.Client().AwaitSubscribed(ctx); err != nil {
		b.Fatal(err)
	}
	cli, err := testEtcd.Client()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cli.Close() })
	ob, err := offline.Open(filepath.Join(b.TempDir(), "outbox.db"), nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ob.Close() })
	cfg := twinAgentConfig("gw-bench", prefix, url, devs...)
	cfg.Etcd.LeaseTTL = 10 * time.Second
	store := shadow.NewStore(cli, shadow.StoreConfig{Prefix: prefix, Writer: "gw-bench"})
	a, err := New(cfg, cli, cmdr, Options{Outbox: ob, Twins: store})
	if err != nil {
		b.Fatal(err)
	}
	actx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(actx) }()
	b.Cleanup(func() { stop(); <-done })
	waitHeld(b, a, n)

	// One watch of every key under the prefix; reported puts are matched
	// by device and setpoint, bare puts by key.
	type seen struct {
		key string
		sp  float64
		at  time.Time
	}
	events := make(chan seen, 4*n)
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	wch := cli.Watch(wctx, prefix+"/", clientv3.WithPrefix())
	wdone := make(chan struct{})
	go func() {
		defer close(wdone)
		for resp := range wch {
			now := time.Now()
			for _, e := range resp.Events {
				if e.Type != clientv3.EventTypePut {
					continue
				}
				k := string(e.Kv.Key)
				s := seen{key: k, at: now}
				if strings.HasSuffix(k, "/twin/reported") {
					var r struct {
						State map[string]any `json:"state"`
					}
					if json.Unmarshal(e.Kv.Value, &r) != nil {
						continue
					}
					s.sp, _ = r.State["setpoint"].(float64)
				} else if !strings.Contains(k, "/bare/") {
					continue
				}
				select {
				case events <- s:
				case <-wctx.Done():
					return
				}
			}
		}
	}()
	defer func() { wcancel(); <-wdone }()
	app := shadow.NewStore(cli, shadow.StoreConfig{Prefix: prefix, Writer: "app"})

	var rounds int // every round a new setpoint, across b.N runs
	round := func(b *testing.B, bare bool) []time.Duration {
		rounds++
		i := rounds
		sp := 21 + float64(i%2)
		starts := make(map[string]time.Time, n)
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, d := range devs {
			wg.Go(func() {
				key := store.ReportedKey(d)
				if bare {
					key = prefix + "/bare/" + d
				}
				mu.Lock()
				starts[key] = time.Now()
				mu.Unlock()
				var err error
				if bare {
					_, err = cli.Put(ctx, key, fmt.Sprint(sp))
				} else {
					_, err = app.UpdateDesiredAny(ctx, d, map[string]any{"setpoint": sp})
				}
				if err != nil {
					b.Error(err)
				}
			})
		}
		wg.Wait()
		lat := make([]time.Duration, 0, n)
		for len(lat) < n {
			select {
			case s := <-events:
				mu.Lock()
				st, ok := starts[s.key]
				if ok && (bare || s.sp == sp) {
					lat = append(lat, s.at.Sub(st))
					delete(starts, s.key)
				}
				mu.Unlock()
			case <-ctx.Done():
				b.Fatalf("round %d: %d of %d devices converged", i, len(lat), n)
			}
		}
		return lat
	}
	for _, bare := range []bool{true, false} {
		name := "desired-put-to-reported"
		if bare {
			name = "bare-etcd-put-watch"
		}
		b.Run(name, func(b *testing.B) {
			var lat []time.Duration
			sent := a.TwinStats().Sent
			b.ResetTimer()
			for range b.N {
				lat = append(lat, round(b, bare)...)
			}
			b.StopTimer()
			reportLatency(b, lat)
			if !bare {
				b.ReportMetric(float64(a.TwinStats().Sent-sent)/float64(b.N*n), "twin.set/update")
			}
		})
	}
}

// TestTwinReportedQueuedWhileEtcdAway: a reported write etcd cannot take
// in time is queued in the twin cache (durably) and pushed, fenced, under
// the token held; a push refused by etcd (no longer the holder) drops the
// queue and stops the worker for that token.
func TestTwinReportedQueuedWhileEtcdAway(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	prefix := twinPrefix(t)
	dev := "d1"
	cache, err := shadow.OpenCache(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cache.Close() })
	live := twinStore(t, prefix, "gw-a")
	cfg := twinAgentConfig("gw-a", prefix, "mqtt://127.0.0.1:1", dev)
	cfg.Etcd.DialTimeout = 300 * time.Millisecond
	a := runAgent(t, cfg, etcdClient(t), newFencePoint(), Options{Twins: live, TwinCache: cache})
	waitFor(t, "a holds", holdingAll(a, []string{dev}))
	waitFor(t, "reconciler idle", func() bool { return a.twinIdle(dev) })
	key, token, _ := a.holder(dev)

	// etcd out of reach: a store whose client has nowhere to go.
	dead, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}, DialTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dead.Close() })
	a.twin.mu.Lock()
	a.twin.store = shadow.NewStore(dead, shadow.StoreConfig{Prefix: prefix, Writer: "gw-a"})
	a.twin.mu.Unlock()
	for _, p := range []map[string]any{{"setpoint": 20}, {"setpoint": 21, "mode": "heat"}} {
		if st, ok := a.twin.writeReported(ctx, dev, p, key, token); !ok || st != nil {
			t.Fatalf("write with etcd away: %v %v, want queued", st, ok)
		}
	}
	if ps, err := cache.Pending(dev); err != nil || len(ps) != 2 {
		t.Fatalf("queued %d patches (%v), want 2", len(ps), err)
	}

	// etcd is back: the queue goes out in order, under our token.
	a.twin.mu.Lock()
	a.twin.store = live
	a.twin.mu.Unlock()
	if !a.twin.flushReported(ctx, dev) {
		t.Fatal("flush failed")
	}
	rep, err := live.GetReported(ctx, dev)
	if err != nil {
		t.Fatal(err)
	}
	if !shadow.Equal(rep.Fields, map[string]any{"setpoint": 21.0, "mode": "heat"}) || rep.Meta["/setpoint"].Token != int64(token) {
		t.Fatalf("reported after flush: %+v", rep)
	}
	if s := a.TwinStats(); s.Queued != 2 {
		t.Fatalf("stats %+v", s)
	}

	// Queued, then deposed: the push is refused by etcd (I5), the queue
	// is dropped, and the worker stops under this token.
	if _, err := cache.Enqueue(dev, map[string]any{"setpoint": 5}); err != nil {
		t.Fatal(err)
	}
	// The lock key disappears under the agent (as when its lease ends)
	// before it has noticed: its controller still has the old token.
	if _, err := a.cli.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	if a.twin.flushReported(ctx, dev) {
		t.Fatal("flush under a revoked lock succeeded")
	}
	if ps, err := cache.Pending(dev); err != nil || len(ps) != 0 {
		t.Fatalf("queue after a fenced flush: %d (%v), want dropped", len(ps), err)
	}
	if _, _, ok := a.twin.holding(dev); ok || a.TwinStats().Fenced != 1 {
		t.Fatalf("worker not stopped under the fenced token: %+v", a.TwinStats())
	}
	if got := reportedFields(t, live, dev); got["setpoint"] != 21.0 {
		t.Fatalf("reported %v: the deposed holder's patch landed", got)
	}
}

// TestTwinQueueOfOlderTokenDropped: reported patches queued under an
// older token (a previous run, or a controller since lost) are not pushed
// under a new token: the agent drops them when it acquires the device.
func TestTwinQueueOfOlderTokenDropped(t *testing.T) {
	prefix := twinPrefix(t)
	dev := "d1"
	cache, err := shadow.OpenCache(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cache.Close() })
	if _, err := cache.Enqueue(dev, map[string]any{"setpoint": 5}); err != nil {
		t.Fatal(err)
	}
	live := twinStore(t, prefix, "gw-a")
	a := runAgent(t, twinAgentConfig("gw-a", prefix, "mqtt://127.0.0.1:1", dev), etcdClient(t), newFencePoint(), Options{Twins: live, TwinCache: cache})
	waitFor(t, "a holds", holdingAll(a, []string{dev}))
	waitFor(t, "queue dropped", func() bool { ps, err := cache.Pending(dev); return err == nil && len(ps) == 0 })
	waitFor(t, "reconciler idle", func() bool { return a.twinIdle(dev) })
	if got := reportedFields(t, live, dev); got["setpoint"] != nil {
		t.Fatalf("reported %v: a patch queued under an older token was pushed", got)
	}
}
