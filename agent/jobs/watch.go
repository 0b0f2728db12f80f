package jobs

import (
	"context"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Change is a change of a job document or a rollout that Store.Watch
// delivers.
type Change struct {
	// ID names the job.
	ID string
	// Job is the job document when it was created (or listed, Resync);
	// Rollout the rollout when it was created or changed (or listed).
	// Both nil with Deleted: the key named by Doc was deleted.
	Job     *Job
	Rollout *Rollout
	// Doc is which key changed: "job" or "rollout".
	Doc     string
	Deleted bool
	// Resync: the change comes from the listing the watch starts with, and
	// after a compaction or a lost connection (a job gone since the last
	// listing comes as Deleted).
	Resync bool
	// Rev is the etcd revision of the change.
	Rev int64
	// Err: the value did not decode (it wraps ErrInvalidJob); Job and
	// Rollout are nil.
	Err error
}

// Doc values of a Change.
const (
	DocJob     = "job"
	DocRollout = "rollout"
)

// watchRetry is the wait before listing again after a failed listing.
const watchRetry = time.Second

// Watch delivers the job documents and rollouts as they are now
// (Resync), then every change of them, until ctx ends; then it closes the
// channel. After a compaction or a lost watch it lists them again. The
// store's kv must be a clientv3.Watcher (a *clientv3.Client is); if it is
// not the channel closes at once.
func (s *Store) Watch(ctx context.Context) <-chan Change {
	ch := make(chan Change)
	w, ok := s.kv.(clientv3.Watcher)
	if !ok {
		close(ch)
		return ch
	}
	go func() {
		defer close(ch)
		s.watch(ctx, w, ch)
	}()
	return ch
}

// watch lists, then watches from the listing's revision, and lists again
// whenever the watch ends before ctx.
func (s *Store) watch(ctx context.Context, w clientv3.Watcher, ch chan<- Change) {
	known := map[string]bool{} // "job/<id>" and "rollout/<id>" as last seen
	for ctx.Err() == nil {
		rev, err := s.resync(ctx, ch, known)
		if err != nil {
			t := time.NewTimer(watchRetry)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
			continue
		}
		s.follow(ctx, w, rev, ch, known)
	}
}

// resync lists both prefixes at one revision, sends each entry and a
// deletion for every entry of known that is gone, and returns the
// revision.
func (s *Store) resync(ctx context.Context, ch chan<- Change, known map[string]bool) (int64, error) {
	resp, err := s.kv.Txn(ctx).Then(
		clientv3.OpGet(s.JobKey(""), clientv3.WithPrefix()),
		clientv3.OpGet(s.RolloutKey(""), clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return 0, fmt.Errorf("jobs: list for watch: %w", err)
	}
	rev := resp.Header.Revision
	seen := map[string]bool{}
	for i := range resp.Responses {
		for _, kv := range resp.Responses[i].GetResponseRange().Kvs {
			c, ok := s.change(kv, false)
			if !ok {
				continue
			}
			c.Resync, c.Rev = true, rev
			seen[c.Doc+"/"+c.ID] = true
			if !send(ctx, ch, c) {
				return 0, ctx.Err()
			}
		}
	}
	for k := range known {
		if seen[k] {
			continue
		}
		doc, id, _ := strings.Cut(k, "/")
		if !send(ctx, ch, Change{ID: id, Doc: doc, Deleted: true, Resync: true, Rev: rev}) {
			return 0, ctx.Err()
		}
	}
	clear(known)
	for k := range seen {
		known[k] = true
	}
	return rev, nil
}

// follow watches both prefixes after rev and sends their changes until
// ctx ends or a watch ends (compacted, canceled, closed).
func (s *Store) follow(ctx context.Context, w clientv3.Watcher, rev int64, ch chan<- Change, known map[string]bool) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	jobs := w.Watch(wctx, s.JobKey(""), clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	rollouts := w.Watch(wctx, s.RolloutKey(""), clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	for {
		var wr clientv3.WatchResponse
		var ok bool
		select {
		case <-ctx.Done():
			return
		case wr, ok = <-jobs:
		case wr, ok = <-rollouts:
		}
		if !ok || wr.Err() != nil || wr.Canceled {
			return // list again
		}
		for _, ev := range wr.Events {
			c, ok := s.change(ev.Kv, ev.Type == clientv3.EventTypeDelete)
			if !ok {
				continue
			}
			c.Rev = ev.Kv.ModRevision
			if c.Deleted {
				delete(known, c.Doc+"/"+c.ID)
			} else {
				known[c.Doc+"/"+c.ID] = true
			}
			if !send(ctx, ch, c) {
				return
			}
		}
	}
}

// change decodes a key and value under the jobs or rollouts prefix; ok is
// false for a key that is neither.
func (s *Store) change(kv *mvccpb.KeyValue, deleted bool) (Change, bool) {
	key := string(kv.Key)
	var c Change
	switch {
	case strings.HasPrefix(key, s.JobKey("")):
		c = Change{ID: strings.TrimPrefix(key, s.JobKey("")), Doc: DocJob}
	case strings.HasPrefix(key, s.RolloutKey("")):
		c = Change{ID: strings.TrimPrefix(key, s.RolloutKey("")), Doc: DocRollout}
	default:
		return Change{}, false
	}
	if c.ID == "" || strings.Contains(c.ID, "/") {
		return Change{}, false
	}
	if c.Deleted = deleted; deleted {
		return c, true
	}
	if c.Doc == DocJob {
		j, err := decodeJob(key, kv.Value)
		if c.Err = err; err == nil {
			c.Job = &j
		}
		return c, true
	}
	r, err := decodeRollout(kv)
	if c.Err = err; err == nil {
		c.Rollout = &r
	}
	return c, true
}

func send(ctx context.Context, ch chan<- Change, c Change) bool {
	select {
	case ch <- c:
		return true
	case <-ctx.Done():
		return false
	}
}
