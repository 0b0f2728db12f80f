package sandbox

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"
)

// waitGoroutinesSettle waits until goleak finds no stray goroutine (the
// package's tests are not parallel), or reports them after d.
func waitGoroutinesSettle(t *testing.T, d time.Duration) {
	t.Helper()
	start := time.Now()
	for {
		err := goleak.Find()
		if err == nil {
			t.Logf("goroutines settled after %v", time.Since(start))
			return
		}
		if time.Since(start) > d {
			t.Errorf("goroutines still running %v after the test: %v", d, err)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestEtcdClusterLeaderLoss stops the leader of a 3-member cluster: a new
// leader is elected, a client with every endpoint keeps working, and a
// lease granted before the loss survives it. The old leader then rejoins.
func TestEtcdClusterLeaderLoss(t *testing.T) {
	defer waitGoroutinesSettle(t, 10*time.Second) // see EtcdCluster.Close
	t.Run("kill", func(t *testing.T) { testLeaderLoss(t, true) })
	t.Run("stop", func(t *testing.T) { testLeaderLoss(t, false) })
}

func testLeaderLoss(t *testing.T, kill bool) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	start := time.Now()
	c, err := StartEtcdCluster(ctx, EtcdClusterConfig{Dir: t.TempDir(), Fast: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	t.Logf("3-member cluster ready in %v: %v", time.Since(start), c.Endpoints())
	cli, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()

	leader, err := c.WaitLeader(ctx, -1)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := cli.Grant(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, "chaos/leased", "v", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}

	start = time.Now()
	halt := c.Stop
	if kill {
		halt = c.Kill
	}
	if err := halt(leader); err != nil {
		t.Fatal(err)
	}
	t.Logf("halting m%d (kill=%v) took %v", leader, kill, time.Since(start))
	if c.Running(leader) {
		t.Fatal("stopped member still running")
	}
	next, err := c.WaitLeader(ctx, leader)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("leader m%d stopped; m%d elected in %v", leader, next, time.Since(start))

	// The same client keeps working (it fails over to a live member).
	if _, err := cli.Put(ctx, "chaos/after", "1"); err != nil {
		t.Fatalf("put after leader loss: %v", err)
	}
	// The lease survived: alive, renewable, its key still there.
	ttl, err := cli.TimeToLive(ctx, lease.ID)
	if err != nil || ttl.TTL <= 0 {
		t.Fatalf("lease after leader loss: ttl %+v, %v", ttl, err)
	}
	if _, err := cli.KeepAliveOnce(ctx, lease.ID); err != nil {
		t.Fatalf("keep-alive after leader loss: %v", err)
	}
	if r, err := cli.Get(ctx, "chaos/leased"); err != nil || len(r.Kvs) != 1 || r.Kvs[0].Lease != int64(lease.ID) {
		t.Fatalf("leased key after leader loss: %v, %v", r, err)
	}

	// The old leader rejoins on its old ports and data and catches up.
	start = time.Now()
	if err := c.Restart(ctx, leader); err != nil {
		t.Fatal(err)
	}
	t.Logf("m%d restarted and ready in %v", leader, time.Since(start))
	only, err := clientv3.New(clientv3.Config{Endpoints: []string{c.Endpoint(leader)}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer only.Close()
	if r, err := only.Get(ctx, "chaos/after"); err != nil || len(r.Kvs) != 1 {
		t.Fatalf("get via the restarted member: %v, %v", r, err)
	}

	if !kill {
		return
	}
	// Losing quorum: two members down, writes fail; back up, they succeed.
	others := []int{}
	for i := range c.Size() {
		if i != leader {
			others = append(others, i)
		}
	}
	start = time.Now()
	for _, i := range others {
		if err := halt(i); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("quorum lost (halting two took %v)", time.Since(start))
	qctx, qcancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err = only.Put(qctx, "chaos/noquorum", "x")
	qcancel()
	if err == nil {
		t.Fatal("write succeeded without quorum")
	}
	start = time.Now()
	restarted := make(chan error, len(others))
	for _, i := range others {
		go func() { restarted <- c.Restart(ctx, i) }()
	}
	for range others {
		if err := <-restarted; err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("quorum back in %v", time.Since(start))
	if _, err := cli.Put(ctx, "chaos/quorum-back", "1"); err != nil {
		t.Fatalf("put after quorum is back: %v", err)
	}
	only.Close()
	cli.Close() // open client streams hold up a member's Close
	start = time.Now()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("closed in %v", time.Since(start))
}
