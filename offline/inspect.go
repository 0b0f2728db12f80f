package offline

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.etcd.io/bbolt"

	"github.com/edgefence/edgefence/fence"
)

// Record is an entry as an operator sees it (edgefence outbox list|show).
type Record struct {
	Device   string
	ID       string
	Token    fence.Token
	Seq      uint64
	Kind     string
	Pos      uint64        // position in the device's queue
	Created  time.Time     // when the command was created
	Deadline time.Time     // when it expires if still pending
	Age      time.Duration // Options.Now() - Created, at the read
	State    fence.Verdict // 0 while pending, else the terminal state
	Resolved time.Time     // when it became terminal (zero while pending)
	Ack      *fence.Ack    // the fence point's ack; nil while pending and for expired
}

// Pending reports whether the entry has no terminal state yet.
func (r *Record) Pending() bool { return r.State == 0 }

// StateString is "pending" or the verdict's name.
func (r *Record) StateString() string {
	if r.State == 0 {
		return "pending"
	}
	return r.State.String()
}

// Reason is the ack's reason, if any.
func (r *Record) Reason() string {
	if r.Ack == nil {
		return ""
	}
	return r.Ack.Reason
}

func (ob *Outbox) toRecord(id []byte, v []byte, now time.Time) (Record, error) {
	r, err := parseRecord(v)
	if err != nil {
		return Record{}, fmt.Errorf("%w (id %s)", err, id)
	}
	env, err := fence.UnmarshalEnvelope(r.env)
	if err != nil || env.ID != string(id) {
		return Record{}, corruptf("envelope of %s: %v", id, err)
	}
	rec := Record{Device: env.Device, ID: env.ID, Token: env.Token, Seq: env.Seq, Kind: env.Kind, Pos: r.pos,
		Created: time.UnixMilli(r.created), Deadline: time.UnixMilli(r.deadline), State: r.state}
	rec.Age = now.Sub(rec.Created)
	if r.state != 0 {
		rec.Resolved = time.UnixMilli(r.resolved)
	}
	if len(r.ack) > 0 {
		if rec.Ack, err = fence.UnmarshalAck(r.ack); err != nil {
			return Record{}, corruptf("ack of %s: %v", id, err)
		}
	}
	return rec, nil
}

// Get returns the record of command id; an error wrapping ErrNotFound if
// there is none, ErrCorrupt if it cannot be read.
func (ob *Outbox) Get(id string) (Record, error) {
	now := ob.opts.Now()
	var rec Record
	err := ob.view(func(tx *bbolt.Tx) error {
		v := tx.Bucket(entriesBucket).Get([]byte(id))
		if v == nil {
			return ErrNotFound
		}
		var err error
		rec, err = ob.toRecord([]byte(id), v, now)
		return err
	})
	if err != nil {
		return Record{}, fmt.Errorf("offline: get %s: %w", id, err)
	}
	return rec, nil
}

// Filter selects records for List. The zero Filter selects all.
type Filter struct {
	Device      string // only this device, if set
	PendingOnly bool   // only entries without a terminal state
}

// List returns the selected records ordered by device and queue position.
// Unreadable records are left out and reported in the error (wrapping
// ErrCorrupt), together with the readable ones.
func (ob *Outbox) List(f Filter) ([]Record, error) {
	now := ob.opts.Now()
	var recs []Record
	var bad []error
	err := ob.view(func(tx *bbolt.Tx) error {
		recs, bad = recs[:0], bad[:0]
		entries := tx.Bucket(entriesBucket)
		keep := func(id, v []byte) {
			rec, err := ob.toRecord(id, v, now)
			switch {
			case err != nil:
				bad = append(bad, err)
			case f.Device != "" && rec.Device != f.Device, f.PendingOnly && !rec.Pending():
			default:
				recs = append(recs, rec)
			}
		}
		if f.PendingOnly { // walk the queue: pending entries only
			c := tx.Bucket(queueBucket).Cursor()
			prefix := []byte(nil)
			if f.Device != "" {
				prefix = queuePrefix(f.Device)
			}
			for k, id := c.Seek(prefix); k != nil && hasPrefix(k, prefix); k, id = c.Next() {
				v := entries.Get(id)
				if v == nil {
					bad = append(bad, corruptf("queue names %s, which has no record", id))
					continue
				}
				keep(id, v)
			}
			return nil
		}
		return entries.ForEach(func(id, v []byte) error { keep(id, v); return nil })
	})
	if err != nil {
		return nil, fmt.Errorf("offline: list: %w", err)
	}
	slices.SortFunc(recs, func(a, b Record) int {
		return cmp.Or(cmp.Compare(a.Device, b.Device), cmp.Compare(a.Pos, b.Pos))
	})
	if len(bad) > 0 {
		return recs, fmt.Errorf("offline: list: %d unreadable records: %w", len(bad), errors.Join(bad...))
	}
	return recs, nil
}

func hasPrefix(k, prefix []byte) bool {
	return len(k) >= len(prefix) && string(k[:len(prefix)]) == string(prefix)
}

// Devices returns the devices with pending entries, in order.
func (ob *Outbox) Devices() []string {
	ob.mu.RLock()
	defer ob.mu.RUnlock()
	devs := make([]string, 0, len(ob.devs))
	for d := range ob.devs {
		devs = append(devs, d)
	}
	slices.Sort(devs)
	return devs
}

// Pending returns the number of pending entries of device, and their
// envelope bytes.
func (ob *Outbox) Pending(device string) (n int, bytes int64) {
	ob.mu.RLock()
	defer ob.mu.RUnlock()
	u := ob.devs[device]
	return u.n, u.bytes
}

// Stats are the outbox's metrics.
type Stats struct {
	Pending      int                   // entries without a terminal state
	PendingBytes int64                 // their envelope bytes
	Terminal     map[fence.Verdict]int // retained terminal entries per state
	Corrupt      int                   // unreadable records
	Refused      uint64                // Appends refused with ErrFull since Open
}

// Stats counts the entries per state. It reads every retained record, so
// its cost grows with the pending entries and the retention.
func (ob *Outbox) Stats() (Stats, error) {
	s := Stats{Terminal: make(map[fence.Verdict]int)}
	err := ob.view(func(tx *bbolt.Tx) error {
		s.Pending, s.PendingBytes, s.Refused = ob.total.n, ob.total.bytes, ob.refused
		return tx.Bucket(entriesBucket).ForEach(func(_, v []byte) error {
			r, err := parseRecord(v)
			switch {
			case err != nil:
				s.Corrupt++
			case r.state != 0:
				s.Terminal[r.state]++
			}
			return nil
		})
	})
	if err != nil {
		return Stats{}, fmt.Errorf("offline: stats: %w", err)
	}
	return s, nil
}
