package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/offline"
)

// gate is a Sender in front of a fencePoint whose link can be cut: while
// down, Send waits for its context like the MQTT transport waiting for a
// broker. dropAcks > 0 applies that many commands but loses their acks (the
// device got the command, the ack never came back).
type gate struct {
	fp       *fencePoint
	down     atomic.Bool
	dropAcks atomic.Int32
	attempts atomic.Int64
}

func (g *gate) Send(ctx context.Context, env *fence.Envelope) (*fence.Ack, error) {
	g.attempts.Add(1)
	if g.down.Load() {
		<-ctx.Done()
		return nil, fmt.Errorf("link down: %w", ctx.Err())
	}
	ack, err := g.fp.Send(ctx, env)
	if err == nil && g.dropAcks.Add(-1) >= 0 {
		<-ctx.Done()
		return nil, fmt.Errorf("ack lost: %w", ctx.Err())
	}
	return ack, err
}

func openOutbox(t *testing.T, path string, o *offline.Options) *offline.Outbox {
	t.Helper()
	ob, err := offline.Open(path, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ob.Close() })
	return ob
}

// startOutboxAgent runs an agent with an outbox, on testEtcd unless
// another etcd is given.
func startOutboxAgent(t *testing.T, gw, prefix string, devs []DeviceConfig, s Sender, ob *offline.Outbox, etcds ...*sandbox.Etcd) *testAgent {
	t.Helper()
	e, ttl := testEtcd, 2*time.Second
	if len(etcds) > 0 {
		// A lease that must outlive an etcd restart: etcd extends it by
		// a TTL when it comes back, and the client needs a moment to
		// reconnect.
		e, ttl = etcds[0], 8*time.Second
	}
	return startOutboxAgentOn(t, e, ttl, gw, prefix, devs, s, ob)
}

// startOutboxAgentOn runs an agent with an outbox on e, with lease TTL ttl.
func startOutboxAgentOn(t *testing.T, e *sandbox.Etcd, ttl time.Duration, gw, prefix string, devs []DeviceConfig, s Sender, ob *offline.Outbox) *testAgent {
	t.Helper()
	return startOutboxAgentTimeout(t, e, ttl, 300*time.Millisecond, gw, prefix, devs, s, ob)
}

// startOutboxAgentTimeout is startOutboxAgentOn with command.timeout
// timeout.
func startOutboxAgentTimeout(t *testing.T, e *sandbox.Etcd, ttl, timeout time.Duration, gw, prefix string, devs []DeviceConfig, s Sender, ob *offline.Outbox) *testAgent {
	t.Helper()
	endpoints := e.Endpoints()
	cfg := &Config{Gateway: gw, Etcd: EtcdConfig{Endpoints: endpoints, Prefix: prefix, LeaseTTL: ttl, DialTimeout: time.Second},
		MQTT: MQTTConfig{Brokers: []string{"mqtt://127.0.0.1:1"}}, Command: CommandConfig{Timeout: timeout},
		Devices: devs}
	cli, err := e.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	o := Options{Outbox: ob}
	if testing.Verbose() {
		o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return runAgent(t, cfg, cli, s, o)
}

func devCfgs(ids ...string) []DeviceConfig {
	out := make([]DeviceConfig, len(ids))
	for i, id := range ids {
		out[i] = DeviceConfig{ID: id, Auth: AuthOff}
	}
	return out
}

func pendingZero(ob *offline.Outbox) func() bool {
	return func() bool { s, err := ob.Stats(); return err == nil && s.Pending == 0 }
}

// appliedSeqs returns the (token, seq) pairs the fence point applied for dev.
func (f *fencePoint) appliedOf(dev string) []fence.Envelope {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]fence.Envelope(nil), f.applied[dev]...)
}

