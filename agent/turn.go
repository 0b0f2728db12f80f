package agent

import (
	"context"
	"errors"
	"fmt"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// A device's lock is a queue of keys <lock prefix>/<lease hex>, one per
// campaigning session, under the session's lease — the keys and order of
// concurrency.Mutex, so agents of either kind share a lock — and the
// turn belongs to the key with the lowest CreateRevision, which is the
// token. A campaign queues its key (queueTurn: one write, which also
// reads the first key, the holder) and takes the turn in one more write
// (takeTurn): a transaction that checks the key is still ours and that no
// key under the prefix was created before it, and then writes the gateway
// into it. A campaign that finds another key first waits for that key's
// delete on the agent's one watch (turnWatch) and tries again.
//
// The queue and turn writes of concurrent campaigns share etcd
// transactions (one nested transaction each; turnBatch): when a holder of
// 10,000 devices dies, its lease's expiry deletes its keys in one revision
// and wakes every campaign waiting on them at once, and one write each set
// the takeover's pace (~700 devices/s on this machine, docs/BENCHMARKS.md
// §66). Keys queued in one transaction share a CreateRevision, so devices
// may share a token value: a token orders one device's holders (I1, I2),
// and a device's keys are never queued in one transaction together (one
// campaign per device and session, one key per lease).

// lockTurn is a campaign's key in a device's lock queue.
type lockTurn struct {
	key string
	rev int64 // its CreateRevision: the token, once it is the first
}

// turnBatch is the most queue and turn writes in one etcd transaction.
// etcd's --max-txn-ops (128 by default) bounds a transaction's operations,
// and a nested transaction's at that bound less its parent's: 64 leaves 64
// for each device's (it uses 3 at most).
const turnBatch = 64

// turnTxns is how many of those transactions are in flight at once (8
// measured no faster: docs/BENCHMARKS.md §76).
const turnTxns = 4

// turnReq is one campaign's queue or turn write, waiting for a batch
// (queueTurn, takeTurn).
type turnReq struct {
	queue bool // queueTurn's; else takeTurn's
	pfx   string
	t     lockTurn
	lease clientv3.LeaseID
	res   turnRes
	done  chan struct{} // closed when res is set
}

// turnRes is a queue or turn write's outcome.
type turnRes struct {
	t     lockTurn         // the key queued (queueTurn)
	ok    bool             // the turn is taken (takeTurn)
	first *mvccpb.KeyValue // the first key under the prefix after it
	rev   int64            // the revision to watch first from
	err   error
}

// A turnPark is a campaign waiting in a lock queue without a goroutine of
// its own: a waiting agent for 10,000 devices kept 10,000 goroutines, ~10
// KB of stack each and scanned by every GC (docs/BENCHMARKS.md §72). The
// agent's watch (turnWatch) runs resume in a new goroutine when the key
// before it is deleted.
type turnPark struct {
	pfx   string
	t     lockTurn
	lease clientv3.LeaseID
	owner any                    // whose parks are dropped together (turnWatch.unpark): the session run
	note  func(*mvccpb.KeyValue) // told of every other key found first; nil: nobody
	// resume runs in a new goroutine once the key before t is deleted
	// (or on a spurious wake: a reconnect, a compaction); drop instead,
	// if the park is dropped (unpark). Exactly one of them runs.
	resume, drop func()
}

// tryTurn takes p's turn, or parks p on the first key (seen at revision
// rev; nil: not known, the turn's transaction tells). ok: the turn is
// taken, the gateway written into p's key; parked: p.resume (or p.drop)
// will run. It returns concurrency.ErrSessionExpired if p's key is gone.
func (l *leases) tryTurn(ctx context.Context, p *turnPark, first *mvccpb.KeyValue, rev int64) (ok, parked bool, err error) {
	for {
		if first == nil || string(first.Key) == p.t.key {
			r := l.takeTurn(ctx, p.pfx, p.t, p.lease)
			if r.err != nil || r.ok {
				return r.ok, false, r.err
			}
			first, rev = r.first, r.rev
			continue
		}
		if p.note != nil {
			p.note(first)
		}
		if parked, err := l.turns.park(ctx, string(first.Key), rev, p); parked || err != nil {
			return false, parked, err
		}
		first = nil // that key is gone already
	}
}

// queueTurn puts the key for lease under pfx unless it is there, and
// returns it with the first key in the queue and the revision to watch
// it from; concurrency.ErrSessionExpired if the key is not under lease.
// The write joins a batch (turnBatch) with the concurrent campaigns'.
func (l *leases) queueTurn(ctx context.Context, pfx string, lease clientv3.LeaseID) (lockTurn, *mvccpb.KeyValue, int64, error) {
	r := l.batchTurn(ctx, &turnReq{queue: true, pfx: pfx, t: lockTurn{key: fmt.Sprintf("%s/%x", pfx, lease)}, lease: lease})
	return r.t, r.first, r.rev, r.err
}

// takeTurn writes the gateway into t's key if it is still ours (its
// revision, our lease) and no key under pfx was created before it: the
// lock is ours (ok). Else it returns the first key now and the revision
// to watch it from; concurrency.ErrSessionExpired if our key is gone. The
// write joins a batch (turnBatch) with the concurrent campaigns'.
func (l *leases) takeTurn(ctx context.Context, pfx string, t lockTurn, lease clientv3.LeaseID) turnRes {
	return l.batchTurn(ctx, &turnReq{pfx: pfx, t: t, lease: lease})
}

// batchTurn queues r for the next batch, leads batches if fewer than
// turnTxns campaigns do, and returns r's outcome.
func (l *leases) batchTurn(ctx context.Context, r *turnReq) turnRes {
	r.done = make(chan struct{})
	l.turnMu.Lock()
	l.turnQueue = append(l.turnQueue, r)
	lead := l.turnLeaders < turnTxns
	if lead {
		l.turnLeaders++
	}
	l.turnMu.Unlock()
	if lead {
		l.leadTurns(ctx, r)
	}
	<-r.done
	return r.res
}

// leadTurns commits batches of queued turn writes; at most turnTxns
// campaigns lead at once. A leader goes on while writes are queued, unless
// its own is done and another leader is left to go on.
func (l *leases) leadTurns(ctx context.Context, mine *turnReq) {
	for {
		l.turnMu.Lock()
		n := min(len(l.turnQueue), turnBatch)
		if n == 0 || (isDone(mine.done) && l.turnLeaders > 1) {
			l.turnLeaders--
			l.turnMu.Unlock()
			return
		}
		batch := make([]*turnReq, n)
		copy(batch, l.turnQueue)
		l.turnQueue = l.turnQueue[n:]
		if len(l.turnQueue) == 0 {
			l.turnQueue = nil
		}
		l.turnMu.Unlock()
		l.commitTurns(ctx, batch)
	}
}

func isDone(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// commitTurns writes batch's queue and turn writes in one transaction, each its own
// nested transaction; a transaction too large for the etcd is split.
func (l *leases) commitTurns(ctx context.Context, batch []*turnReq) {
	ops := make([]clientv3.Op, len(batch))
	for i, r := range batch {
		ops[i] = l.turnOp(r)
	}
	resp, err := l.cli.Txn(ctx).Then(ops...).Commit()
	if errors.Is(err, rpctypes.ErrTooManyOps) && len(batch) > 1 {
		l.commitTurns(ctx, batch[:len(batch)/2])
		l.commitTurns(ctx, batch[len(batch)/2:])
		return
	}
	for i, r := range batch {
		switch {
		case err != nil && r.queue:
			r.res = turnRes{err: fmt.Errorf("queue %s: %w", r.t.key, err)}
		case err != nil:
			r.res = turnRes{err: fmt.Errorf("take the turn of %s: %w", r.t.key, err)}
		case r.queue:
			r.res = queueResult(resp.Responses[i].GetResponseTxn(), resp.Header.Revision, r.lease, r.t.key)
		default:
			r.res = turnResult(resp.Responses[i].GetResponseTxn(), resp.Header.Revision, r.lease, r.t)
		}
		close(r.done)
	}
}

// turnOp is r's nested transaction. Queue: put the key unless it exists,
// then read it and the queue's first key. Turn: if the key still has its
// CreateRevision and no key under the prefix is older, write the gateway
// into it and read it; else read it and the first key.
func (l *leases) turnOp(r *turnReq) clientv3.Op {
	get, getFirst := clientv3.OpGet(r.t.key), clientv3.OpGet(r.pfx+"/", clientv3.WithFirstCreate()...)
	if r.queue {
		return clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(r.t.key), "=", 0)},
			[]clientv3.Op{clientv3.OpPut(r.t.key, "", clientv3.WithLease(r.lease)), get, getFirst},
			[]clientv3.Op{get, getFirst})
	}
	mine := clientv3.Compare(clientv3.CreateRevision(r.t.key), "=", r.t.rev)
	none := clientv3.Compare(clientv3.CreateRevision(r.pfx+"/"), ">", r.t.rev-1).WithPrefix()
	return clientv3.OpTxn([]clientv3.Cmp{mine, none},
		[]clientv3.Op{clientv3.OpPut(r.t.key, l.gateway, clientv3.WithLease(r.lease)), get},
		[]clientv3.Op{get, getFirst})
}

