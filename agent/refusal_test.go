package agent

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/offline"
)

// TestRegressionReleasesLock: etcd was wiped (its revisions start again
// low) and the device's fence point holds a token from before. A gateway
// with no token history of the device takes the lock, and its first command
// is refused as stale. That is a token regression, not a deposition — its
// key still holds the lock, so no newer holder can exist: the device goes
// to state refused with a reason naming the device's mark and our token,
// token_regressions counts it, and the lock is let go so that it can move
// on (here to gw-c) instead of being kept by a controller that may not
// command the device. gw-a then campaigns again after a backoff and the
// guard refuses the new token before anything is sent.
func TestRegressionReleasesLock(t *testing.T) {
	prefix := "/t/" + t.Name()
	const mark = fence.Token(1 << 40)
	fp := newFencePoint()
	fp.marks["d1"] = fence.Mark{Token: mark, Seq: 7}
	g := &gate{fp: fp}
	a := startOutboxAgent(t, "gw-a", prefix, devCfgs("d1"), g, openOutbox(t, filepath.Join(t.TempDir(), offline.File), nil))
	waitFor(t, "a holds", holdingAll(a, []string{"d1"}))
	ta, _ := a.Holding("d1")
	c := startAgent(t, "gw-c", prefix, []string{"d1"}, fp, Options{})
	waitFor(t, "c waits for the lock", func() bool {
		h := c.Status().Devices[0].Holder
		return h != nil && h.Gateway == "gw-a" && h.Token == ta
	})

	ack, err := a.Send(context.Background(), "d1", "set", nil)
	if !errors.Is(err, fence.ErrStale) || ack.MaxToken != mark {
		t.Fatalf("first command: %+v %v", ack, err)
	}
	waitFor(t, "the lock moves on to c", holdingAll(c, []string{"d1"}))
	st := a.Status()
	d := st.Devices[0]
	if d.State != StateRefused || !strings.Contains(d.Reason, "token regression") ||
		!strings.Contains(d.Reason, fmt.Sprint(mark)) || !strings.Contains(d.Reason, fmt.Sprint(ta)) || d.FenceToken != mark {
		t.Fatalf("a's device status %+v", d)
	}
	if st.Counters.Regressions == 0 || st.Counters.Released == 0 {
		t.Fatalf("counters %+v", st.Counters)
	}
	if _, err := a.Send(context.Background(), "d1", "set", nil); !errors.Is(err, ErrNotHolder) {
		t.Fatalf("refused controller commanded: %v", err)
	}
	// c is refused the same way and lets go; a takes the lock again after
	// its backoff, and its guard refuses the token without sending.
	if _, err := c.Send(context.Background(), "d1", "set", nil); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("c's first command: %v", err)
	}
	waitFor(t, "a campaigned again and was refused without sending", func() bool {
		return a.Status().Counters.Released >= 2
	})
	if n := g.attempts.Load(); n != 1 {
		t.Fatalf("a sent %d commands, want 1: the guard must refuse a token at or below the device's mark before sending", n)
	}
	// No ping-pong storm: the two refused gateways hand the lock back and
	// forth only as fast as their backoffs let them (1 s, 2 s, 4 s … each;
	// without a backoff it would be hundreds of times in these 5 s).
	before := a.Status().Counters.Released + c.Status().Counters.Released
	time.Sleep(5 * time.Second)
	if n := a.Status().Counters.Released + c.Status().Counters.Released - before; n > 8 {
		t.Fatalf("%d lock releases in 5 s: the backoff does not bound the hand-overs", n)
	}
}

