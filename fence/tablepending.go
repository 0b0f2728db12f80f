package fence

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"

	"go.etcd.io/bbolt"
)

// Admitted but not yet applied.
//
// The transaction that accepts a command stores, next to the device's new
// mark, the command itself in the bucket fence.unapplied; Applied removes it
// once the device has answered. A gateway that dies in between finds the
// command there on restart (Unapplied) and delivers it then, so that a mark
// never vouches for a command that no device has seen: when its sender
// resends it, the table's Duplicate is answered only after the command was
// applied.
//
// Key: device id | 0x00 | token (8, big-endian) | seq (8, big-endian), so a
// device's commands are contiguous (0x00 sorts below every device id
// character) and in admission order (the admit rule only ever raises the
// mark). Value, checksummed like a mark record so that a flipped bit in a
// stored register value is detected, not written to a device:
//
//	offset  size  field
//	0       1     format version (pendingVersion)
//	1       n     the envelope, deterministic CBOR (MarshalEnvelope)
//	1+n     4     CRC-32C (Castagnoli) of all preceding bytes
const pendingVersion = 1

// pendingKey is the unapplied bucket's key of device's command at m.
func pendingKey(device string, m Mark) []byte {
	k := make([]byte, 0, len(device)+17)
	k = append(k, device...)
	k = append(k, 0)
	k = binary.BigEndian.AppendUint64(k, uint64(m.Token))
	return binary.BigEndian.AppendUint64(k, m.Seq)
}

func encodePending(env *Envelope) ([]byte, error) {
	b, err := MarshalEnvelope(env)
	if err != nil {
		return nil, fmt.Errorf("fence: encode unapplied command: %w", err)
	}
	v := make([]byte, 0, 1+len(b)+4)
	v = append(v, pendingVersion)
	v = append(v, b...)
	return binary.BigEndian.AppendUint32(v, crc32.Checksum(v, castagnoli)), nil
}

// decodePending decodes a stored unapplied command stored under key k of
// device. Every failure wraps ErrTableCorrupt.
func decodePending(device string, k, v []byte) (*Envelope, error) {
	if len(v) < 5 {
		return nil, corruptf("unapplied command is %d bytes", len(v))
	}
	body, sum := v[:len(v)-4], binary.BigEndian.Uint32(v[len(v)-4:])
	if got := crc32.Checksum(body, castagnoli); got != sum {
		return nil, corruptf("unapplied command checksum %08x, stored %08x", got, sum)
	}
	if body[0] != pendingVersion {
		return nil, corruptf("unapplied command format %d, want %d", body[0], pendingVersion)
	}
	env, err := UnmarshalEnvelope(body[1:])
	if err != nil {
		return nil, corruptf("unapplied command: %v", err)
	}
	if !bytes.Equal(k, pendingKey(env.Device, Mark{Token: env.Token, Seq: env.Seq})) || env.Device != device {
		return nil, corruptf("unapplied command %s %d/%d stored under another key", env.Device, env.Token, env.Seq)
	}
	return env, nil
}

// Applied records that the device has answered its command at mark m (an
// Accepted admit of this table): the command is no longer listed by
// Unapplied and will not be delivered again after a restart. Marks with no
// unapplied command are ignored, so calling it twice is harmless. It is
// MarkApplied followed by AwaitApplied: it returns once the removal was
// committed with fsync.
func (t *Table) Applied(ctx context.Context, device string, m Mark) error {
	ticket, err := t.MarkApplied(device, m)
	if err != nil {
		return err
	}
	return t.AwaitApplied(ctx, ticket)
}