// TestOutboxQueuesThroughOutage: with the link down, commands queue
// (callers get ErrQueued); when it returns, every command is delivered once,
// in order, with its original token and seq, and ends accepted.
func TestOutboxQueuesThroughOutage(t *testing.T) {
	prefix := "/t/" + t.Name()
	devs := []string{"d1", "d2", "d3"}
	g := &gate{fp: newFencePoint()}
	ob := openOutbox(t, filepath.Join(t.TempDir(), offline.File), nil)
	a := startOutboxAgent(t, "gw-a", prefix, devCfgs(devs...), g, ob)
	waitFor(t, "a holds", holdingAll(a, devs))
	g.down.Store(true)
	const n = 8
	var wg sync.WaitGroup
	for _, d := range devs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range n {
				_, err := a.Send(context.Background(), d, "set", []byte{byte(i)})
				if !errors.Is(err, ErrQueued) || !errors.Is(err, ErrNoAck) {
					t.Errorf("%s #%d while down: %v", d, i, err)
				}
			}
		}()
	}
	wg.Wait()
	if s, _ := ob.Stats(); s.Pending != n*len(devs) {
		t.Fatalf("pending %d, want %d", s.Pending, n*len(devs))
	}
	g.down.Store(false)
	waitFor(t, "outbox drained", pendingZero(ob))
	for _, d := range devs {
		got := g.fp.appliedOf(d)
		if len(got) != n {
			t.Fatalf("%s: applied %d, want %d", d, len(got), n)
		}
		for i, e := range got {
			if e.Seq != uint64(i+1) || e.Body[0] != byte(i) {
				t.Fatalf("%s: applied #%d is seq %d body %v", d, i, e.Seq, e.Body)
			}
		}
	}
	recs, err := ob.List(offline.Filter{})
	if err != nil || len(recs) != n*len(devs) {
		t.Fatalf("records %d %v", len(recs), err)
	}
	for _, r := range recs {
		if r.State != fence.Accepted || r.Ack == nil {
			t.Fatalf("%s/%d: state %v", r.Device, r.Seq, r.State)
		}
	}
	// The entry is resolved just before the verdict is counted.
	waitFor(t, "counters", func() bool { c := a.Status().Counters; return c.Queued == n*3 && c.Accepted == n*3 })
}

// TestOutboxLostAckResentAsDuplicate: the device applied a command but its
// ack was lost; the resend is answered duplicate and nothing is applied
// twice.
func TestOutboxLostAckResentAsDuplicate(t *testing.T) {
	g := &gate{fp: newFencePoint()}
	ob := openOutbox(t, filepath.Join(t.TempDir(), offline.File), nil)
	a := startOutboxAgent(t, "gw-a", "/t/"+t.Name(), devCfgs("d1"), g, ob)
	waitFor(t, "a holds", holdingAll(a, []string{"d1"}))
	g.dropAcks.Store(1)
	_, err := a.Send(context.Background(), "d1", "set", nil)
	var qe *QueuedError
	if !errors.Is(err, ErrQueued) || !errors.Is(err, ErrNoAck) || !errors.As(err, &qe) || qe.ID == "" || qe.Seq != 1 {
		t.Fatalf("first send: %v", err)
	}
	if _, err := ob.Get(qe.ID); err != nil {
		t.Fatalf("the queued command's id is not in the outbox: %v", err)
	}
	waitFor(t, "resolved", pendingZero(ob))
	recs, _ := ob.List(offline.Filter{})
	if len(recs) != 1 || recs[0].State != fence.Duplicate {
		t.Fatalf("records %+v", recs)
	}
	if n := len(g.fp.appliedOf("d1")); n != 1 {
		t.Fatalf("applied %d times", n)
	}
	ack, err := a.Send(context.Background(), "d1", "set", nil)
	if err != nil || ack.Seq != 2 || ack.Verdict != fence.Accepted {
		t.Fatalf("next: %+v %v", ack, err)
	}
}

