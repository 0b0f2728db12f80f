package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgefence/edgefence/internal/backoff"
)

// turnWatch is the agent's one etcd watch over the deletes under its
// devices' prefix: a campaign waiting in a lock queue parks here
// (turnPark, tryTurn) until the key before its own goes. One watch per waiting device cost each
// a watcher stream in clientv3 and etcd (~18 KB of the agent's RSS), and
// a round trip to create it (a stream's watches are created one at a
// time): a backup agent for 10,000 devices took ~190 MiB and half a
// minute to queue (docs/BENCHMARKS.md §66). Puts are filtered out at etcd;
// a holder's lease expiry deletes all its keys in one revision, which this
// watch receives as one response.
//
// The watch resumes from the revision after the last delete it handled,
// so no delete is missed across reconnects. A wait registered for a key
// seen at revision rev is safe without a read when every delete the watch
// handled is older than rev: the key's delete, if it comes, is newer than
// rev and still to come. Otherwise the delete may have passed already, and
// the wait reads the key once (wait).
type turnWatch struct {
	cli   *clientv3.Client
	pfx   string // <etcd prefix>/devices/
	log   *slog.Logger
	burst func() // Options.OnBurst: a takeover of BurstDevices or more begins

	mu sync.Mutex
	// seen: every delete under pfx up to this revision was handled (its
	// parks resumed); 0 before the watch has its start revision.
	seen  int64
	parks map[string][]*turnPark // key → the parks on its delete

	lost chan struct{} // etcdLostData
}

func newTurnWatch(cli *clientv3.Client, pfx string, log *slog.Logger, burst func()) *turnWatch {
	return &turnWatch{cli: cli, pfx: pfx, log: log, burst: burst, parks: make(map[string][]*turnPark), lost: make(chan struct{}, 1)}
}

// etcdLostData tells the watch that etcd lost data (rebuilt, wiped,
// restored: the republisher sees it): resumed after the revision it had
// handled, which the rebuilt etcd has not reached, it would miss every
// delete until etcd passed it, and the campaigns parked on one would wait
// for ever. It starts again from etcd's revision now and resumes every
// park (each takes its turn or waits again).
func (w *turnWatch) etcdLostData() {
	select {
	case w.lost <- struct{}{}:
	default:
	}
}

// run watches until ctx ends, resuming after an error with a backoff.
func (w *turnWatch) run(ctx context.Context) {
	delay := backoff.Backoff{Min: 100 * time.Millisecond, Max: 5 * time.Second}
	for ctx.Err() == nil {
		err := w.watch(ctx)
		if ctx.Err() != nil {
			break
		}
		if errors.Is(err, errEtcdLostData) {
			w.log.Info("etcd lost data: the lock queue watch starts again from its revision now")
			delay.Reset()
			continue
		}
		d := delay.Next()
		w.log.Warn("lock queue watch", "err", err, "retry_in", d)
		if !backoff.Sleep(ctx, d) {
			break
		}
	}
}

// watch runs one watch from the revision after seen (from the current
// revision the first time) until it fails.
func (w *turnWatch) watch(ctx context.Context) error {
	w.mu.Lock()
	from := w.seen
	w.mu.Unlock()
	select {
	case <-w.lost: // from etcd's revision now, as below
		from = 0
	default:
	}
	if from == 0 {
		r, err := w.cli.Get(ctx, w.pfx, clientv3.WithKeysOnly())
		if err != nil {
			return fmt.Errorf("read the revision: %w", err)
		}
		from = r.Header.Revision
		w.start(from)
	}
	// Leader required: a member cut off from its cluster ends the watch,
	// and the next one goes to a member that has the deletes.
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := w.cli.Watch(wctx, w.pfx, clientv3.WithPrefix(), clientv3.WithFilterPut(), clientv3.WithRev(from+1))
	for {
		var wr clientv3.WatchResponse
		var ok bool
		select {
		case <-w.lost:
			w.mu.Lock()
			w.seen = 0 // the next watch reads etcd's revision, and resumes every park
			w.mu.Unlock()
			return errEtcdLostData
		case wr, ok = <-wch:
		}
		if !ok {
			return errors.Join(errors.New("watch closed"), wr.Err(), ctx.Err())
		}
		if wr.CompactRevision != 0 {
			// The deletes up to the compaction are gone from etcd's
			// history: wake every wait (each takes its turn or waits
			// again, told the key before it) and go on from there.
			w.start(wr.CompactRevision - 1)
			return fmt.Errorf("history compacted at revision %d: %w", wr.CompactRevision, wr.Err())
		}
		if err := wr.Err(); err != nil {
			return err
		}
		w.deleted(wr.Events)
	}
}

