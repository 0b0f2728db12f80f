package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// turnLeases returns leases for gateway with only what the lock queue
// needs, its turn watch over root running until the test ends.
func turnLeases(t *testing.T, cli *clientv3.Client, gateway, root string) *leases {
	l := &leases{cli: cli, gateway: gateway, turns: newTurnWatch(cli, root, slog.Default(), func() {})}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.turns.run(ctx)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return l
}

// waitTurn takes t's turn under pfx, parked (tryTurn) until it can: a
// campaign's path without the device and session around it.
func waitTurn(ctx context.Context, l *leases, pfx string, t lockTurn, lease clientv3.LeaseID, first *mvccpb.KeyValue, rev int64, note func(*mvccpb.KeyValue)) error {
	for {
		woke := make(chan struct{}, 1)
		p := &turnPark{pfx: pfx, t: t, lease: lease, note: note, resume: func() { woke <- struct{}{} }, drop: func() {}}
		ok, _, err := l.tryTurn(ctx, p, first, rev)
		if err != nil || ok {
			return err
		}
		select {
		case <-woke:
		case <-ctx.Done():
			return ctx.Err()
		}
		first = nil
	}
}

// parkOn parks on key (seen at rev) and returns the channel its resume
// closes, or nil if the key was gone already.
func parkOn(t *testing.T, w *turnWatch, key string, rev int64) chan struct{} {
	t.Helper()
	woke := make(chan struct{})
	parked, err := w.park(t.Context(), key, rev, &turnPark{resume: func() { close(woke) }, drop: func() {}})
	if err != nil {
		t.Fatal(err)
	}
	if !parked {
		return nil
	}
	return woke
}

func grantLease(t *testing.T, cli *clientv3.Client) clientv3.LeaseID {
	t.Helper()
	g, err := cli.Grant(t.Context(), 30)
	if err != nil {
		t.Fatal(err)
	}
	return g.ID
}

