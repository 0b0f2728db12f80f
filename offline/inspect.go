package offline

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
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
	// BodyBytes is the size of the envelope's body (encoded CBOR), 0 if
	// it has none. A terminal entry's body larger than KeepBodyMax is not
	// kept: BodyDropped is then true and BodySHA256 is the dropped body's
	// SHA-256 (nil otherwise).
	BodyBytes   int
	BodyDropped bool
	BodySHA256  []byte
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

// toRecord reads a record as an operator sees it; ob.lmu is read-locked
// (view).
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
	rec.BodyBytes = len(env.Body)
	if r.dropped != 0 {
		if len(env.Body) != 0 {
			return Record{}, corruptf("envelope of %s: a body, and a dropped one", id)
		}
		rec.BodyBytes, rec.BodyDropped, rec.BodySHA256 = int(r.dropped), true, append([]byte(nil), r.sum[:]...)
	}
	if r.state != 0 {
		rec.Resolved = time.UnixMilli(r.resolved)
	}
	if len(r.ack) > 0 {
		if rec.Ack, err = fence.UnmarshalAck(r.ack); err != nil {
			return Record{}, corruptf("ack of %s: %v", id, err)
		}
	}
	ob.overlay(&rec) // ended, its record waiting for a commit
	return rec, nil
}

