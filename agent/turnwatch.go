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
// devices' prefix: a campaign waiting in a lock queue (waitTurn) waits here
// for the key before its own to go. One watch per waiting device cost each
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
	cli *clientv3.Client
	pfx string // <etcd prefix>/devices/
	log *slog.Logger

	mu sync.Mutex
	// seen: every delete under pfx up to this revision was handled (its
	// waits woken); 0 before the watch has its start revision.
	seen  int64
	waits map[string][]chan struct{} // key → the waits on its delete
}

func newTurnWatch(cli *clientv3.Client, pfx string, log *slog.Logger) *turnWatch {
	return &turnWatch{cli: cli, pfx: pfx, log: log, waits: make(map[string][]chan struct{})}
}

// run watches until ctx ends, resuming after an error with a backoff.
func (w *turnWatch) run(ctx context.Context) {
	delay := backoff.Backoff{Min: 100 * time.Millisecond, Max: 5 * time.Second}
	for ctx.Err() == nil {
		err := w.watch(ctx)
		if ctx.Err() != nil {
			break
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
	var wr clientv3.WatchResponse
	for wr = range w.cli.Watch(wctx, w.pfx, clientv3.WithPrefix(), clientv3.WithFilterPut(), clientv3.WithRev(from+1)) {
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
	return errors.Join(errors.New("watch closed"), wr.Err(), ctx.Err())
}

// start sets seen to rev, where the watch (re)starts from, and wakes every
// wait: a delete before rev may not have been seen.
func (w *turnWatch) start(rev int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seen = rev
	for k, chs := range w.waits {
		for _, ch := range chs {
			close(ch)
		}
		delete(w.waits, k)
	}
}

// deleted wakes the waits on the keys of evs' deletes.
func (w *turnWatch) deleted(evs []*clientv3.Event) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, ev := range evs {
		if ev.Type != mvccpb.DELETE {
			continue
		}
		k := string(ev.Kv.Key)
		for _, ch := range w.waits[k] {
			close(ch)
		}
		delete(w.waits, k)
		w.seen = max(w.seen, ev.Kv.ModRevision)
	}
}

// wait returns once key, seen to exist at revision rev, is deleted, or ctx
// ends (its error). A wake may be spurious (a reconnect, a compaction):
// the caller checks its turn, which is what it does after any wake.
func (w *turnWatch) wait(ctx context.Context, key string, rev int64) error {
	ch := make(chan struct{})
	w.mu.Lock()
	w.waits[key] = append(w.waits[key], ch)
	read := w.seen == 0 || w.seen >= rev
	w.mu.Unlock()
	if read {
		// The delete may have been handled before this wait was there.
		// Registered first, so a delete after this read wakes it.
		r, err := w.cli.Get(ctx, key, clientv3.WithKeysOnly())
		if err != nil {
			w.drop(key, ch)
			return fmt.Errorf("read %s: %w", key, err)
		}
		if len(r.Kvs) == 0 {
			w.drop(key, ch)
			return nil
		}
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		w.drop(key, ch)
		return ctx.Err()
	}
}

// drop removes the wait ch on key, if it is still there.
func (w *turnWatch) drop(key string, ch chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	chs := w.waits[key]
	if i := slices.Index(chs, ch); i >= 0 {
		chs = slices.Delete(chs, i, i+1)
	}
	if len(chs) == 0 {
		delete(w.waits, key)
	} else {
		w.waits[key] = chs
	}
}

// waiting returns how many waits are registered.
func (w *turnWatch) waiting() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, chs := range w.waits {
		n += len(chs)
	}
	return n
}
