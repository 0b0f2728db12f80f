package sandbox

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Three etcd processes form one cluster: a write through one member is
// read through another, and after the leader is killed (SIGKILL) the two
// left elect a new leader and take writes again. Without the binary the
// test skips (fails under CI=true).
func TestEtcdProcClusterLeaderKill(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	c, err := StartEtcdProcCluster(ctx, EtcdProcClusterConfig{Dir: t.TempDir(), Members: 3, Fast: true})
	if errors.Is(err, ErrNoEtcd) {
		missingBinary(t, err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cli, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.Put(ctx, "k", "v1"); err != nil {
		t.Fatal(err)
	}
	leader, err := c.Leader(ctx, cli)
	if err != nil {
		t.Fatal(err)
	}
	st := c.Status(ctx, cli)
	for _, s := range st {
		if s.Err != nil || s.DBSize == 0 {
			t.Fatalf("member %d: %+v", s.Index, s)
		}
	}
	if err := c.Kill(leader); err != nil {
		t.Fatal(err)
	}
	if c.Pid(leader) != 0 {
		t.Fatal("killed member still has a pid")
	}
	// The client fails over to a live member; the new leader takes the
	// write once elected (retried: the election takes a few timeouts).
	for {
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := cli.Put(pctx, "k", "v2")
		pcancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("no write after the leader's death: %v", err)
		}
	}
	now, err := c.Leader(ctx, cli)
	if err != nil || now == leader {
		t.Fatalf("leader after the kill: %d, %v (killed %d)", now, err, leader)
	}
	g, err := cli.Get(ctx, "k")
	if err != nil || len(g.Kvs) != 1 || string(g.Kvs[0].Value) != "v2" {
		t.Fatalf("get: %v, %v", g, err)
	}
}