// TestDeposedReleasesLockAndCampaignsAgain: gw-a's lock key went (deleted
// by hand here; a lease that expired does the same), gw-b took the lock and
// commanded the device. gw-a's next command is refused as stale: a
// deposition (its key is gone), state lost. gw-a campaigns again at once
// (the first release waits only the backoff's first step), waits behind
// gw-b with gw-b's id shown as the holder, and takes the device back when
// gw-b leaves — before this, a deposed controller kept the device lost
// until the agent restarted.
func TestDeposedReleasesLockAndCampaignsAgain(t *testing.T) {
	prefix := "/t/" + t.Name()
	fp := newFencePoint()
	a := startAgent(t, "gw-a", prefix, []string{"d1"}, fp, Options{})
	waitFor(t, "a holds", holdingAll(a, []string{"d1"}))
	ta, _ := a.Holding("d1")
	ctx := context.Background()
	if _, err := a.cli.Delete(ctx, a.LockPrefix("d1")+"/", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	b := startAgent(t, "gw-b", prefix, []string{"d1"}, fp, Options{})
	waitFor(t, "b holds", holdingAll(b, []string{"d1"}))
	tb, _ := b.Holding("d1")
	if ack, err := b.Send(ctx, "d1", "set", nil); err != nil || ack.Verdict != fence.Accepted {
		t.Fatalf("b: %+v %v", ack, err)
	}
	if _, err := a.Send(ctx, "d1", "set", nil); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("a's command after b's: %v", err)
	}
	waitFor(t, "a waits behind b, showing b as the holder", func() bool {
		d := a.Status().Devices[0]
		return d.State == StateCampaigning && d.Holder != nil && d.Holder.Gateway == "gw-b" && d.Holder.Token == tb
	})
	if st := a.Status(); st.Counters.Regressions != 0 || st.Counters.Lost != 1 || !strings.Contains(st.Devices[0].Reason, "deposed") {
		t.Fatalf("a: %+v %+v", st.Devices[0], st.Counters)
	}
	b.stop()
	waitFor(t, "a holds again", holdingAll(a, []string{"d1"}))
	t2, _ := a.Holding("d1")
	if t2 <= tb || t2 <= ta {
		t.Fatalf("a's new token %d not above b's %d", t2, tb)
	}
	if ack, err := a.Send(ctx, "d1", "set", nil); err != nil || ack.Verdict != fence.Accepted {
		t.Fatalf("a after b left: %+v %v", ack, err)
	}
	if d := a.Status().Devices[0]; d.Reason != "" || d.Holder != nil {
		t.Fatalf("holding, yet %+v", d)
	}
}

// TestLockKeyNamesHolder: the holder's lock key carries its gateway id, so
// that `etcdctl get` tells who holds a device.
func TestLockKeyNamesHolder(t *testing.T) {
	prefix := "/t/" + t.Name()
	a := startAgent(t, "gw-a", prefix, []string{"d1"}, newFencePoint(), Options{})
	waitFor(t, "a holds", holdingAll(a, []string{"d1"}))
	ta, _ := a.Holding("d1")
	r, err := a.cli.Get(context.Background(), a.LockPrefix("d1")+"/", clientv3.WithPrefix())
	if err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "gw-a" || fence.Token(r.Kvs[0].CreateRevision) != ta {
		t.Fatalf("lock key: %v %v", r.Kvs, err)
	}
}

// TestRefusalBackoff: the wait after the n-th release in a row doubles from
// refusalBackoffMin to refusalBackoffMax, with half of it random.
func TestRefusalBackoff(t *testing.T) {
	for n := 1; n <= 40; n++ {
		full := min(refusalBackoffMax, refusalBackoffMin<<min(n-1, 10))
		for range 50 {
			if d := refusalBackoff(n); d < full/2 || d > full {
				t.Fatalf("n=%d: %v outside [%v, %v]", n, d, full/2, full)
			}
		}
	}
}