// TestOutboxResumesAfterRestart: commands queued by one run of the agent
// are delivered by the next, before its own, with their original token;
// the next run's token is above the durable record of the last.
func TestOutboxResumesAfterRestart(t *testing.T) {
	prefix := "/t/" + t.Name()
	path := filepath.Join(t.TempDir(), offline.File)
	g := &gate{fp: newFencePoint()}
	ob1, err := offline.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	a1 := startOutboxAgent(t, "gw-a", prefix, devCfgs("d1"), g, ob1)
	waitFor(t, "a1 holds", holdingAll(a1, []string{"d1"}))
	t1, _ := a1.Holding("d1")
	g.down.Store(true)
	for range 3 {
		if _, err := a1.Send(context.Background(), "d1", "set", nil); !errors.Is(err, ErrQueued) {
			t.Fatal(err)
		}
	}
	a1.stop()
	ob1.Close()
	g.down.Store(false)

	ob2 := openOutbox(t, path, nil)
	if held, _ := ob2.Held("d1"); held != t1 {
		t.Fatalf("held token on disk %d, want %d", held, t1)
	}
	a2 := startOutboxAgent(t, "gw-a", prefix, devCfgs("d1"), g, ob2)
	waitFor(t, "a2 holds", holdingAll(a2, []string{"d1"}))
	t2, _ := a2.Holding("d1")
	if t2 <= t1 {
		t.Fatalf("token %d not above %d", t2, t1)
	}
	ack, err := a2.Send(context.Background(), "d1", "set", nil)
	if err != nil || ack.Token != t2 || ack.Seq != 1 {
		t.Fatalf("a2: %+v %v", ack, err)
	}
	got := g.fp.appliedOf("d1")
	if len(got) != 4 {
		t.Fatalf("applied %d", len(got))
	}
	for i, e := range got[:3] {
		if e.Token != t1 || e.Seq != uint64(i+1) {
			t.Fatalf("applied #%d: token %d seq %d", i, e.Token, e.Seq)
		}
	}
}

// TestTokenRegressionRefusedDurably: a token at or below the one recorded
// on disk (etcd restored from an old snapshot) is refused, across restarts.
func TestTokenRegressionRefusedDurably(t *testing.T) {
	ob := openOutbox(t, filepath.Join(t.TempDir(), offline.File), nil)
	if err := ob.SetHeld("d1", 1<<40); err != nil {
		t.Fatal(err)
	}
	a := startOutboxAgent(t, "gw-a", "/t/"+t.Name(), devCfgs("d1", "d2"), &gate{fp: newFencePoint()}, ob)
	waitFor(t, "d2 held, d1 refused", func() bool {
		st := a.Status()
		return st.Devices[0].State == StateRefused && st.Devices[1].State == StateHolding
	})
	if _, err := a.Send(context.Background(), "d1", "set", nil); !errors.Is(err, ErrNotHolder) {
		t.Fatalf("refused device commanded: %v", err)
	}
	if c := a.Status().Counters; c.Regressions == 0 {
		t.Fatalf("no regression counted: %+v", c)
	}
}

// TestOutboxExpiry: a queued command never sent within its TTL ends as
// expired; the one the agent had begun sending is kept until the device
// answers (it may have reached the broker).
// TestOutboxMaxEnded: over outbox.max_ended ended commands, the agent
// compacts the oldest within its next expiry pass (each second), not at
// the hourly pass; pending commands are kept, and the newest ended ones.
func TestOutboxMaxEnded(t *testing.T) {
	fp := newFencePoint()
	ob := openOutbox(t, filepath.Join(t.TempDir(), offline.File), &offline.Options{MaxEnded: 3})
	a := startOutboxAgent(t, "gw-a", "/t/"+t.Name(), devCfgs("d1"), fp, ob)
	waitFor(t, "a holds", holdingAll(a, []string{"d1"}))
	var ids []string
	for range 8 {
		r, err := a.Send(context.Background(), "d1", "set", nil)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.ID)
	}
	waitFor(t, "compacted to 3", func() bool { return ob.Ended() == 3 && !ob.EndedOver() })
	for i, id := range ids {
		_, err := ob.Get(id)
		if gone := errors.Is(err, offline.ErrNotFound); gone != (i < 5) {
			t.Errorf("command %d of 8: gone %v (%v)", i+1, gone, err)
		}
	}
	if got := fp.appliedOf("d1"); len(got) != 8 {
		t.Fatalf("applied %d, want 8", len(got))
	}
}