// queueResult reads a queue write's nested response (commitTurns).
func queueResult(tr *pb.TxnResponse, rev int64, lease clientv3.LeaseID, key string) turnRes {
	if tr == nil || len(tr.Responses) < 2 {
		return turnRes{err: fmt.Errorf("queue %s: malformed response", key)}
	}
	rs := tr.Responses[len(tr.Responses)-2:]
	mine, firsts := rs[0].GetResponseRange().GetKvs(), rs[1].GetResponseRange().GetKvs()
	if len(mine) == 0 || clientv3.LeaseID(mine[0].Lease) != lease || len(firsts) == 0 {
		return turnRes{err: concurrency.ErrSessionExpired}
	}
	return turnRes{t: lockTurn{key: key, rev: mine[0].CreateRevision}, first: firsts[0], rev: rev}
}

// turnResult reads one nested transaction's response (commitTurns).
func turnResult(tr *pb.TxnResponse, rev int64, lease clientv3.LeaseID, t lockTurn) turnRes {
	if tr == nil || len(tr.Responses) < 2 {
		return turnRes{err: fmt.Errorf("take the turn of %s: malformed response", t.key)}
	}
	kvs := tr.Responses[0].GetResponseRange().GetKvs()
	if tr.Succeeded {
		kvs = tr.Responses[1].GetResponseRange().GetKvs()
		if len(kvs) == 0 || clientv3.LeaseID(kvs[0].Lease) != lease {
			return turnRes{err: concurrency.ErrSessionExpired}
		}
		return turnRes{ok: true, first: kvs[0], rev: rev}
	}
	firsts := tr.Responses[1].GetResponseRange().GetKvs()
	if len(kvs) == 0 || kvs[0].CreateRevision != t.rev || len(firsts) == 0 {
		return turnRes{err: concurrency.ErrSessionExpired}
	}
	return turnRes{first: firsts[0], rev: rev}
}
