package fence

import (
	"bytes"
	"context"
	"fmt"

	"go.etcd.io/bbolt"
)

// resetBucket holds one ResetRecord per device id: the last authorised
// reset of its mark (Table.Reset).
var resetBucket = []byte("fence.resets")

// Reset sets device's mark to `to`, by the operator's authority: the
// caller has verified the operator's signed reset statement (fence/auth),
// which names the device, the mark, a reset counter and a reset id. Unlike
// Admit it may lower the mark — that is its point: it brings back a device
// whose mark a forgery raised, or that etcd's token regression left above
// every token etcd grants.
//
// counter must be above the counter of the device's last reset (a replay
// is refused with an error wrapping ErrInvalid and ErrReplayedReset, the
// mark unchanged). The new mark, the reset's record and the removal of the
// device's unapplied commands above the new mark (commands of the regime
// the reset undoes: they are not delivered after a restart) are written in
// one transaction, committed with fsync before Reset returns. Admits wait
// while it runs. It returns the device's mark after the call.
func (t *Table) Reset(ctx context.Context, device string, to Mark, counter uint64, id string) (Mark, error) {
	if err := ValidateDeviceID(device); err != nil {
		return Mark{}, err
	}
	if to.Token == 0 || to.Seq == 0 || counter == 0 {
		return Mark{}, invalidf("reset of %s to %v, counter %d: token, seq and counter must be at least 1", device, to, counter)
	}
	if err := ctx.Err(); err != nil {
		return Mark{}, err
	}
	// Exclusive: no admit is deciding, and none raises the cache after
	// this reset lowered it.
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.closed:
		return Mark{}, ErrTableClosed
	case t.opts.ReadOnly:
		return Mark{}, ErrTableReadOnly
	}
	rec, err := MarkRecord{Mark: to, At: t.opts.Now(), Holder: "operator reset", ID: id}.MarshalBinary()
	if err != nil {
		return Mark{}, err
	}
	rr, err := ResetRecord{Counter: counter, ID: id, At: t.opts.Now()}.MarshalBinary()
	if err != nil {
		return Mark{}, err
	}
	var refused error
	cur := Mark{}
	err = t.update(func(tx *bbolt.Tx) error {
		b := tx.Bucket(tableBucket)
		m, err := getMark(b, []byte(device))
		if err != nil {
			return err
		}
		cur = m
		rb, err := tx.CreateBucketIfNotExists(resetBucket)
		if err != nil {
			return err
		}
		var last ResetRecord
		if v := rb.Get([]byte(device)); v != nil {
			if err := last.UnmarshalBinary(v); err != nil {
				return fmt.Errorf("%w: %w", ErrTableCorrupt, err)
			}
		}
		if refused = CheckReset(last, counter); refused != nil {
			return nil // nothing written
		}
		if err := b.Put([]byte(device), rec); err != nil {
			return err
		}
		if err := rb.Put([]byte(device), rr); err != nil {
			return err
		}
		return dropUnappliedAbove(tx, device, to)
	})
	switch {
	case err != nil:
		return Mark{}, t.storageErr(device, err)
	case refused != nil:
		return cur, refused
	}
	t.cacheMu.Lock()
	t.cache[device] = to
	t.cacheMu.Unlock()
	return to, nil
}

// dropUnappliedAbove removes device's unapplied commands above m.
func dropUnappliedAbove(tx *bbolt.Tx, device string, m Mark) error {
	p := tx.Bucket(pendingBucket)
	if p == nil {
		return fmt.Errorf("%w: bucket %s missing", ErrTableCorrupt, pendingBucket)
	}
	prefix := append([]byte(device), 0)
	above := pendingKey(device, m)
	var drop [][]byte
	c := p.Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		if bytes.Compare(k, above) > 0 {
			drop = append(drop, bytes.Clone(k))
		}
	}
	for _, k := range drop {
		if err := p.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

// LastReset returns the record of device's last authorised reset (the
// zero record if it has none).
func (t *Table) LastReset(device string) (ResetRecord, error) {
	var r ResetRecord
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.closed {
		return r, ErrTableClosed
	}
	err := t.db.View(func(tx *bbolt.Tx) error {
		if rb := tx.Bucket(resetBucket); rb != nil {
			if v := rb.Get([]byte(device)); v != nil {
				return r.UnmarshalBinary(v)
			}
		}
		return nil
	})
	return r, err
}
