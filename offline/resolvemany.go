package offline

import (
	"errors"
	"fmt"

	"go.etcd.io/bbolt"

	"github.com/edgefence/edgefence/fence"
)

// ResolveMany is Resolve for several acks in one durable commit: a group
// commit for acks that arrive together (one fsync instead of len(acks)).
// Each ack resolves the entry its ID names. errs[i] is the outcome of
// acks[i]: nil, or an error wrapping what Resolve would have returned
// (ErrNotFound, ErrResolved — also for an id a previous ack of the same
// call resolved —, ErrCorrupt, fence.ErrInvalid); those acks change
// nothing, the others are recorded. A non-nil err means the commit itself
// failed and none of them was recorded.
func (ob *Outbox) ResolveMany(acks []*fence.Ack) (errs []error, err error) {
	if ob.opts.ReadOnly {
		return nil, fmt.Errorf("offline: resolve: %w", ErrReadOnly)
	}
	errs = make([]error, len(acks))
	raws := make([][]byte, len(acks))
	for i, a := range acks {
		if a == nil || a.ID == "" || a.Verdict == fence.Expired {
			errs[i] = fmt.Errorf("offline: resolve: %w: ack does not resolve a command", fence.ErrInvalid)
			continue
		}
		if raws[i], err = fence.MarshalAck(a); err != nil {
			errs[i] = fmt.Errorf("offline: resolve %s: %w", a.ID, err)
		}
	}
	ob.mu.Lock()
	defer ob.mu.Unlock()
	type done struct {
		dev  string
		size int64
	}
	var ended []done
	now := ob.opts.Now().UnixMilli()
	err = ob.update(func(tx *bbolt.Tx) error {
		ended = ended[:0]
		for i, a := range acks {
			if raws[i] == nil {
				continue
			}
			errs[i] = nil
			dev, size, err := terminate(tx, a.ID, a.Device, a.Verdict, raws[i], now)
			switch {
			case err == nil:
				ended = append(ended, done{dev, size})
			case errors.Is(err, ErrNotFound), errors.Is(err, ErrResolved), errors.Is(err, ErrCorrupt), errors.Is(err, fence.ErrInvalid):
				// Refused before terminate changed anything.
				errs[i] = fmt.Errorf("offline: resolve %s: %w", a.ID, err)
			default:
				return fmt.Errorf("%s: %w", a.ID, err) // a write failed: roll everything back
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("offline: resolve: %w", err)
	}
	for _, d := range ended {
		ob.add(d.dev, -1, -d.size)
	}
	return errs, nil
}