// A campaign waiting in a device's lock queue takes its turn only once
// every key created before its own is gone, and then in one write that
// names it the holder; while a key before it exists, the turn is refused
// and that key named; with its own key gone (its lease expired) the
// session is over.
func TestWaitTurnTakesTheLockInOneWrite(t *testing.T) {
	cli := etcdClient(t)
	ctx := t.Context()
	root := fmt.Sprintf("/turn-%d/devices/", time.Now().UnixNano())
	pfx := root + "d1/lock"
	la, lb := grantLease(t, cli), grantLease(t, cli)
	a, b := turnLeases(t, cli, "gw-a", root), turnLeases(t, cli, "gw-b", root)
	ta, first, _, err := a.queueTurn(ctx, pfx, la)
	if err != nil || string(first.Key) != ta.key {
		t.Fatalf("a queued %+v, first %v, %v", ta, first, err)
	}
	tb, first, rev, err := b.queueTurn(ctx, pfx, lb)
	if err != nil || string(first.Key) != ta.key || tb.rev <= ta.rev {
		t.Fatalf("b queued %+v behind %v, %v", tb, first, err)
	}
	// b's turn while a's key exists: refused, a named.
	r := b.takeTurn(ctx, pfx, tb, lb)
	if r.ok || r.err != nil || string(r.first.Key) != ta.key {
		t.Fatalf("b took the turn ahead of a: %+v", r)
	}
	// Queued again, b finds its own key (same revision).
	if again, _, _, err := b.queueTurn(ctx, pfx, lb); err != nil || again != tb {
		t.Fatalf("b queued again: %+v, %v (want %+v)", again, err, tb)
	}
	got := make(chan error, 1)
	var noted []string
	go func() {
		got <- waitTurn(ctx, b, pfx, tb, lb, first, rev, func(kv *mvccpb.KeyValue) { noted = append(noted, string(kv.Key)) })
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
	if len(noted) != 1 || noted[0] != ta.key {
		t.Fatalf("holders noted while b waited: %q, want [%s]", noted, ta.key)
	}
	g, err := cli.Get(ctx, tb.key)
	if err != nil || len(g.Kvs) != 1 || string(g.Kvs[0].Value) != "gw-b" || g.Kvs[0].CreateRevision != tb.rev {
		t.Fatalf("b's key after its turn: %v %v", g, err)
	}
	// b's lease gone: its turn is over.
	if _, err := cli.Revoke(ctx, lb); err != nil {
		t.Fatal(err)
	}
	if r := b.takeTurn(ctx, pfx, tb, lb); !errors.Is(r.err, concurrency.ErrSessionExpired) {
		t.Fatalf("turn of an expired key: %+v", r)
	}
}

// A park registered after the watch has handled a newer delete reads the
// key: a key deleted before the park was there does not leave it parked
// for a delete that already passed; one still there is waited for.
func TestTurnWatchWaitAfterTheDelete(t *testing.T) {
	cli := etcdClient(t)
	ctx := t.Context()
	root := fmt.Sprintf("/turnwatch-%d/devices/", time.Now().UnixNano())
	l := turnLeases(t, cli, "gw", root)
	put := func(k string) int64 {
		r, err := cli.Put(ctx, root+k, "")
		if err != nil {
			t.Fatal(err)
		}
		return r.Header.Revision
	}
	del := func(k string) {
		if _, err := cli.Delete(ctx, root+k); err != nil {
			t.Fatal(err)
		}
	}
	revGone, revStays := put("gone"), put("stays")
	del("gone")
	// The watch handles a later delete: everything up to it is seen.
	put("other")
	del("other")
	deadline := time.Now().Add(time.Minute)
	for {
		l.turns.mu.Lock()
		seen := l.turns.seen
		l.turns.mu.Unlock()
		if seen > revStays {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the watch did not see the delete")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if woke := parkOn(t, l.turns, root+"gone", revGone); woke != nil {
		t.Fatal("parked on a key deleted before the park")
	}
	woke := parkOn(t, l.turns, root+"stays", revStays)
	if woke == nil {
		t.Fatal("not parked on a key that exists")
	}
	select {
	case <-woke:
		t.Fatal("resumed while the key exists")
	case <-time.After(300 * time.Millisecond):
	}
	del("stays")
	<-woke
	if n := l.turns.parked(); n != 0 {
		t.Fatalf("%d parks left", n)
	}
}

// A park dropped with its owner (the session run ended) runs its drop,
// not its resume, and is gone.
func TestTurnWatchUnpark(t *testing.T) {
	cli := etcdClient(t)
	root := fmt.Sprintf("/turnunpark-%d/devices/", time.Now().UnixNano())
	l := turnLeases(t, cli, "gw", root)
	r, err := cli.Put(t.Context(), root+"k", "")
	if err != nil {
		t.Fatal(err)
	}
	// The watch's first start resumes every park there before it (a
	// delete may have passed): park only once it watches.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		l.turns.mu.Lock()
		seen := l.turns.seen
		l.turns.mu.Unlock()
		if seen > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the watch did not start")
		}
	}
	var resumed, dropped int
	owner := new(int)
	for range 3 {
		p := &turnPark{owner: owner, resume: func() { resumed++ }, drop: func() { dropped++ }}
		if parked, err := l.turns.park(t.Context(), root+"k", r.Header.Revision, p); !parked || err != nil {
			t.Fatal(parked, err)
		}
	}
	other := parkOn(t, l.turns, root+"k", r.Header.Revision)
	l.turns.unpark(owner)
	if dropped != 3 || resumed != 0 || l.turns.parked() != 1 {
		t.Fatalf("after unpark: %d dropped, %d resumed, %d parked", dropped, resumed, l.turns.parked())
	}
	if _, err := cli.Delete(t.Context(), root+"k"); err != nil {
		t.Fatal(err)
	}
	<-other
}

// A watch that (re)starts — the first time, after a reconnect that found
// the history compacted — may have missed deletes: every park is resumed
// (each takes its turn or parks again), and the watch goes on from the
// revision given.
func TestTurnWatchStartResumesEveryPark(t *testing.T) {
	w := newTurnWatch(nil, "/unused/", slog.Default(), func() {})
	w.seen = 1 // as if watching: no park reads its key
	woke := make(chan string, 3)
	for _, k := range []string{"a", "a", "b"} {
		p := &turnPark{resume: func() { woke <- k }, drop: func() { t.Error("dropped") }}
		if parked, err := w.park(t.Context(), k, 10, p); !parked || err != nil {
			t.Fatal(parked, err)
		}
	}
	w.start(41)
	got := map[string]int{}
	for range 3 {
		got[<-woke]++
	}
	if got["a"] != 2 || got["b"] != 1 || w.parked() != 0 || w.seen != 41 {
		t.Fatalf("resumed %v, %d parks left, seen %d", got, w.parked(), w.seen)
	}
}