// TestRestartWithinTTLKeepsQueue: the agent queued commands for a device
// that was away, then died without releasing anything (kill -9 or a power
// cut: here its etcd client is closed under it, so its lease lives on). A
// restart within the lease TTL re-attaches to the previous run's lease —
// recorded in the outbox file — instead of waiting behind its own lock
// keys: the devices are held under the same tokens at once, every queued
// command is accepted once (none ended superseded), and new commands carry
// on above the last seq the previous run issued.
func TestRestartWithinTTLKeepsQueue(t *testing.T) {
	prefix := "/t/" + t.Name()
	path := filepath.Join(t.TempDir(), offline.File)
	devs := []string{"d1", "d2"}
	g := &gate{fp: newFencePoint()}
	ob1, err := offline.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	const ttl = 15 * time.Second
	a1 := startOutboxAgentOn(t, testEtcd, ttl, "gw-a", prefix, devCfgs(devs...), g, ob1)
	waitFor(t, "a1 holds", holdingAll(a1, devs))
	tokens := map[string]fence.Token{}
	for _, d := range devs {
		tokens[d], _ = a1.Holding(d)
		if ack, err := a1.Send(context.Background(), d, "set", nil); err != nil || ack.Seq != 1 {
			t.Fatalf("%s: %+v %v", d, ack, err)
		}
	}
	g.down.Store(true)
	const queued = 5
	for _, d := range devs {
		for range queued {
			if _, err := a1.Enqueue(context.Background(), d, "set", nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	a1.cli.Close() // the crash: nothing is revoked or deleted
	a1.stop()
	ob1.Close()
	g.down.Store(false)

	ob2 := openOutbox(t, path, nil)
	// The restart must come within the TTL: generous, so that a loaded
	// machine (a1's shutdown, a2's start) does not outlast it.
	a2 := startOutboxAgentOn(t, testEtcd, ttl, "gw-a", prefix, devCfgs(devs...), g, ob2)
	waitFor(t, "a2 holds under the same tokens", func() bool {
		for _, d := range devs {
			if tok, ok := a2.Holding(d); !ok || tok != tokens[d] {
				return false
			}
		}
		return true
	})
	waitFor(t, "the queue delivered", pendingZero(ob2))
	for _, d := range devs {
		recs, err := ob2.List(offline.Filter{Device: d})
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) != 1+queued {
			t.Fatalf("%s: %d records", d, len(recs))
		}
		for _, r := range recs {
			if r.State != fence.Accepted {
				t.Fatalf("%s: %s/%d ended %v (%s)", d, r.ID, r.Seq, r.State, r.Reason())
			}
		}
		ack, err := a2.Send(context.Background(), d, "set", nil)
		if err != nil || ack.Verdict != fence.Accepted || ack.Token != tokens[d] || ack.Seq != 2+queued {
			t.Fatalf("%s: new command %+v %v", d, ack, err)
		}
		if n := len(g.fp.appliedOf(d)); n != 2+queued {
			t.Fatalf("%s: applied %d", d, n)
		}
	}
	if c := a2.Status().Counters; c.Superseded != 0 || c.Reattached != 1 || c.Stale != 0 {
		t.Fatalf("counters %+v", c)
	}
}

// TestRestartSweepsUnconfiguredLocks: a device dropped from the
// configuration between runs must not stay locked under the re-attached
// lease.
func TestRestartSweepsUnconfiguredLocks(t *testing.T) {
	prefix := "/t/" + t.Name()
	path := filepath.Join(t.TempDir(), offline.File)
	ob1, err := offline.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	fp := newFencePoint()
	// A TTL that outlives a1's stop and a2's start on a loaded machine
	// (2 s did not, once, under make test): a2 must find the lease alive.
	const ttl = 8 * time.Second
	a1 := startOutboxAgentOn(t, testEtcd, ttl, "gw-a", prefix, devCfgs("d1", "gone"), &gate{fp: fp}, ob1)
	waitFor(t, "a1 holds", holdingAll(a1, []string{"d1", "gone"}))
	a1.cli.Close()
	a1.stop()
	ob1.Close()
	a2 := startOutboxAgentOn(t, testEtcd, ttl, "gw-a", prefix, devCfgs("d1"), &gate{fp: fp}, openOutbox(t, path, nil))
	waitFor(t, "a2 holds", holdingAll(a2, []string{"d1"}))
	if a2.Status().Counters.Reattached != 1 {
		t.Fatal("a2 did not re-attach")
	}
	// a2 keeps the re-attached lease alive: without the sweep, b would
	// wait for the key as long as a2 runs.
	b := startAgent(t, "gw-b", prefix, []string{"gone"}, fp, Options{})
	waitFor(t, "b holds the device a2 no longer configures", func() bool { _, ok := b.Holding("gone"); return ok })
}

// TestShutdownWaitingForLockWithEtcdAway: b waits for a lock a holds; etcd
// goes away; b is stopped. Its Run must return: concurrency.Mutex.Lock
// deletes its queued key after a cancelled wait on its client's context,
// which on the agent's own client outlived the run and, with etcd away,
// blocked the campaign, and Run, until the client was closed (after Run
// returns): the rare shutdown hang of a re-campaigning agent. The
// campaigns no longer use concurrency.Mutex (turn.go: a cancelled wait
// deletes nothing and waits on the agent's one watch); the test stays for
// the hang.
func TestShutdownWaitingForLockWithEtcdAway(t *testing.T) {
	e, err := sandbox.StartEtcd(context.Background(), sandbox.EtcdConfig{Dir: t.TempDir(), Fast: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() }) // after the agents have stopped
	fp := newFencePoint()
	prefix := "/t/" + t.Name()
	a := startOutboxAgent(t, "gw-a", prefix, devCfgs("d1"), fp, openOutbox(t, filepath.Join(t.TempDir(), offline.File), nil), e)
	waitFor(t, "a holds", holdingAll(a, []string{"d1"}))
	b := startOutboxAgent(t, "gw-b", prefix, devCfgs("d1"), fp, openOutbox(t, filepath.Join(t.TempDir(), offline.File), nil), e)
	waitFor(t, "b waits for the lock", func() bool {
		r, err := a.cli.Get(context.Background(), a.LockPrefix("d1")+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && r.Count == 2
	})
	if err := e.Stop(); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		b.stop()
	}()
	// The lease revoke is bounded by the TTL (8 s here); a stuck campaign
	// never returns. Generous, so that only the hang fails it.
	select {
	case <-stopped:
	case <-time.After(2 * time.Minute):
		t.Fatal("b's Run did not return with etcd away: a campaign is stuck in the mutex's cleanup")
	}
}
