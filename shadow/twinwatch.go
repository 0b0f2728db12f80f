package shadow

import (
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Sides of a twin, as TwinEvent.Side names them.
const (
	SideDesired  = "desired"
	SideReported = "reported"
)

// TwinEvent is a change of either side of one device's twin, with the
// whole twin after it.
type TwinEvent struct {
	// Kind is EventPut or EventDelete for a change of Side, EventSync for
	// a full read of both sides (Side empty).
	Kind EventKind
	// Side is SideDesired or SideReported; empty for EventSync.
	Side string
	// Doc is the twin after the change, its delta recomputed; Doc.Revision
	// is the revision of the change (of the read, for EventSync).
	Doc *Document
	// Prev is the state of Side before the change (EventPut, EventDelete).
	Prev State
	// Err is set when a stored value could not be decoded (written by
	// something other than a Store); that side is then empty in Doc.
	Err error
}

// WatchTwin calls fn for every change of dev's desired or reported state,
// in revision order, with the whole twin after it. It starts from from —
// a Document read by Get, watched from its Revision+1 so that nothing
// after that read is missed — or, if from is nil, with a full read of
// both sides (EventSync). If the revisions it needs were compacted away it
// reads both sides again (EventSync) and continues from that read; a watch
// broken by a lost leader or connection is re-opened from the last
// revision seen. WatchTwin blocks until ctx ends (returning ctx's error)
// or fn returns an error (returning it). It starts no goroutines that
// outlive it.
//
// Store.Watch follows desired states only (of one device or all); this
// follows both sides of one device, for a live view of a twin.
func (s *Store) WatchTwin(ctx context.Context, dev string, from *Document, fn func(TwinEvent) error) error {
	if err := s.checkDevice(dev); err != nil {
		return err
	}
	var doc *Document
	var next int64
	if from != nil {
		if from.Device != dev || from.Revision <= 0 {
			return invalidf("watch %s from a document of %q at revision %d", dev, from.Device, from.Revision)
		}
		doc = &Document{Device: dev, Desired: cloneState(from.Desired), Reported: cloneState(from.Reported), Revision: from.Revision}
		next = from.Revision + 1
	}
	for {
		if next == 0 {
			ev, err := s.readTwin(ctx, dev)
			if err != nil {
				return err
			}
			doc = &Document{Device: dev, Desired: cloneState(ev.Doc.Desired), Reported: cloneState(ev.Doc.Reported), Revision: ev.Doc.Revision}
			if err := fn(ev); err != nil {
				return err
			}
			next = doc.Revision + 1
		}
		var err error
		next, err = s.watchTwinFrom(ctx, dev, doc, next, fn)
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

// readTwin reads both sides of dev at one revision as an EventSync; a
// side that does not decode is empty, and the event carries its error.
func (s *Store) readTwin(ctx context.Context, dev string) (TwinEvent, error) {
	dk, rk := s.DesiredKey(dev), s.ReportedKey(dev)
	resp, err := s.kv.Txn(ctx).Then(clientv3.OpGet(dk), clientv3.OpGet(rk)).Commit()
	if err != nil {
		return TwinEvent{}, fmt.Errorf("shadow: watch twin %s: full read: %w", dev, err)
	}
	des, derr := s.decodeResp(dk, txnGet(resp, 0))
	if derr != nil {
		des = emptyState()
	}
	rep, rerr := s.decodeResp(rk, txnGet(resp, 1))
	if rerr != nil {
		rep = emptyState()
	}
	doc := NewDocument(dev, des, rep)
	doc.Revision = resp.Header.Revision
	return TwinEvent{Kind: EventSync, Doc: doc, Err: errors.Join(derr, rerr)}, nil
}

// watchTwinFrom watches dev's twin keys from rev, applying each change to
// doc (which it owns) and calling fn with a copy; it returns the next
// revision to watch from.
func (s *Store) watchTwinFrom(ctx context.Context, dev string, doc *Document, rev int64, fn func(TwinEvent) error) (int64, error) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	dk, rk := s.DesiredKey(dev), s.ReportedKey(dev)
	// Both keys end the device's "twin/" prefix; nothing else lives there.
	wch := s.w.Watch(wctx, s.devPrefix(dev)+"/twin/", clientv3.WithPrefix(), clientv3.WithRev(rev))
	for resp := range wch {
		if resp.CompactRevision != 0 {
			return rev, errCompacted
		}
		if err := resp.Err(); err != nil {
			return rev, &watchErr{err}
		}
		for _, e := range resp.Events {
			key := string(e.Kv.Key)
			side, st := SideDesired, &doc.Desired
			switch key {
			case dk:
			case rk:
				side, st = SideReported, &doc.Reported
			default:
				continue
			}
			ev := TwinEvent{Kind: EventPut, Side: side, Prev: cloneState(*st)}
			if e.Type == clientv3.EventTypeDelete {
				ev.Kind, *st = EventDelete, emptyState()
			} else if *st, ev.Err = s.decodeKV(key, e.Kv.Value, e.Kv.ModRevision, true); ev.Err != nil {
				*st = emptyState()
			}
			doc.Revision = e.Kv.ModRevision
			ev.Doc = NewDocument(dev, cloneState(doc.Desired), cloneState(doc.Reported))
			ev.Doc.Revision = doc.Revision
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