// Get returns the record of command id; an error wrapping ErrNotFound if
// there is none, ErrCorrupt if it cannot be read.
func (ob *Outbox) Get(id string) (Record, error) {
	now := ob.opts.Now()
	var rec Record
	err := ob.view(func(tx *bbolt.Tx) error {
		var v []byte
		if b := tx.Bucket(entriesBucket); b != nil {
			v = b.Get([]byte(id))
		}
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

// Find returns the record whose command id is id or, failing that, the one
// record whose id starts with id (the short ids `edgefence outbox list`
// prints). No match is an error wrapping ErrNotFound, several
// ErrAmbiguous.
func (ob *Outbox) Find(id string) (Record, error) {
	rec, err := ob.Get(id)
	if !errors.Is(err, ErrNotFound) || id == "" {
		return rec, err
	}
	now := ob.opts.Now()
	var ids []string
	err = ob.view(func(tx *bbolt.Tx) error {
		ids = ids[:0]
		b := tx.Bucket(entriesBucket)
		if b == nil {
			return nil
		}
		c := b.Cursor()
		for k, v := c.Seek([]byte(id)); k != nil && hasPrefix(k, []byte(id)); k, v = c.Next() {
			ids = append(ids, string(k))
			if len(ids) == 1 {
				if rec, err = ob.toRecord(k, v, now); err != nil {
					return err
				}
			}
			if len(ids) == 3 {
				break
			}
		}
		return nil
	})
	switch {
	case err != nil:
		return Record{}, fmt.Errorf("offline: find %s: %w", id, err)
	case len(ids) == 0:
		return Record{}, fmt.Errorf("offline: find %s: %w", id, ErrNotFound)
	case len(ids) > 1:
		more := ""
		if len(ids) > 2 {
			more = ", ..."
		}
		return Record{}, fmt.Errorf("offline: find %s: %w (%s, %s%s)", id, ErrAmbiguous, ids[0], ids[1], more)
	}
	return rec, nil
}

// Filter selects records for List. The zero Filter selects all.
type Filter struct {
	Device       string // only this device, if set
	PendingOnly  bool   // only entries without a terminal state
	TerminalOnly bool   // only entries with their terminal state
	// Limit, if positive, keeps only the first Limit records in List's
	// order.
	Limit int
}

// List returns the selected records ordered by device and queue position.
// Unreadable records are left out and reported in the error (wrapping
// ErrCorrupt), together with the readable ones. A Filter with both
// PendingOnly and TerminalOnly selects nothing.
func (ob *Outbox) List(f Filter) ([]Record, error) {
	now := ob.opts.Now()
	var recs []Record
	var bad []error
	err := ob.view(func(tx *bbolt.Tx) error {
		recs, bad = recs[:0], bad[:0]
		entries, queue := tx.Bucket(entriesBucket), tx.Bucket(queueBucket)
		if entries == nil || queue == nil || (f.PendingOnly && f.TerminalOnly) {
			return nil // read-only and never initialized: empty
		}
		keep := func(id, v []byte) {
			rec, err := ob.toRecord(id, v, now)
			switch {
			case err != nil:
				bad = append(bad, err)
			case f.Device != "" && rec.Device != f.Device, f.PendingOnly && !rec.Pending(), f.TerminalOnly && rec.Pending():
			default:
				recs = append(recs, rec)
			}
		}
		if f.PendingOnly { // walk the queue: pending entries only, in List's order
			c := queue.Cursor()
			prefix := []byte(nil)
			if f.Device != "" {
				prefix = queuePrefix(f.Device)
			}
			for k, id := c.Seek(prefix); k != nil && hasPrefix(k, prefix); k, id = c.Next() {
				if f.Limit > 0 && len(recs) >= f.Limit {
					break
				}
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
	if f.Limit > 0 && len(recs) > f.Limit {
		recs = recs[:f.Limit]
	}
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
	ob.cmu.Lock()
	defer ob.cmu.Unlock()
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
	ob.cmu.Lock()
	defer ob.cmu.Unlock()
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
		ob.cmu.Lock()
		s.Pending, s.PendingBytes, s.Refused = ob.total.n, ob.total.bytes, ob.refused
		ob.cmu.Unlock()
		entries := tx.Bucket(entriesBucket)
		if entries == nil {
			return nil // read-only and never initialized: empty
		}
		for _, l := range ob.later { // pending in the file, ended
			s.Terminal[l.ack.Verdict]++
		}
		return entries.ForEach(func(_, v []byte) error {
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

// DeviceSummary is what one device's pending entries take.
type DeviceSummary struct {
	Device  string    `json:"device"`
	Pending int       `json:"pending"` // entries without a terminal state
	Bytes   int64     `json:"bytes"`   // their envelope bytes
	Oldest  time.Time `json:"oldest"`  // creation time of the head of the queue (zero if unreadable)
	// OldestAge is Options.Now() - Oldest at the read; in JSON, whole
	// milliseconds.
	OldestAge time.Duration `json:"-"`
}

// Summary is the pending part of the outbox, per device and in all, as
// `edgefence outbox list` prints it under the table.
type Summary struct {
	Devices   []DeviceSummary `json:"devices"` // devices with pending entries, in order
	Pending   int             `json:"pending"`
	Bytes     int64           `json:"bytes"`
	Oldest    time.Time       `json:"oldest"`    // the oldest of the devices' Oldest; zero if none
	OldestAge time.Duration   `json:"-"`         // Options.Now() - Oldest; in JSON, whole milliseconds
	Refused   uint64          `json:"refused"`   // Appends refused with ErrFull since Open
	Waiting   int             `json:"waiting"`   // ended by a verdict whose record waits for the next commit (ResolveLater); not in Pending
	ReadOnly  bool            `json:"read_only"` // read from the file, not from the agent holding it
}

// Summary returns the pending entries' count and bytes per device and in
// all, and the age of the oldest pending entry (the head of a device's
// queue). If device is set, only that device counts. Its cost grows with
// the number of devices, not of entries.
func (ob *Outbox) Summary(device string) (Summary, error) {
	now := ob.opts.Now()
	var s Summary
	err := ob.view(func(tx *bbolt.Tx) error {
		ob.cmu.Lock()
		s = Summary{Refused: ob.refused, ReadOnly: ob.opts.ReadOnly}
		for _, l := range ob.later { // view holds lmu
			if device == "" || l.dev == device {
				s.Waiting++
			}
		}
		counts := make(map[string]usage, len(ob.devs))
		for d, u := range ob.devs {
			if device == "" || d == device {
				counts[d] = u
			}
		}
		ob.cmu.Unlock()
		devs := slices.Sorted(maps.Keys(counts))
		queue := tx.Bucket(queueBucket)
		for _, d := range devs {
			u := counts[d]
			ds := DeviceSummary{Device: d, Pending: u.n, Bytes: u.bytes}
			if queue != nil {
				prefix := queuePrefix(d)
				c := queue.Cursor()
				k, id := c.Seek(prefix)
				for k != nil && ob.waitingVerdict(id) != nil { // ended
					k, id = c.Next()
				}
				if k != nil && hasPrefix(k, prefix) {
					if r, err := getRecord(tx, id); err == nil {
						ds.Oldest = time.UnixMilli(r.created)
						ds.OldestAge = now.Sub(ds.Oldest)
					}
				}
			}
			s.Devices = append(s.Devices, ds)
			s.Pending += ds.Pending
			s.Bytes += ds.Bytes
			if !ds.Oldest.IsZero() && (s.Oldest.IsZero() || ds.Oldest.Before(s.Oldest)) {
				s.Oldest, s.OldestAge = ds.Oldest, ds.OldestAge
			}
		}
		return nil
	})
	if err != nil {
		return Summary{}, fmt.Errorf("offline: summary: %w", err)
	}
	if s.Devices == nil {
		s.Devices = []DeviceSummary{}
	}
	return s, nil
}