// start sets seen to rev, where the watch (re)starts from, and resumes
// every park: a delete before rev may not have been seen.
func (w *turnWatch) start(rev int64) {
	w.mu.Lock()
	w.seen = rev
	var woken []*turnPark
	for k, ps := range w.parks {
		woken = append(woken, ps...)
		delete(w.parks, k)
	}
	w.mu.Unlock()
	resume(woken)
}

// deleted resumes the parks on the keys of evs' deletes.
func (w *turnWatch) deleted(evs []*clientv3.Event) {
	var woken []*turnPark
	w.mu.Lock()
	for _, ev := range evs {
		if ev.Type != mvccpb.DELETE {
			continue
		}
		k := string(ev.Kv.Key)
		woken = append(woken, w.parks[k]...)
		delete(w.parks, k)
		w.seen = max(w.seen, ev.Kv.ModRevision)
	}
	w.mu.Unlock()
	if len(woken) >= BurstDevices {
		w.burst() // a holder's expiry: its devices' campaigns resume together
	}
	resume(woken)
}

func resume(ps []*turnPark) {
	for _, p := range ps {
		go p.resume()
	}
}

// park registers p to resume once key, seen to exist at revision rev, is
// deleted, and reports whether it did: not if ctx has ended (its error),
// nor if the key is gone already (nil). Once it returns parked, p.resume
// or p.drop runs, exactly once.
func (w *turnWatch) park(ctx context.Context, key string, rev int64, p *turnPark) (parked bool, err error) {
	w.mu.Lock()
	w.parks[key] = append(w.parks[key], p)
	read := w.seen == 0 || w.seen >= rev
	w.mu.Unlock()
	// Registered first: an unpark of p's owner that ran before this
	// registration came after ctx ended, and a delete after the read
	// below resumes p.
	if err := ctx.Err(); err != nil {
		if w.take(key, p) {
			return false, err
		}
		return true, nil
	}
	if !read {
		return true, nil
	}
	// The delete may have been handled before p was there.
	r, err := w.cli.Get(ctx, key, clientv3.WithKeysOnly())
	switch {
	case err != nil:
		if w.take(key, p) {
			return false, fmt.Errorf("read %s: %w", key, err)
		}
	case len(r.Kvs) == 0:
		return !w.take(key, p), nil
	}
	return true, nil
}

// take removes p's park on key and reports whether it was still there
// (else a wake or an unpark has it).
func (w *turnWatch) take(key string, p *turnPark) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	ps := w.parks[key]
	i := slices.Index(ps, p)
	if i < 0 {
		return false
	}
	if ps = slices.Delete(ps, i, i+1); len(ps) == 0 {
		delete(w.parks, key)
	} else {
		w.parks[key] = ps
	}
	return true
}

// unpark drops every park of owner (p.drop runs for each): its session
// run has ended.
func (w *turnWatch) unpark(owner any) {
	var dropped []*turnPark
	w.mu.Lock()
	for k, ps := range w.parks {
		kept := ps[:0]
		for _, p := range ps {
			if p.owner == owner {
				dropped = append(dropped, p)
			} else {
				kept = append(kept, p)
			}
		}
		if len(kept) == 0 {
			delete(w.parks, k)
		} else {
			w.parks[k] = kept
		}
	}
	w.mu.Unlock()
	for _, p := range dropped {
		p.drop()
	}
}

// parked returns how many parks are registered.
func (w *turnWatch) parked() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, ps := range w.parks {
		n += len(ps)
	}
	return n
}