func TestOutboxExpiry(t *testing.T) {
	g := &gate{fp: newFencePoint()}
	ob := openOutbox(t, filepath.Join(t.TempDir(), offline.File), &offline.Options{TTL: 500 * time.Millisecond})
	a := startOutboxAgent(t, "gw-a", "/t/"+t.Name(), devCfgs("d1"), g, ob)
	waitFor(t, "a holds", holdingAll(a, []string{"d1"}))
	g.down.Store(true)
	for range 3 {
		if _, err := a.Send(context.Background(), "d1", "set", nil); !errors.Is(err, ErrQueued) {
			t.Fatal(err)
		}
	}
	waitFor(t, "two expired", func() bool { n, _ := ob.Pending("d1"); return n == 1 })
	g.down.Store(false)
	waitFor(t, "head delivered", pendingZero(ob))
	recs, _ := ob.List(offline.Filter{Device: "d1"})
	want := []fence.Verdict{fence.Accepted, fence.Expired, fence.Expired}
	for i, r := range recs {
		if r.State != want[i] {
			t.Fatalf("entry %d (seq %d): %v, want %v", i, r.Seq, r.State, want[i])
		}
	}
	if got := g.fp.appliedOf("d1"); len(got) != 1 || got[0].Seq != 1 {
		t.Fatalf("applied %+v", got)
	}
	if c := a.Status().Counters; c.Expired != 2 {
		t.Fatalf("expired counter %d", c.Expired)
	}
}

// TestQueuedOldTokenEndsStaleAndReissues: the agent queues commands while
// cut off, loses its lease, another gateway takes the device over and
// commands it; when the first agent holds the device again, its queued
// commands of the old token are refused stale by the fence point and
// recorded — none applied — and only the kind listed in reissue_kinds is
// queued again under the new token.
func TestQueuedOldTokenEndsStaleAndReissues(t *testing.T) {
	prefix := "/t/" + t.Name()
	fp := newFencePoint()
	ga := &gate{fp: fp}
	ob := openOutbox(t, filepath.Join(t.TempDir(), offline.File), nil)
	a := startOutboxAgent(t, "gw-a", prefix, []DeviceConfig{{ID: "d1", Auth: AuthOff, ReissueKinds: []string{"set"}}}, ga, ob)
	waitFor(t, "a holds", holdingAll(a, []string{"d1"}))
	ta, _ := a.Holding("d1")
	ga.down.Store(true)
	for _, k := range []string{"pulse", "set"} {
		if _, err := a.Send(context.Background(), "d1", k, nil); !errors.Is(err, ErrQueued) {
			t.Fatal(err)
		}
	}
	b := startAgent(t, "gw-b", prefix, []string{"d1"}, fp, Options{})
	revokeSession(t, a)
	waitFor(t, "b holds", holdingAll(b, []string{"d1"}))
	tb, _ := b.Holding("d1")
	if ack, err := b.Send(context.Background(), "d1", "set", nil); err != nil || ack.Verdict != fence.Accepted {
		t.Fatalf("b: %+v %v", ack, err)
	}
	b.stop()
	waitFor(t, "a holds again", func() bool { tok, ok := a.Holding("d1"); return ok && tok > tb })
	ga.down.Store(false)
	var recs []offline.Record
	waitFor(t, "old entries refused, reissue accepted", func() bool {
		var err error
		recs, err = ob.List(offline.Filter{Device: "d1"})
		return err == nil && len(recs) == 3 && !recs[2].Pending()
	})
	for _, r := range recs[:2] {
		if r.Token != ta || r.State != fence.Stale {
			t.Fatalf("old-token entry %s %d/%d: %v", r.Kind, r.Token, r.Seq, r.State)
		}
	}
	if r := recs[2]; r.Kind != "set" || r.Token <= tb || r.State != fence.Accepted {
		t.Fatalf("reissue: %+v", r)
	}
	for _, e := range fp.appliedOf("d1") {
		if e.Token == ta {
			t.Fatalf("a command of the old token was applied: %+v", e)
		}
	}
	// The pulse was on its way when the link went down: the fence point
	// refused it. The set was never sent: the agent ended it itself.
	if c := a.Status().Counters; c.Reissued != 1 || c.Stale != 1 || c.Superseded != 1 {
		t.Fatalf("counters %+v", c)
	}
}

