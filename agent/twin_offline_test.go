package agent

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/shadow"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// newEtcdCut puts a sandbox.CutProxy in front of target (etcd) until the
// test ends.
func newEtcdCut(t *testing.T, target string) *sandbox.CutProxy {
	t.Helper()
	p, err := sandbox.StartCutProxy(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func heal(t *testing.T, p *sandbox.CutProxy) {
	t.Helper()
	if err := p.Heal(); err != nil {
		t.Fatal(err)
	}
}

// reportedRev is one revision of a reported key, as etcd stored it.
type reportedRev struct {
	rev   int64
	State map[string]any              `json:"state"`
	Meta  map[string]shadow.FieldMeta `json:"meta"`
}

// reportedHistory returns the puts of key from revision from through
// revision to, oldest first.
func reportedHistory(t *testing.T, cli *clientv3.Client, key string, from, to int64) []reportedRev {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var hist []reportedRev
	for resp := range cli.Watch(ctx, key, clientv3.WithRev(from)) {
		if err := resp.Err(); err != nil {
			t.Fatalf("history of %s: %v", key, err)
		}
		for _, e := range resp.Events {
			if e.Type != clientv3.EventTypePut {
				t.Fatalf("reported %s deleted at %d", key, e.Kv.ModRevision)
			}
			r := reportedRev{rev: e.Kv.ModRevision}
			if err := json.Unmarshal(e.Kv.Value, &r); err != nil {
				t.Fatal(err)
			}
			hist = append(hist, r)
			if r.rev >= to {
				return hist
			}
		}
	}
	t.Fatalf("history of %s ended before revision %d", key, to)
	return nil
}

// TestTwinOfflineConverges (twins offline): the agent's etcd client
// goes through a proxy that is cut for a few seconds, shorter than the
// lease TTL. While cut, an application writes desired (straight to etcd)
// and the device changes its state locally twice: the agent queues the
// device's reports in the twin cache. After the heal, the queued reports
// reach etcd first, in order, under the agent's token (the same one: the
// lease survived); the watch resumes, the device converges to the new
// desired state, and the twin ends with an empty delta.
func TestTwinOfflineConverges(t *testing.T) {
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
		Prefix: topics.Prefix, ClientID: "twin-offline-fleet", MQTT: fresh})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		fleet.Close(c)
	})
	mc := fresh
	mc.Brokers, mc.ClientID = []string{br.URL()}, "twin-offline-agent"
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

	// The agent reaches etcd only through the proxy; the application and
	// the test's checks go straight to etcd.
	proxy := newEtcdCut(t, strings.TrimPrefix(testEtcd.Endpoint(), "http://"))
	cfg := twinAgentConfig("gw-a", prefix, br.URL(), dev)
	cfg.Etcd.Endpoints = []string{"http://" + proxy.Addr()}
	cfg.Etcd.LeaseTTL = 10 * time.Second // the cut below is much shorter
	cfg.Etcd.DialTimeout = time.Second
	pcli, err := clientv3.New(clientv3.Config{Endpoints: cfg.Etcd.Endpoints, DialTimeout: cfg.Etcd.DialTimeout, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pcli.Close() })
	cache, err := shadow.OpenCache(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cache.Close() })
	ob := openOutbox(t, filepath.Join(t.TempDir(), "outbox.db"), nil)
	a := runAgent(t, cfg, pcli, cmdr, Options{Outbox: ob,
		Twins: shadow.NewStore(pcli, shadow.StoreConfig{Prefix: prefix, Writer: "gw-a"}), TwinCache: cache})
	reportTo.Store(a.Agent)
	waitFor(t, "a holds", holdingAll(a, []string{dev}))
	token, _ := a.Holding(dev)

	direct := etcdClient(t)
	app := shadow.NewStore(direct, shadow.StoreConfig{Prefix: prefix, Writer: "app"})
	des, err := app.UpdateDesired(ctx, dev, map[string]any{"setpoint": 21}, 0)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "first desired converges", func() bool {
		doc, err := app.Get(ctx, dev)
		return err == nil && a.twinSynced(dev, des.Version) && len(doc.Delta) == 0 &&
			doc.Reported.Fields["last_token"] == float64(token)
	})
	waitFor(t, "reconciler idle", func() bool { return a.twinIdle(dev) })
	r, err := direct.Get(ctx, app.ReportedKey(dev))
	if err != nil || len(r.Kvs) != 1 {
		t.Fatalf("reported before the cut: %v %v", r, err)
	}
	beforeCut := r.Kvs[0].ModRevision
	stats := a.TwinStats()

	// Cut: the application writes desired; the device is set twice on its
	// own side (commands that do not need etcd); its reports are queued.
	proxy.Cut()
	des, err = app.UpdateDesiredAny(ctx, dev, map[string]any{"setpoint": 24})
	if err != nil {
		t.Fatal(err)
	}
	for i, mode := range []string{"cool", "auto"} {
		if _, err := a.Send(ctx, dev, sim.KindSet, mustBody(t, sim.SetBody{Mode: ptrTo(mode)})); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "device report queued", func() bool {
			ps, err := cache.Pending(dev)
			return err == nil && len(ps) == i+1
		})
	}
	ps, err := cache.Pending(dev)
	if err != nil {
		t.Fatal(err)
	}
	for i, mode := range []string{"cool", "auto"} {
		if got := ps[i].Patch["mode"]; got != mode {
			t.Fatalf("queued patch %d: mode %v, want %s (%v)", i, got, mode, ps[i].Patch)
		}
	}
	if got := reportedFields(t, app, dev); got["mode"] != "off" || got["setpoint"] != 21.0 {
		t.Fatalf("reported changed while cut: %v", got)
	}
	healedAt := time.Now()
	heal(t, proxy)
	if cc := pcli.ActiveConnection(); cc != nil {
		cc.ResetConnectBackoff() // as reattach does; the cut is short
	}

	waitFor(t, "device converges after the heal", func() bool {
		doc, err := app.Get(ctx, dev)
		st, serr := fleet.State(dev)
		return err == nil && serr == nil && a.twinSynced(dev, des.Version) && len(doc.Delta) == 0 &&
			doc.Reported.Fields["mode"] == "auto" && doc.Reported.Fields["setpoint"] == 24.0 &&
			doc.Reported.Fields["applied"] == float64(st.Applied) && st.Setpoint == 24 && st.Mode == "auto"
	})
	waitFor(t, "queue empty", func() bool {
		ps, err := cache.Pending(dev)
		return err == nil && len(ps) == 0
	})
	if tok, ok := a.Holding(dev); !ok || tok != token {
		t.Fatalf("holding %d %v after the cut, want the same token %d (the lease outlives the cut)", tok, ok, token)
	}
	s := a.TwinStats()
	if s.Queued-stats.Queued < 2 || s.Fenced != 0 || s.Sent != stats.Sent+1 {
		t.Fatalf("stats before the cut %+v, after %+v: want 2 reports queued, one twin.set, nothing fenced", stats, s)
	}

	// The history of reported since the cut: the queued reports first, in
	// the order the device made them (with the time they were queued),
	// then the convergence to desired; every field under the agent's
	// token.
	r, err = direct.Get(ctx, app.ReportedKey(dev))
	if err != nil {
		t.Fatal(err)
	}
	hist := reportedHistory(t, direct, app.ReportedKey(dev), beforeCut+1, r.Kvs[0].ModRevision)
	var modes []string
	for _, h := range hist {
		if m, _ := h.State["mode"].(string); len(modes) == 0 || modes[len(modes)-1] != m {
			modes = append(modes, m)
		}
		for p, m := range h.Meta {
			if m.Token != int64(token) || m.By != "gw-a" {
				t.Fatalf("reported %s at revision %d written by %q under token %d, want gw-a under %d", p, h.rev, m.By, m.Token, token)
			}
		}
	}
	if strings.Join(modes, ",") != "cool,auto" {
		t.Fatalf("reported modes since the cut %v, want cool then auto", modes)
	}
	if h := hist[0]; h.State["setpoint"] != 21.0 || h.Meta["/mode"].At.After(healedAt) {
		t.Fatalf("first write after the heal %+v: want the first queued report (mode cool, queued before %v)", h, healedAt)
	}
	for _, h := range hist {
		if h.State["setpoint"] == 24.0 && h.State["mode"] != "auto" {
			t.Fatalf("desired converged at revision %d before the queued reports were written: %v", h.rev, h.State)
		}
	}
}

