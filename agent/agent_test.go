package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/offline"
)

// fencePoint is an in-process fence point for lease tests: the real admit rule
// over in-memory marks. The MQTT path and the durable shim are tested end to
// end in cmd/edgefence.
type fencePoint struct {
	mu      sync.Mutex
	marks   map[string]fence.Mark
	applied map[string][]fence.Envelope
	gates   map[string]chan struct{} // a device's commands wait until its gate closes (or their ack deadline)
}

func newFencePoint() *fencePoint {
	return &fencePoint{marks: map[string]fence.Mark{}, applied: map[string][]fence.Envelope{}}
}

func (f *fencePoint) Send(ctx context.Context, env *fence.Envelope) (*fence.Ack, error) {
	f.mu.Lock()
	gate := f.gates[env.Device]
	f.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	v, m := fence.Admit(f.marks[env.Device], env.Token, env.Seq)
	if v == fence.Accepted {
		f.marks[env.Device] = m
		f.applied[env.Device] = append(f.applied[env.Device], *env)
	}
	ack := fence.NewAck(env, v, m, "")
	return &ack, nil
}

var testEtcd *sandbox.Etcd

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "agent-etcd-")
	if err != nil {
		panic(err)
	}
	testEtcd, err = sandbox.StartEtcd(context.Background(), sandbox.EtcdConfig{Dir: dir, Fast: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, "start etcd:", err)
		os.Exit(1)
	}
	code := m.Run()
	testEtcd.Close()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func etcdClient(t testing.TB) *clientv3.Client {
	t.Helper()
	c, err := testEtcd.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// testAgent runs an agent until the test ends (or stop is called).
type testAgent struct {
	*Agent
	cli  *clientv3.Client
	stop func()
}

func startAgent(t *testing.T, gw, prefix string, devs []string, fp *fencePoint, o Options) *testAgent {
	t.Helper()
	cfg := &Config{Gateway: gw, Etcd: EtcdConfig{Endpoints: testEtcd.Endpoints(), Prefix: prefix, LeaseTTL: 2 * time.Second},
		MQTT: MQTTConfig{Brokers: []string{"mqtt://127.0.0.1:1"}}, Command: CommandConfig{Timeout: 5 * time.Second}}
	for _, d := range devs {
		cfg.Devices = append(cfg.Devices, DeviceConfig{ID: d, Auth: AuthOff})
	}
	return runAgent(t, cfg, etcdClient(t), fp, o)
}

// needUnsafeBuild skips a test of UnsafeIgnoreSessionLoss outside a build
// with -tags edgefence_unsafe (make test has it; under CI=true it fails).
func needUnsafeBuild(t *testing.T) {
	t.Helper()
	if unsafeBuild {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("needs -tags edgefence_unsafe (make test)")
	}
	t.Skip("needs -tags edgefence_unsafe (make test)")
}

// TestUnsafeOptionRefused: a shipped build refuses the switch.
func TestUnsafeOptionRefused(t *testing.T) {
	if unsafeBuild {
		t.Skip("a test build honours it")
	}
	cfg := &Config{Gateway: "gw", Etcd: EtcdConfig{Endpoints: []string{"http://127.0.0.1:1"}},
		MQTT: MQTTConfig{Brokers: []string{"mqtt://127.0.0.1:1"}}, Devices: []DeviceConfig{{ID: "d1", Auth: AuthOff}}}
	if _, err := newAgent(t, cfg, nil, newFencePoint(), Options{UnsafeIgnoreSessionLoss: true}); !errors.Is(err, ErrUnsafeBuild) {
		t.Fatalf("New: %v", err)
	}
}

// newAgent is New with a fresh outbox in a temporary directory unless o
// has one.
func newAgent(tb testing.TB, cfg *Config, cli *clientv3.Client, s Sender, o Options) (*Agent, error) {
	tb.Helper()
	if o.Outbox == nil {
		ob, err := offline.Open(filepath.Join(tb.TempDir(), offline.File), nil)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { ob.Close() })
		o.Outbox = ob
	}
	return New(cfg, cli, s, o)
}

