package agent

import (
	"errors"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// A campaign waiting in a device's lock queue takes its turn only once
// every key created before its own is gone, and then in one write that
// names it the holder; while a key before it exists, the turn is refused
// and that key named; with its own key gone (its lease expired) the
// session is over.
func TestWaitTurnTakesTheLockInOneWrite(t *testing.T) {
	cli := etcdClient(t)
	ctx := t.Context()
	pfx := fmt.Sprintf("/turn-%d/devices/d1/lock", time.Now().UnixNano())
	grant := func() clientv3.LeaseID {
		g, err := cli.Grant(ctx, 30)
		if err != nil {
			t.Fatal(err)
		}
		return g.ID
	}
	la, lb := grant(), grant()
	a := &leases{cli: cli, gateway: "gw-a", wakes: make(chan struct{}, 1)}
	b := &leases{cli: cli, gateway: "gw-b", wakes: make(chan struct{}, 1)}
	ta, first, _, err := a.queueTurn(ctx, pfx, la)
	if err != nil || first != ta.key {
		t.Fatalf("a queued %+v, first %q, %v", ta, first, err)
	}
	tb, first, _, err := b.queueTurn(ctx, pfx, lb)
	if err != nil || first != ta.key || tb.rev <= ta.rev {
		t.Fatalf("b queued %+v behind %q, %v", tb, first, err)
	}
	// b's turn while a's key exists: refused, a named.
	ok, first, _, err := b.takeTurn(ctx, pfx, tb, lb)
	if ok || err != nil || first != ta.key {
		t.Fatalf("b took the turn ahead of a: %v %q %v", ok, first, err)
	}
	// Queued again, b finds its own key (same revision).
	if again, _, _, err := b.queueTurn(ctx, pfx, lb); err != nil || again != tb {
		t.Fatalf("b queued again: %+v, %v (want %+v)", again, err, tb)
	}
	got := make(chan error, 1)
	go func() {
		won, err := b.waitTurn(ctx, pfx, lb, func() {})
		if err == nil && won != tb {
			err = fmt.Errorf("won %+v, want %+v", won, tb)
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("b's wait ended while a holds the lock: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	if _, err := cli.Revoke(ctx, la); err != nil { // a's lease gone: its key with it
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	r, err := cli.Get(ctx, tb.key)
	if err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "gw-b" || r.Kvs[0].CreateRevision != tb.rev {
		t.Fatalf("b's key after its turn: %v %v", r, err)
	}
	// b's lease gone: its turn is over.
	if _, err := cli.Revoke(ctx, lb); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := b.takeTurn(ctx, pfx, tb, lb); !errors.Is(err, concurrency.ErrSessionExpired) {
		t.Fatalf("turn of an expired key: %v", err)
	}
}