// A delete event that resumes BurstDevices parks or more — a holder's
// lease expired, its devices' campaigns go on together — calls the burst
// hook once; one that resumes fewer does not.
func TestTurnWatchBurst(t *testing.T) {
	var bursts atomic.Int32
	w := newTurnWatch(nil, "/unused/", slog.Default(), func() { bursts.Add(1) })
	w.seen = 1 // as if watching: no park reads its key
	woke := make(chan struct{}, 2*BurstDevices)
	dels := func(pfx string, n int) (evs []*clientv3.Event) {
		for i := range n {
			k := fmt.Sprintf("%s%d", pfx, i)
			p := &turnPark{resume: func() { woke <- struct{}{} }, drop: func() { t.Error("dropped") }}
			if parked, err := w.park(t.Context(), k, 10, p); !parked || err != nil {
				t.Fatal(parked, err)
			}
			evs = append(evs, &clientv3.Event{Type: mvccpb.DELETE, Kv: &mvccpb.KeyValue{Key: []byte(k), ModRevision: 20}})
		}
		return evs
	}
	few, many := dels("few-", BurstDevices-1), dels("many-", BurstDevices)
	w.deleted(few)
	if bursts.Load() != 0 {
		t.Fatalf("%d parks resumed: %d bursts, want none", len(few), bursts.Load())
	}
	w.deleted(many)
	if bursts.Load() != 1 {
		t.Fatalf("%d parks resumed: %d bursts, want one", len(many), bursts.Load())
	}
	for range 2*BurstDevices - 1 {
		<-woke
	}
}

// The queue writes of campaigns started together, and the turns of
// devices woken together, are written in shared transactions: 300 devices
// queued behind a holder get their keys in fewer etcd revisions than
// devices, and once the holder's lease is revoked they are taken over in
// fewer revisions than devices (one each before), every one of them by
// its waiting campaign, each key written with the new holder.
func TestTurnsOfWokenDevicesShareTransactions(t *testing.T) {
	cli := etcdClient(t)
	ctx := t.Context()
	root := fmt.Sprintf("/turnbatch-%d/devices/", time.Now().UnixNano())
	la, lb := grantLease(t, cli), grantLease(t, cli)
	a, b := turnLeases(t, cli, "gw-a", root), turnLeases(t, cli, "gw-b", root)
	const n = 300
	var wg sync.WaitGroup
	errs := make(chan error, n)
	queued := make(chan int64, n)
	for i := range n {
		pfx := fmt.Sprintf("%sd%d/lock", root, i)
		if _, _, _, err := a.queueTurn(ctx, pfx, la); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		pfx := fmt.Sprintf("%sd%d/lock", root, i)
		wg.Go(func() {
			tb, first, rev, err := b.queueTurn(ctx, pfx, lb)
			if err != nil {
				errs <- err
				return
			}
			queued <- tb.rev
			errs <- waitTurn(ctx, b, pfx, tb, lb, first, rev, nil)
		})
	}
	for b.turns.parked() < n {
		time.Sleep(10 * time.Millisecond)
	}
	close(queued)
	revs := map[int64]bool{}
	for r := range queued {
		revs[r] = true
	}
	t.Logf("%d devices queued in %d revisions", n, len(revs))
	if len(revs) >= n {
		t.Fatalf("%d devices queued in %d revisions: the queue writes were not batched", n, len(revs))
	}
	rv, err := cli.Revoke(ctx, la)
	if err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	g, err := cli.Get(ctx, root, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	var taken int64
	for _, kv := range g.Kvs {
		if string(kv.Value) != "gw-b" {
			t.Fatalf("%s: %q", kv.Key, kv.Value)
		}
		taken = max(taken, kv.ModRevision)
	}
	if len(g.Kvs) != n {
		t.Fatalf("%d keys, want %d", len(g.Kvs), n)
	}
	used := taken - rv.Header.Revision
	t.Logf("%d devices taken over in %d revisions", n, used)
	if used >= n {
		t.Fatalf("%d devices took %d revisions: the turns were not batched", n, used)
	}
}