// runAgent runs an agent for cfg until the test ends (or stop is called).
func runAgent(t *testing.T, cfg *Config, cli *clientv3.Client, s Sender, o Options) *testAgent {
	t.Helper()
	a, err := newAgent(t, cfg, cli, s, o)
	if err != nil {
		t.Fatal(err)
	}
	ta := runStarted(t, a)
	ta.cli = cli
	return ta
}

// waitFor polls cond until it holds or the deadline passes. It never fails a
// test for slowness below a generous bound.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func holdingAll(a *testAgent, devs []string) func() bool {
	return func() bool {
		for _, d := range devs {
			if _, ok := a.Holding(d); !ok {
				return false
			}
		}
		return true
	}
}

func TestTokenIsCreateRevisionOfOwnKey(t *testing.T) {
	prefix := "/t/" + t.Name()
	fp := newFencePoint()
	a := startAgent(t, "gw-a", prefix, []string{"d1"}, fp, Options{})
	waitFor(t, "a holds d1", holdingAll(a, []string{"d1"}))
	b := startAgent(t, "gw-b", prefix, []string{"d1"}, fp, Options{})
	// b campaigns: its waiter key exists while a holds.
	waitFor(t, "b's waiter key", func() bool {
		r, err := a.cli.Get(context.Background(), a.LockPrefix("d1")+"/", clientv3.WithPrefix())
		return err == nil && len(r.Kvs) == 2
	})
	ta, _ := a.Holding("d1")
	// Unrelated writes move the store revision past b's key revision, so a
	// header revision would differ from the key's CreateRevision.
	for i := range 5 {
		if _, err := a.cli.Put(context.Background(), fmt.Sprintf("%s/noise/%d", prefix, i), "x"); err != nil {
			t.Fatal(err)
		}
	}
	a.stop() // clean shutdown releases at once
	waitFor(t, "b holds d1", holdingAll(b, []string{"d1"}))
	tb, _ := b.Holding("d1")
	if tb <= ta {
		t.Fatalf("token did not increase: a=%d b=%d", ta, tb)
	}
	r, err := b.cli.Get(context.Background(), b.LockPrefix("d1")+"/", clientv3.WithPrefix())
	if err != nil || len(r.Kvs) != 1 {
		t.Fatalf("lock keys after handover: %v %v", r, err)
	}
	if got := fence.Token(r.Kvs[0].CreateRevision); got != tb {
		t.Fatalf("token %d is not the CreateRevision %d of b's key", tb, got)
	}
	if r.Header.Revision == int64(tb) {
		t.Fatalf("test is vacuous: header revision equals the key's")
	}
}

func TestSeqStartsAtOnePerToken(t *testing.T) {
	prefix := "/t/" + t.Name()
	fp := newFencePoint()
	a := startAgent(t, "gw-a", prefix, []string{"d1"}, fp, Options{})
	waitFor(t, "a holds", holdingAll(a, []string{"d1"}))
	ctx := context.Background()
	for i := 1; i <= 3; i++ {
		ack, err := a.Send(ctx, "d1", "ping", nil)
		if err != nil || ack.Seq != uint64(i) {
			t.Fatalf("send %d: seq %v err %v", i, ack, err)
		}
	}
	t1, _ := a.Holding("d1")
	// Lose the session: revoke the lease under the agent's feet.
	revokeSession(t, a)
	waitFor(t, "new token", func() bool { t2, ok := a.Holding("d1"); return ok && t2 > t1 })
	ack, err := a.Send(ctx, "d1", "ping", nil)
	if err != nil || ack.Seq != 1 || ack.Token <= t1 {
		t.Fatalf("after re-acquisition: %+v %v", ack, err)
	}
}

func revokeSession(t *testing.T, a *testAgent) {
	t.Helper()
	a.leases.mu.Lock()
	lease := a.leases.lease
	a.leases.mu.Unlock()
	if _, err := a.cli.Revoke(context.Background(), lease); err != nil {
		t.Fatal(err)
	}
}