// MarkApplied queues the removal of device's unapplied command at m
// without writing: the next commit of the table (an admit's, usually the
// device's next command's) carries it, with its fsync. AwaitApplied(ticket)
// returns once that commit has returned, committing by itself if none
// did.
//
// A caller that sends commands to a device must await the ticket of each
// command before it sends the next one: then at most the oldest of a
// device's unapplied commands can have reached the device before a crash,
// which is what makes delivering them again on restart safe (see
// agent/bridge).
func (t *Table) MarkApplied(device string, m Mark) (ticket uint64, err error) {
	if err := ValidateDeviceID(device); err != nil {
		return 0, err
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	switch {
	case t.closed:
		return 0, ErrTableClosed
	case t.opts.ReadOnly:
		return 0, ErrTableReadOnly
	}
	t.deferMu.Lock()
	defer t.deferMu.Unlock()
	t.ticket++
	t.deferred = append(t.deferred, deferredDelete{key: pendingKey(device, m), ticket: t.ticket})
	t.outstanding[t.ticket] = struct{}{}
	return t.ticket, nil
}

// AwaitApplied waits until the removal queued under ticket was committed
// with fsync, committing it if no commit has carried it yet.
func (t *Table) AwaitApplied(ctx context.Context, ticket uint64) error {
	for {
		t.deferMu.Lock()
		_, out := t.outstanding[ticket]
		t.deferMu.Unlock()
		if !out {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := t.flush(); err != nil {
			return err
		}
	}
}

// flush commits a transaction that carries only the queued removals
// (together with the admits of its group).
func (t *Table) flush() error {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.closed {
		return ErrTableClosed
	}
	if err := t.commit(flushCall{}); err != nil {
		return t.storageErr("(applied)", err)
	}
	return nil
}

// deferredDelete is one queued removal of an applied command.
type deferredDelete struct {
	key    []byte
	ticket uint64
}

// flushCall is a group member with nothing of its own to write.
type flushCall struct{}

func (flushCall) run(*bbolt.Tx) error { return nil }

// update runs fn in a write transaction that first removes the applied
// commands queued so far (MarkApplied); when the commit succeeds their
// tickets are done, otherwise they are queued again for the next one. A
// removal never fails the transaction: a missing key is no error, and
// without the bucket (corruption, reported by Unapplied) there is nothing
// to remove.
func (t *Table) update(fn func(*bbolt.Tx) error) error {
	var taken []deferredDelete
	err := t.db.Update(func(tx *bbolt.Tx) error {
		t.deferMu.Lock()
		taken, t.deferred = t.deferred, nil
		t.deferMu.Unlock()
		if p := tx.Bucket(pendingBucket); p != nil {
			for _, d := range taken {
				_ = p.Delete(d.key)
			}
		}
		return fn(tx)
	})
	if err != nil {
		t.recordDurable() // accepts recorded in the failed transaction did not happen
	}
	if len(taken) == 0 {
		return err
	}
	t.deferMu.Lock()
	defer t.deferMu.Unlock()
	if err != nil {
		t.deferred = append(taken, t.deferred...)
		return err
	}
	for _, d := range taken {
		delete(t.outstanding, d.ticket)
	}
	return nil
}

// Unapplied returns device's commands that were accepted but not yet
// marked Applied, in admission order. It reads the latest commit.
func (t *Table) Unapplied(device string) ([]*Envelope, error) {
	if err := ValidateDeviceID(device); err != nil {
		return nil, err
	}
	var out []*Envelope
	err := t.viewPending(func(p *bbolt.Bucket) error {
		prefix := append([]byte(device), 0)
		c := p.Cursor()
		for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
			env, err := decodePending(device, k, v)
			if err != nil {
				return err
			}
			out = append(out, env)
		}
		return nil
	})
	if err != nil {
		return nil, t.storageErr(device, err)
	}
	return out, nil
}

// viewPending runs fn on the unapplied bucket in a read transaction. A file
// without the bucket (written by a version before it, opened read-only)
// reads as empty.
func (t *Table) viewPending(fn func(p *bbolt.Bucket) error) error {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.closed {
		return ErrTableClosed
	}
	return t.db.View(func(tx *bbolt.Tx) error {
		p := tx.Bucket(pendingBucket)
		if p == nil {
			if t.opts.ReadOnly {
				return nil
			}
			return fmt.Errorf("%w: bucket %s missing", ErrTableCorrupt, pendingBucket)
		}
		return fn(p)
	})
}