// TestEtcdRestartPolicies: etcd goes away for longer than the TTL. The
// strict device stops; the autonomous one goes on under its last token.
// etcd comes back with the lease alive (etcd extends leases when it
// restarts), and the agent resumes its session: same tokens, seqs carry on.
func TestEtcdRestartPolicies(t *testing.T) {
	e, err := sandbox.StartEtcd(context.Background(), sandbox.EtcdConfig{Dir: t.TempDir(), Fast: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() }) // after the agent has stopped
	fp := newFencePoint()
	ob := openOutbox(t, filepath.Join(t.TempDir(), offline.File), nil)
	devs := []DeviceConfig{{ID: "strict1", Auth: AuthOff}, {ID: "auto1", Policy: PolicyAutonomous, Auth: AuthOff}}
	a := startOutboxAgent(t, "gw-a", "/t", devs, &gate{fp: fp}, ob, e)
	waitFor(t, "a holds", holdingAll(a, []string{"strict1", "auto1"}))
	ts, _ := a.Holding("strict1")
	tauto, _ := a.Holding("auto1")
	for _, d := range []string{"strict1", "auto1"} {
		if _, err := a.Send(context.Background(), d, "set", nil); err != nil {
			t.Fatal(err)
		}
	}
	t0 := time.Now()
	if err := e.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("etcd stopped in %v", time.Since(t0))
	waitFor(t, "session lost", func() bool { return !a.Status().Etcd.Session })
	if _, err := a.Send(context.Background(), "strict1", "set", nil); !errors.Is(err, ErrNotHolder) {
		t.Fatalf("strict device commanded without etcd: %v", err)
	}
	ack, err := a.Send(context.Background(), "auto1", "set", nil)
	if err != nil || ack.Token != tauto || ack.Seq != 2 {
		t.Fatalf("autonomous device: %+v %v", ack, err)
	}
	if st := a.Status(); st.Devices[1].State != StateAutonomous {
		t.Fatalf("auto1 state %s", st.Devices[1].State)
	}
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "session resumed", func() bool {
		st := a.Status()
		return st.Counters.Reattached == 1 && st.Devices[0].State == StateHolding && st.Devices[1].State == StateHolding
	})
	for _, d := range []struct {
		id  string
		tok fence.Token
		seq uint64
	}{{"strict1", ts, 2}, {"auto1", tauto, 3}} {
		ack, err := a.Send(context.Background(), d.id, "set", nil)
		if err != nil || ack.Token != d.tok || ack.Seq != d.seq || ack.Verdict != fence.Accepted {
			t.Fatalf("%s after resume: %+v %v", d.id, ack, err)
		}
	}
}

// TestEnqueue: Enqueue returns once the command is stored, without waiting
// for the device; the outbox then delivers it in order.
func TestEnqueue(t *testing.T) {
	g := &gate{fp: newFencePoint()}
	ob := openOutbox(t, filepath.Join(t.TempDir(), offline.File), nil)
	a := startOutboxAgent(t, "gw-a", "/t/"+t.Name(), devCfgs("d1"), g, ob)
	waitFor(t, "a holds", holdingAll(a, []string{"d1"}))
	g.down.Store(true)
	for i := range 50 {
		env, err := a.Enqueue(context.Background(), "d1", "set", nil)
		if err != nil || env.Seq != uint64(i+1) {
			t.Fatalf("enqueue %d: %+v %v", i, env, err)
		}
	}
	if n, _ := ob.Pending("d1"); n != 50 {
		t.Fatalf("pending %d", n)
	}
	g.down.Store(false)
	waitFor(t, "drained", pendingZero(ob))
	for i, e := range g.fp.appliedOf("d1") {
		if e.Seq != uint64(i+1) {
			t.Fatalf("applied #%d has seq %d", i, e.Seq)
		}
	}
}

