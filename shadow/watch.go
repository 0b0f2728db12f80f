package shadow

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// EventKind says what happened to a desired state.
type EventKind int

const (
	// EventPut: the desired state was written.
	EventPut EventKind = iota + 1
	// EventDelete: the desired key was deleted.
	EventDelete
	// EventSync: the desired state as read by a full read — at the start
	// of a watch from revision 0, or after compaction made the missed
	// changes unavailable. Treat it like a put of the whole state.
	EventSync
)

func (k EventKind) String() string {
	switch k {
	case EventPut:
		return "put"
	case EventDelete:
		return "delete"
	case EventSync:
		return "sync"
	}
	return fmt.Sprintf("EventKind(%d)", int(k))
}

// Event is a change of one device's desired state.
type Event struct {
	Kind   EventKind
	Device string
	// Desired is the new state (empty for EventDelete); its Version is the
	// key's ModRevision.
	Desired State
	// Revision is the etcd revision the watcher has seen up to: resume
	// with fromRev = Revision+1 and nothing is missed.
	Revision int64
	// Err is set when the stored value could not be decoded (written by
	// something other than a Store); Desired is then empty.
	Err error
}

// watchRetry is the pause before re-opening a watch that ended with an
// error other than compaction.
const watchRetry = 200 * time.Millisecond

// Watch calls fn for every change of desired state of dev (or of every
// device, if dev is ""), in revision order, starting at etcd revision
// fromRev; with fromRev 0 it first reads the current desired states
// (EventSync) and watches from there. If the revisions wanted were
// compacted away, it falls back to a full read — EventSync for every
// device that has a desired state, EventDelete for one seen before that no
// longer has — and continues from that read's revision. A watch broken by
// a lost leader or connection is re-opened from the last revision seen.
// Watch blocks until ctx ends (returning ctx's error) or fn returns an
// error (returning it). It starts no goroutines that outlive it.
func (s *Store) Watch(ctx context.Context, dev string, fromRev int64, fn func(Event) error) error {
	key, opts := s.cfg.Prefix+"/devices/", []clientv3.OpOption{clientv3.WithPrefix()}
	if dev != "" {
		if err := s.checkDevice(dev); err != nil {
			return err
		}
		key, opts = s.DesiredKey(dev), nil
	}
	if fromRev < 0 {
		return invalidf("revision %d", fromRev)
	}
	seen := make(map[string]bool) // devices with a desired state, as far as we know
	next := fromRev
	for {
		if next == 0 {
			rev, err := s.resync(ctx, key, opts, seen, fn)
			if err != nil {
				return err
			}
			next = rev + 1
		}
		var err error
		next, err = s.watchFrom(ctx, key, opts, next, seen, fn)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		resync, err := afterWatch(ctx, err)
		if err != nil {
			return err
		}
		if resync {
			next = 0
		}
	}
}

// afterWatch decides what a watch loop does when a watch ended with err:
// resync (the revisions it needs were compacted away: read everything
// again), or retry after watchRetry (the watch broke; it resumes from the
// last revision seen), or return err (ctx ended, or the callback's error).
func afterWatch(ctx context.Context, err error) (resync bool, _ error) {
	var werr *watchErr
	switch {
	case errors.Is(err, errCompacted):
		return true, nil
	case errors.As(err, &werr):
		t := time.NewTimer(watchRetry)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-t.C:
			return false, nil
		}
	default:
		return false, err // fn's error
	}
}

// errCompacted means the revisions a watch needs were compacted away.
var errCompacted = errors.New("shadow: watch: revision compacted")

// watchErr marks an etcd watch failure (as opposed to fn's error).
type watchErr struct{ err error }

func (e *watchErr) Error() string { return "shadow: watch: " + e.err.Error() }
func (e *watchErr) Unwrap() error { return e.err }

// resync reads every desired key under key and reports it as EventSync,
// and EventDelete for devices in seen that are gone.
func (s *Store) resync(ctx context.Context, key string, opts []clientv3.OpOption, seen map[string]bool, fn func(Event) error) (int64, error) {
	r, err := s.kv.Get(ctx, key, opts...)
	if err != nil {
		return 0, fmt.Errorf("shadow: watch: full read: %w", err)
	}
	rev := r.Header.Revision
	now := make(map[string]bool)
	for _, kv := range r.Kvs {
		dev, ok := s.desiredDevice(string(kv.Key))
		if !ok {
			continue
		}
		now[dev] = true
		ev := Event{Kind: EventSync, Device: dev, Revision: rev}
		ev.Desired, ev.Err = s.decodeKV(string(kv.Key), kv.Value, kv.ModRevision, true)
		if err := fn(ev); err != nil {
			return 0, err
		}
	}
	for dev := range seen {
		if !now[dev] {
			if err := fn(Event{Kind: EventDelete, Device: dev, Desired: emptyState(), Revision: rev}); err != nil {
				return 0, err
			}
		}
	}
	clear(seen)
	for dev := range now {
		seen[dev] = true
	}
	return rev, nil
}

// watchFrom watches from rev until an error; it returns the next revision
// to watch from.
func (s *Store) watchFrom(ctx context.Context, key string, opts []clientv3.OpOption, rev int64, seen map[string]bool, fn func(Event) error) (int64, error) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := s.w.Watch(wctx, key, append(opts, clientv3.WithRev(rev))...)
	for resp := range wch {
		if resp.CompactRevision != 0 { // resp.Err() is ErrCompacted
			return rev, errCompacted
		}
		if err := resp.Err(); err != nil {
			return rev, &watchErr{err}
		}
		for _, e := range resp.Events {
			dev, ok := s.desiredDevice(string(e.Kv.Key))
			if !ok {
				continue
			}
			ev := Event{Device: dev, Revision: e.Kv.ModRevision}
			if e.Type == clientv3.EventTypeDelete {
				ev.Kind, ev.Desired = EventDelete, emptyState()
				delete(seen, dev)
			} else {
				ev.Kind = EventPut
				ev.Desired, ev.Err = s.decodeKV(string(e.Kv.Key), e.Kv.Value, e.Kv.ModRevision, true)
				seen[dev] = true
			}
			if err := fn(ev); err != nil {
				return rev, err
			}
			rev = e.Kv.ModRevision + 1
		}
	}
	if err := ctx.Err(); err != nil {
		return rev, err
	}
	return rev, &watchErr{errors.New("watch channel closed")}
}

// desiredDevice returns the device whose desired key k is.
func (s *Store) desiredDevice(k string) (string, bool) {
	rest, ok := strings.CutPrefix(k, s.cfg.Prefix+"/devices/")
	if !ok {
		return "", false
	}
	dev, ok := strings.CutSuffix(rest, "/twin/desired")
	if !ok || strings.Contains(dev, "/") {
		return "", false
	}
	return dev, true
}

func emptyState() State {
	return State{Fields: map[string]any{}, Meta: map[string]FieldMeta{}}
}
