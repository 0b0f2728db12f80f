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

// Reset sets device's mark to `to` in a new epoch, by the operator's
// authority: the caller has verified the operator's signed reset statement
// (fence/auth), which names the device, the mark, a reset counter, an epoch
// and a reset id (r: the counter, epoch and id; the table stamps the
// time). Unlike an admit it may lower the mark — that is its point: it
// brings back a device whose mark a forgery raised, or that etcd's token
// regression left above every token etcd grants — and it closes the past:
// from then on the device is at r.Epoch, and a command of an earlier epoch
// is refused whatever its token (AdmitEpoch).
//
// r.Counter must be above the counter of the device's last reset, and
// r.Epoch above the device's epoch (the highest of floor — the fleet epoch
// the caller's trust holds, for a device whose commands must be signed —,
// its stored mark's and its last reset's): otherwise the reset is refused
// with an error wrapping ErrInvalid and ErrReplayedReset, nothing written.
// The new mark with its epoch, the reset's record and the removal of the
// device's unapplied commands (all of an earlier epoch: the closed past is
// not delivered after a restart) are written in one transaction, committed
// with fsync before Reset returns. Admits wait while it runs. It returns
// the device's state after the call.
func (t *Table) Reset(ctx context.Context, device string, to Mark, r ResetRecord, floor uint64) (State, error) {
	if err := ValidateDeviceID(device); err != nil {
		return State{}, err
	}
	if to.Token == 0 || to.Seq == 0 || r.Counter == 0 || r.Epoch == 0 {
		return State{}, invalidf("reset of %s to %v, counter %d, epoch %d: token, seq, counter and epoch must be at least 1", device, to, r.Counter, r.Epoch)
	}
	if err := ctx.Err(); err != nil {
		return State{}, err
	}
	// Exclusive: no admit is deciding, and none raises the cache after
	// this reset lowered it.
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.closed:
		return State{}, ErrTableClosed
	case t.opts.ReadOnly:
		return State{}, ErrTableReadOnly
	}
	next := State{Epoch: r.Epoch, Mark: to}
	rec, err := MarkRecord{Epoch: r.Epoch, Mark: to, At: t.opts.Now(), Holder: "operator reset", ID: r.ID}.MarshalBinary()
	if err != nil {
		return State{}, err
	}
	r.At = t.opts.Now()
	rr, err := r.MarshalBinary()
	if err != nil {
		return State{}, err
	}
	var refused error
	var cur State
	err = t.update(func(tx *bbolt.Tx) error {
		b := tx.Bucket(tableBucket)
		m, err := getMark(b, []byte(device))
		if err != nil {
			return err
		}
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
		cur = m.At(max(floor, last.Epoch))
		if refused = CheckReset(last, cur.Epoch, r.Counter, r.Epoch); refused != nil {
			return nil // nothing written
		}
		if err := b.Put([]byte(device), rec); err != nil {
			return err
		}
		if err := rb.Put([]byte(device), rr); err != nil {
			return err
		}
		return dropUnapplied(tx, device)
	})
	switch {
	case err != nil:
		return State{}, t.storageErr(device, err)
	case refused != nil:
		return cur, refused
	}
	t.cacheMu.Lock()
	t.cache[device] = next
	t.cacheMu.Unlock()
	return next, nil
}

// dropUnapplied removes device's unapplied commands.
func dropUnapplied(tx *bbolt.Tx, device string) error {
	p := tx.Bucket(pendingBucket)
	if p == nil {
		return fmt.Errorf("%w: bucket %s missing", ErrTableCorrupt, pendingBucket)
	}
	prefix := append([]byte(device), 0)
	var drop [][]byte
	c := p.Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		drop = append(drop, bytes.Clone(k))
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