// The outbox is not optional: New refuses to build an agent without one.
func TestNewRequiresOutbox(t *testing.T) {
	cfg := &Config{Gateway: "gw", Etcd: EtcdConfig{Endpoints: []string{"http://127.0.0.1:1"}},
		MQTT: MQTTConfig{Brokers: []string{"mqtt://127.0.0.1:1"}}, Devices: []DeviceConfig{{ID: "d1", Auth: AuthOff}}}
	if _, err := New(cfg, nil, newFencePoint(), Options{}); !errors.Is(err, ErrNoOutbox) {
		t.Fatalf("New without an outbox: %v", err)
	}
}

// TestRestartedAgentEndsQueueHeldElsewhere: an agent queued commands, died,
// and another agent took the device and commanded it. When the first agent
// restarts and finds the lock held elsewhere, its queued commands of the
// old token are not left waiting: the one it may have sent is sent again
// (the fence refuses it), the others are ended stale without being sent.
func TestRestartedAgentEndsQueueHeldElsewhere(t *testing.T) {
	prefix := "/t/" + t.Name()
	path := filepath.Join(t.TempDir(), offline.File)
	fp := newFencePoint()
	ga := &gate{fp: fp}
	ob1, err := offline.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	a1 := startOutboxAgent(t, "gw-a", prefix, devCfgs("d1"), ga, ob1)
	waitFor(t, "a1 holds", holdingAll(a1, []string{"d1"}))
	ta, _ := a1.Holding("d1")
	ga.down.Store(true)
	for range 3 {
		if _, err := a1.Send(context.Background(), "d1", "set", nil); !errors.Is(err, ErrQueued) {
			t.Fatal(err)
		}
	}
	a1.stop()
	ob1.Close()
	ga.down.Store(false)

	b := startAgent(t, "gw-b", prefix, []string{"d1"}, fp, Options{})
	waitFor(t, "b holds", holdingAll(b, []string{"d1"}))
	if ack, err := b.Send(context.Background(), "d1", "set", nil); err != nil || ack.Verdict != fence.Accepted {
		t.Fatalf("b: %+v %v", ack, err)
	}
	ob2 := openOutbox(t, path, nil)
	a2 := startOutboxAgent(t, "gw-a", prefix, devCfgs("d1"), ga, ob2)
	waitFor(t, "a2's old queue ended", pendingZero(ob2))
	recs, _ := ob2.List(offline.Filter{Device: "d1"})
	for _, r := range recs {
		if r.Token != ta || r.State != fence.Stale {
			t.Fatalf("entry %d/%d: %v", r.Token, r.Seq, r.State)
		}
	}
	for _, e := range fp.appliedOf("d1") {
		if e.Token == ta {
			t.Fatalf("a command of the old token was applied: %+v", e)
		}
	}
	// The head was resent and refused, the two others superseded (the
	// verdict is counted just after the entry is resolved).
	waitFor(t, "counters", func() bool { c := a2.Status().Counters; return c.Superseded == 2 && c.Stale == 1 })
	// Per device too: the table's stale column and
	// the last verdict agree, and the last one is marked never sent.
	d := a2.Status().Devices[0]
	if v := d.Verdicts; v.Stale != 1 || v.Superseded != 2 {
		t.Errorf("d1 verdicts %+v, want stale 1 (the fence point's) and superseded 2", v)
	}
	if la := d.LastAck; la == nil || la.Verdict != fence.Stale || !la.Unsent {
		t.Errorf("d1 last verdict %+v, want stale, unsent", la)
	}
}

// TestResendAfter: an unanswered command is sent again after 1 s, 2 s,
// 4 s … but never waits longer than the command timeout.
func TestResendAfter(t *testing.T) {
	for _, c := range []struct {
		tries   int
		timeout time.Duration
		want    time.Duration
	}{
		{0, 10 * time.Second, time.Second},
		{1, 10 * time.Second, 2 * time.Second},
		{3, 10 * time.Second, 8 * time.Second},
		{4, 10 * time.Second, 10 * time.Second},
		{60, 10 * time.Second, 10 * time.Second},
		{0, 300 * time.Millisecond, 300 * time.Millisecond},
	} {
		if got := resendAfter(c.tries, c.timeout); got != c.want {
			t.Errorf("resendAfter(%d, %v) = %v, want %v", c.tries, c.timeout, got, c.want)
		}
	}
}