// TestTwinOfflineDeposedQueueFenced (twins offline, I5): the cut
// outlasts the lease; another gateway takes the device over and writes
// reported. The cut-off holder (one that ignores session loss, so that it
// still tries) queued a device report meanwhile: after the heal its push
// is refused by etcd, the queue is dropped, and nothing lands under its
// old token.
func TestTwinOfflineDeposedQueueFenced(t *testing.T) {
	needUnsafeBuild(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	prefix := twinPrefix(t)
	dev := "d1"
	fp := newFencePoint()
	proxy := newEtcdCut(t, strings.TrimPrefix(testEtcd.Endpoint(), "http://"))
	cfg := twinAgentConfig("gw-a", prefix, "mqtt://127.0.0.1:1", dev)
	cfg.Etcd.Endpoints = []string{"http://" + proxy.Addr()}
	cfg.Etcd.DialTimeout = 500 * time.Millisecond
	pcli, err := clientv3.New(clientv3.Config{Endpoints: cfg.Etcd.Endpoints, DialTimeout: cfg.Etcd.DialTimeout, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pcli.Close() })
	cache, err := shadow.OpenCache(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cache.Close() })
	a := runAgent(t, cfg, pcli, fp, Options{Twins: shadow.NewStore(pcli, shadow.StoreConfig{Prefix: prefix, Writer: "gw-a"}),
		TwinCache: cache, UnsafeIgnoreSessionLoss: true})
	waitFor(t, "a holds", holdingAll(a, []string{dev}))
	ta, _ := a.Holding(dev)
	direct := etcdClient(t)
	app := shadow.NewStore(direct, shadow.StoreConfig{Prefix: prefix, Writer: "app"})
	des, err := app.UpdateDesired(ctx, dev, map[string]any{"setpoint": 21}, 0)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a converges", func() bool { return a.twinSynced(dev, des.Version) })
	waitFor(t, "a's reconciler idle", func() bool { return a.twinIdle(dev) })
	b := runAgent(t, twinAgentConfig("gw-b", prefix, "mqtt://127.0.0.1:1", dev), etcdClient(t), fp,
		Options{Twins: twinStore(t, prefix, "gw-b")})
	waitFor(t, "b waits for the lock", func() bool {
		r, err := direct.Get(ctx, a.LockPrefix(dev)+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && r.Count == 2
	})
	r, err := direct.Get(ctx, app.ReportedKey(dev))
	if err != nil || len(r.Kvs) != 1 {
		t.Fatalf("reported before the cut: %v %v", r, err)
	}
	beforeCut := r.Kvs[0].ModRevision

	// Cut: the device reports a local change to a, which queues it; a's
	// lease ends in etcd and b takes over and converges a new desired.
	proxy.Cut()
	a.DeviceState(dev, map[string]any{"setpoint": 21, "mode": "cool"})
	waitFor(t, "a queues the report", func() bool {
		ps, err := cache.Pending(dev)
		return err == nil && len(ps) == 1
	})
	waitFor(t, "b holds", holdingAll(b, []string{dev}))
	tb, _ := b.Holding(dev)
	if des, err = app.UpdateDesiredAny(ctx, dev, map[string]any{"setpoint": 23}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b converges", func() bool { return b.twinSynced(dev, des.Version) })

	// Heal: a pushes its queue under its old token; etcd refuses it.
	heal(t, proxy)
	if cc := pcli.ActiveConnection(); cc != nil {
		cc.ResetConnectBackoff()
	}
	waitFor(t, "a's push is fenced and its queue dropped", func() bool {
		ps, err := cache.Pending(dev)
		return err == nil && len(ps) == 0 && a.TwinStats().Fenced == 1
	})
	if _, _, ok := a.twin.holding(dev); ok {
		t.Fatal("a's twin controller still runs under its fenced token")
	}
	r, err = direct.Get(ctx, app.ReportedKey(dev))
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range reportedHistory(t, direct, app.ReportedKey(dev), beforeCut+1, r.Kvs[0].ModRevision) {
		if _, ok := h.State["mode"]; ok {
			t.Fatalf("a's queued report landed at revision %d: %v", h.rev, h.State)
		}
		for p, m := range h.Meta {
			if m.Token != int64(tb) || m.By != "gw-b" {
				t.Fatalf("reported %s at revision %d written by %q under token %d; since the cut only b (token %d, a had %d) may write",
					p, h.rev, m.By, m.Token, tb, ta)
			}
		}
	}
	if got := reportedFields(t, app, dev); !shadow.Equal(got, map[string]any{"setpoint": 23.0}) {
		t.Fatalf("reported %v", got)
	}
}
