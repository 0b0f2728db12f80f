package agent

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// A campaign that finds the device held waits for its turn in the lock's
// queue here rather than in concurrency.Mutex.Lock. The queue is the
// same — a key <lock prefix>/<lease hex> under the session's lease, the
// turn of the key with the lowest CreateRevision, which is the token —
// but the turn is taken in one write: a transaction that checks the key
// is still ours and that no key under the prefix was created before it,
// and then writes the gateway into it. Mutex.Lock, woken, read twice
// (the keys before ours, then ours) and the campaign then wrote the
// token's transaction: three requests a device. When a holder of 10,000
// devices dies, its lease's expiry wakes 10,000 campaigns at once; on
// etcd 3.4 a read waits behind the backend's commit, and the 20,000
// reads set the pace (docs/BENCHMARKS.md, the cluster benchmark).

// lockTurn is a campaign's key in a device's lock queue.
type lockTurn struct {
	key string
	rev int64 // its CreateRevision: the token, once it is the first
}

// waitTurn queues a key for lease under pfx (or finds the one it queued
// before), gives the campaign's slot back (release) and waits until the
// keys before it are gone; then it takes the turn, holding a wake slot
// for the write. It returns the key, its turn taken and the gateway
// written into it; concurrency.ErrSessionExpired if the key is gone.
func (l *leases) waitTurn(ctx context.Context, pfx string, lease clientv3.LeaseID, release func()) (lockTurn, error) {
	t, first, rev, err := l.queueTurn(ctx, pfx, lease)
	release()
	for err == nil {
		if first != t.key {
			if err = waitDelete(ctx, l.cli, first, rev); err != nil {
				break
			}
		}
		if !acquireSlot(ctx, l.wakes) {
			return t, ctx.Err()
		}
		var ok bool
		ok, first, rev, err = l.takeTurn(ctx, pfx, t, lease)
		<-l.wakes
		if ok {
			return t, nil
		}
	}
	return t, err
}

// queueTurn puts the key for lease under pfx unless it is there, and
// returns it with the first key in the queue and the revision to watch
// it from.
func (l *leases) queueTurn(ctx context.Context, pfx string, lease clientv3.LeaseID) (t lockTurn, first string, rev int64, err error) {
	key := fmt.Sprintf("%s/%x", pfx, lease)
	get, getFirst := clientv3.OpGet(key), clientv3.OpGet(pfx+"/", clientv3.WithFirstCreate()...)
	resp, err := l.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, "", clientv3.WithLease(lease)), get, getFirst).
		Else(get, getFirst).Commit()
	if err != nil {
		return t, "", 0, fmt.Errorf("queue %s: %w", key, err)
	}
	rs := resp.Responses[len(resp.Responses)-2:]
	mine, firsts := rs[0].GetResponseRange().Kvs, rs[1].GetResponseRange().Kvs
	if len(mine) == 0 || clientv3.LeaseID(mine[0].Lease) != lease || len(firsts) == 0 {
		return t, "", 0, concurrency.ErrSessionExpired
	}
	return lockTurn{key: key, rev: mine[0].CreateRevision}, string(firsts[0].Key), resp.Header.Revision, nil
}

// takeTurn writes the gateway into t's key if it is still ours (its
// revision, our lease) and no key under pfx was created before it: the
// lock is ours. Else it returns the first key now and the revision to
// watch it from; concurrency.ErrSessionExpired if our key is gone.
func (l *leases) takeTurn(ctx context.Context, pfx string, t lockTurn, lease clientv3.LeaseID) (ok bool, first string, rev int64, err error) {
	mine := clientv3.Compare(clientv3.CreateRevision(t.key), "=", t.rev)
	none := clientv3.Compare(clientv3.CreateRevision(pfx+"/"), ">", t.rev-1).WithPrefix()
	get := clientv3.OpGet(t.key)
	resp, err := l.cli.Txn(ctx).If(mine, none).
		Then(clientv3.OpPut(t.key, l.gateway, clientv3.WithLease(lease)), get).
		Else(get, clientv3.OpGet(pfx+"/", clientv3.WithFirstCreate()...)).Commit()
	if err != nil {
		return false, "", 0, fmt.Errorf("take the turn of %s: %w", t.key, err)
	}
	if resp.Succeeded {
		kvs := resp.Responses[1].GetResponseRange().Kvs
		if len(kvs) == 0 || clientv3.LeaseID(kvs[0].Lease) != lease {
			return false, "", 0, concurrency.ErrSessionExpired
		}
		return true, t.key, resp.Header.Revision, nil
	}
	kvs, firsts := resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs
	if len(kvs) == 0 || kvs[0].CreateRevision != t.rev || len(firsts) == 0 {
		return false, "", 0, concurrency.ErrSessionExpired
	}
	return false, string(firsts[0].Key), resp.Header.Revision, nil
}

// waitDelete waits until key is deleted at or after revision rev.
func waitDelete(ctx context.Context, w clientv3.Watcher, key string, rev int64) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wr clientv3.WatchResponse
	for wr = range w.Watch(wctx, key, clientv3.WithRev(rev)) {
		for _, ev := range wr.Events {
			if ev.Type == mvccpb.DELETE {
				return nil
			}
		}
	}
	if err := errors.Join(wr.Err(), ctx.Err()); err != nil {
		return err
	}
	return errors.New("watch ended waiting for the delete of " + key)
}
