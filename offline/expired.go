package offline

import (
	"errors"
	"fmt"
	"math"

	"go.etcd.io/bbolt"

	"github.com/edgefence/edgefence/fence"
)

// Expired is an entry ExpireEntries ended.
type Expired struct {
	Device string
	ID     string
	Token  fence.Token
	Seq    uint64
	Kind   string
}

// ExpireEntries is ExpireDue returning the entries it ended, so that the
// caller can record and report each one. Entries for which keep returns
// true stay pending whatever their deadline: the agent keeps a command it
// may already have sent, whose fate only the device can tell. keep may be
// nil.
//
// A pass before the earliest pending deadline the outbox knows of (a floor:
// every append lowers it, every scan sets it from what stays pending)
// reads nothing: the agent's pass each second scans the queue only when
// something may be due, not a backlog of 100,000 entries under the
// outbox's lock every second (BENCHMARKS, "expiry pass").
func (ob *Outbox) ExpireEntries(keep func(device, id string) bool) ([]Expired, error) {
	if ob.opts.ReadOnly {
		return nil, fmt.Errorf("offline: expire: %w", ErrReadOnly)
	}
	if ob.beforeDue() {
		return nil, nil
	}
	ob.mu.Lock()
	defer ob.mu.Unlock()
	// An entry whose verdict waits for its commit (ResolveLater) has
	// ended: never expired. No commit runs while mu is held, so later
	// does not change meanwhile.
	ob.lmu.RLock()
	defer ob.lmu.RUnlock()
	if user := keep; len(ob.later) > 0 {
		keep = func(device, id string) bool {
			return ob.later[id] != nil || (user != nil && user(device, id))
		}
	}
	now := ob.opts.Now().UnixMilli()
	type done struct {
		e    Expired
		size int64
	}
	var ended []done
	var bad []error
	// A read first: most passes find nothing due, and a write
	// transaction would cost a commit (two fdatasyncs) every pass.
	if ob.closed {
		return nil, fmt.Errorf("offline: expire: %w", ErrClosed)
	}
	var none bool
	var next int64 // the floor of what stays pending, from the last scan
	if err := ob.db.View(func(tx *bbolt.Tx) error {
		due, bad, floor := scanDue(tx, now, keep)
		none, next = len(due) == 0 && len(bad) == 0, floor
		return nil
	}); err != nil {
		return nil, fmt.Errorf("offline: expire: %w", err)
	}
	if none {
		ob.due.Store(next) // appends wait for mu: none came since the scan
		return nil, nil
	}
	err := ob.update(func(tx *bbolt.Tx) error {
		ended = ended[:0]
		var due []Expired
		due, bad, next = scanDue(tx, now, keep)
		for _, e := range due {
			_, size, err := terminate(tx, e.ID, "", fence.Expired, nil, now)
			if err != nil {
				bad = append(bad, fmt.Errorf("%s: %w", e.ID, err))
				next = math.MinInt64 // still pending: the next pass tries again
				continue
			}
			ended = append(ended, done{e, size})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("offline: expire: %w", err)
	}
	ob.due.Store(next)
	out := make([]Expired, len(ended))
	ob.cmu.Lock()
	for _, d := range ended {
		ob.add(d.e.Device, -1, -d.size)
	}
	ob.cmu.Unlock()
	ob.ended.Add(int64(len(ended)))
	for i, d := range ended {
		out[i] = d.e
		if ob.opts.Logger != nil {
			ob.opts.Logger.Info("outbox entry expired", "device", d.e.Device, "id", d.e.ID, "token", d.e.Token, "seq", d.e.Seq)
		}
	}
	return out, ob.unreadable(bad)
}

// beforeDue reports whether no pending entry can be due yet: the outbox
// is open and its floor of the pending deadlines has not come.
func (ob *Outbox) beforeDue() bool {
	ob.mu.RLock()
	closed, now := ob.closed, ob.opts.Now().UnixMilli()
	ob.mu.RUnlock()
	return !closed && now < ob.due.Load()
}

// unreadable logs and returns the expiry pass's error for the records it
// could not read; nil if none.
func (ob *Outbox) unreadable(bad []error) error {
	if len(bad) == 0 {
		return nil
	}
	if ob.opts.Logger != nil {
		ob.opts.Logger.Warn("outbox records unreadable", "count", len(bad), "err", errors.Join(bad...).Error())
	}
	return fmt.Errorf("offline: expire: %d entries unreadable: %w", len(bad), errors.Join(bad...))
}

// scanDue returns the pending entries whose deadline is before now and
// that keep does not keep, the records it could not read, and the earliest
// deadline of the others — those that stay pending (math.MinInt64 if a
// record is unreadable, so that every pass reports it; math.MaxInt64 if
// none stays).
func scanDue(tx *bbolt.Tx, now int64, keep func(device, id string) bool) (due []Expired, bad []error, next int64) {
	entries := tx.Bucket(entriesBucket)
	next = math.MaxInt64
	_ = tx.Bucket(queueBucket).ForEach(func(k, id []byte) error {
		r, err := parseRecord(entries.Get(id))
		if err != nil {
			bad = append(bad, fmt.Errorf("%s: %w", id, err))
			next = math.MinInt64
			return nil
		}
		if now < r.deadline {
			next = min(next, r.deadline)
			return nil
		}
		env, err := fence.UnmarshalEnvelope(r.env)
		if err != nil {
			bad = append(bad, fmt.Errorf("%s: %w", id, corruptf("envelope: %v", err)))
			next = math.MinInt64
			return nil
		}
		if keep != nil && keep(env.Device, string(id)) {
			next = min(next, r.deadline) // kept past its deadline: the next pass looks again
			return nil
		}
		due = append(due, Expired{Device: env.Device, ID: string(id), Token: env.Token, Seq: env.Seq, Kind: env.Kind})
		return nil
	})
	return due, bad, next
}

// lowerDue lowers the floor of the pending deadlines to d.
func (ob *Outbox) lowerDue(d int64) {
	for {
		cur := ob.due.Load()
		if d >= cur || ob.due.CompareAndSwap(cur, d) {
			return
		}
	}
}