func TestSessionLossStopsControllers(t *testing.T) {
	prefix := "/t/" + t.Name()
	devs := []string{"d1", "d2", "d3"}
	fp := newFencePoint()
	a := startAgent(t, "gw-a", prefix, devs, fp, Options{})
	waitFor(t, "a holds all", holdingAll(a, devs))
	b := startAgent(t, "gw-b", prefix, devs, fp, Options{})
	waitFor(t, "b campaigning", func() bool {
		r, err := a.cli.Get(context.Background(), prefix+"/devices/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && r.Count == 6
	})
	revokeSession(t, a)
	waitFor(t, "b holds all", holdingAll(b, devs))
	// Once a notices the loss (Done), it stops issuing (I6). Before it
	// notices it may still send: that window is what the fence closes.
	waitFor(t, "a notices", func() bool { return a.Status().Counters.Lost == 3 })
	for _, d := range devs {
		if _, err := a.Send(context.Background(), d, "ping", nil); !errors.Is(err, ErrNotHolder) {
			t.Fatalf("%s: deposed agent sent: %v", d, err)
		}
	}
	waitFor(t, "a campaigns again under a new session", func() bool {
		st := a.Status()
		return st.Etcd.Sessions >= 2 && st.Devices[0].State == StateCampaigning
	})
}

// TestFrozenHolderRefusedByFence: with I6 switched off the deposed agent keeps
// sending under its old token; the fence point refuses every such command
// once the new holder's first command is accepted (I1).
func TestFrozenHolderRefusedByFence(t *testing.T) {
	needUnsafeBuild(t)
	prefix := "/t/" + t.Name()
	fp := newFencePoint()
	a := startAgent(t, "gw-a", prefix, []string{"d1"}, fp, Options{UnsafeIgnoreSessionLoss: true})
	waitFor(t, "a holds", holdingAll(a, []string{"d1"}))
	b := startAgent(t, "gw-b", prefix, []string{"d1"}, fp, Options{})
	ctx := context.Background()
	if _, err := a.Send(ctx, "d1", "set", nil); err != nil {
		t.Fatal(err)
	}
	revokeSession(t, a)
	waitFor(t, "b holds", holdingAll(b, []string{"d1"}))
	ta, _ := a.Holding("d1")
	tb, _ := b.Holding("d1")
	if ack, err := b.Send(ctx, "d1", "set", nil); err != nil || ack.Verdict != fence.Accepted {
		t.Fatalf("b: %+v %v", ack, err)
	}
	ack, err := a.Send(ctx, "d1", "set", nil)
	if !errors.Is(err, fence.ErrStale) || ack.Token != ta || ack.MaxToken != tb {
		t.Fatalf("stale holder's command: ack %+v err %v (a=%d b=%d)", ack, err, ta, tb)
	}
}

func TestManyDevicesAcquiredConcurrently(t *testing.T) {
	prefix := "/t/" + t.Name()
	devs := make([]string, 200)
	for i := range devs {
		devs[i] = fmt.Sprintf("dev-%03d", i)
	}
	a := startAgent(t, "gw-a", prefix, devs, newFencePoint(), Options{})
	waitFor(t, "a holds all", holdingAll(a, devs))
	// Each device's token is its own key's CreateRevision (I2). Keys
	// queued in one transaction share it (turn.go): fewer revisions than
	// devices is what batching saves, and a token orders one device's
	// holders only.
	revs := map[fence.Token]bool{}
	for _, d := range devs {
		tok, _ := a.Holding(d)
		key, _, _ := a.leases.holder(d)
		r, err := a.cli.Get(context.Background(), key)
		if err != nil || len(r.Kvs) != 1 || fence.Token(r.Kvs[0].CreateRevision) != tok || string(r.Kvs[0].Value) != "gw-a" {
			t.Fatalf("%s: token %d, its key %s: %v %v", d, tok, key, r, err)
		}
		revs[tok] = true
	}
	t.Logf("%d devices acquired under %d distinct revisions", len(devs), len(revs))
	a.stop()
	r, err := a.cli.Get(context.Background(), prefix+"/devices/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || r.Count != 0 {
		t.Fatalf("locks left after clean shutdown: %d %v", r.Count, err)
	}
}

func TestUnknownDevice(t *testing.T) {
	a := startAgent(t, "gw-a", "/t/"+t.Name(), []string{"d1"}, newFencePoint(), Options{})
	if _, err := a.Send(context.Background(), "nope", "ping", nil); !errors.Is(err, ErrUnknownDevice) {
		t.Fatal(err)
	}
}

// TestDevicesHeldElsewhereDoNotStarveOthers: campaigns for devices another
// agent holds wait without holding one of the session's etcd slots, so more
// such devices than slots do not stop the free ones from being acquired.
func TestDevicesHeldElsewhereDoNotStarveOthers(t *testing.T) {
	prefix := "/t/" + t.Name()
	var held, free []string
	for i := range campaignSlots + 4 {
		held = append(held, fmt.Sprintf("held-%02d", i))
		free = append(free, fmt.Sprintf("free-%02d", i))
	}
	fp := newFencePoint()
	a := startAgent(t, "gw-a", prefix, held, fp, Options{})
	waitFor(t, "a holds its devices", holdingAll(a, held))
	b := startAgent(t, "gw-b", prefix, append(append([]string{}, held...), free...), fp, Options{})
	waitFor(t, "b holds the free devices", holdingAll(b, free))
	a.stop()
	waitFor(t, "b holds the rest after a leaves", holdingAll(b, held))
}

// A clean shutdown revokes the session's lease: every lock key goes in one
// revision (one RPC, not one Unlock per device) and the lease is gone.
func TestCleanShutdownRevokesLease(t *testing.T) {
	prefix := "/t/" + t.Name()
	devs := []string{"d1", "d2", "d3", "d4"}
	a := startAgent(t, "gw-a", prefix, devs, newFencePoint(), Options{})
	waitFor(t, "a holds all", holdingAll(a, devs))
	r, err := a.cli.Get(context.Background(), prefix+"/devices/", clientv3.WithPrefix())
	if err != nil || len(r.Kvs) != len(devs) {
		t.Fatalf("lock keys: %v %v", r, err)
	}
	lease := clientv3.LeaseID(r.Kvs[0].Lease)
	wctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wch := a.cli.Watch(wctx, prefix+"/devices/", clientv3.WithPrefix(), clientv3.WithRev(r.Header.Revision+1))
	a.stop()
	revs := map[int64]int{}
	for deleted := 0; deleted < len(devs); {
		select {
		case wr := <-wch:
			if err := wr.Err(); err != nil {
				t.Fatal(err)
			}
			for _, ev := range wr.Events {
				if ev.Type != clientv3.EventTypeDelete {
					t.Fatalf("unexpected event %v", ev)
				}
				revs[ev.Kv.ModRevision]++
				deleted++
			}
		case <-time.After(30 * time.Second):
			t.Fatal("lock keys not deleted after a clean shutdown")
		}
	}
	if len(revs) != 1 {
		t.Fatalf("lock keys deleted in %d revisions, want 1 (the revoke): %v", len(revs), revs)
	}
	ttl, err := a.cli.TimeToLive(context.Background(), lease)
	if err != nil || ttl.TTL != -1 {
		t.Fatalf("lease after shutdown: %+v %v, want revoked (TTL -1)", ttl, err)
	}
}

// OnHolding reports each acquisition with its token (benchmarks observe
// through it, not through log lines).
func TestOnHolding(t *testing.T) {
	var mu sync.Mutex
	got := map[string]fence.Token{}
	a := startAgent(t, "gw-a", "/t/"+t.Name(), []string{"d1", "d2"}, newFencePoint(), Options{OnHolding: func(dev string, tok fence.Token) {
		mu.Lock()
		defer mu.Unlock()
		got[dev] = tok
	}})
	waitFor(t, "a holds", holdingAll(a, []string{"d1", "d2"}))
	waitFor(t, "both reported", func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 2 })
	mu.Lock()
	defer mu.Unlock()
	for _, d := range []string{"d1", "d2"} {
		if tok, _ := a.Holding(d); got[d] != tok || tok == 0 {
			t.Errorf("%s: OnHolding said %d, Holding %d", d, got[d], tok)
		}
	}
}
