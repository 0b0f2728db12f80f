package offline

import (
	"encoding/binary"
	"fmt"

	"go.etcd.io/bbolt"

	"github.com/edgefence/edgefence/fence"
)

// heldBucket maps device → the highest fencing token this gateway's agent
// ever held for it (8 bytes, big-endian). It is the agent's durable token
// regression guard: a token from etcd at or below it means the cluster was
// rebuilt from an old snapshot, and the agent refuses to command the device.
var heldBucket = []byte("agent.held")

// SetHeld records t as held for device, durably, if it is above the token
// recorded so far; it never lowers the record. Concurrent calls share
// commits (internal/groupcommit: a takeover of 1,000 devices records 1,000
// tokens in far fewer fsyncs than 1,000); the check-and-raise decides from
// what its transaction holds, as a group's rerun requires.
func (ob *Outbox) SetHeld(device string, t fence.Token) error {
	if err := ob.putHeld(device, t, func(cur fence.Token) bool { return t > cur }); err != nil {
		return fmt.Errorf("offline: record held token of %s: %w", device, err)
	}
	return nil
}

// LowerHeld records t as the highest token held for device if it is below
// the record, durably: after the operator's fence reset (agent) the device
// takes tokens above t again, and the guard must let them through. It
// never raises the record (SetHeld does).
func (ob *Outbox) LowerHeld(device string, t fence.Token) error {
	if err := ob.putHeld(device, t, func(cur fence.Token) bool { return t < cur }); err != nil {
		return fmt.Errorf("offline: lower held token of %s: %w", device, err)
	}
	return nil
}

// putHeld writes t as device's held token, in a group commit, if better
// says so of the token recorded (0 if none).
func (ob *Outbox) putHeld(device string, t fence.Token, better func(cur fence.Token) bool) error {
	// Touches no in-memory state: a read lock keeps Close out, and
	// writers that hold the write lock (Append, Resolve) are serialized
	// with the group by bbolt itself.
	ob.mu.RLock()
	defer ob.mu.RUnlock()
	switch {
	case ob.closed:
		return ErrClosed
	case ob.opts.ReadOnly:
		return ErrReadOnly
	}
	return ob.group.Commit(func(tx *bbolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(heldBucket)
		if err != nil {
			return err
		}
		cur, err := heldIn(b, device)
		if err != nil || !better(cur) {
			return err
		}
		return b.Put([]byte(device), binary.BigEndian.AppendUint64(nil, uint64(t)))
	})
}

// Held returns the highest token recorded by SetHeld for device, 0 if none.
func (ob *Outbox) Held(device string) (fence.Token, error) {
	var t fence.Token
	err := ob.view(func(tx *bbolt.Tx) error {
		var err error
		t, err = heldIn(tx.Bucket(heldBucket), device)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("offline: held token of %s: %w", device, err)
	}
	return t, nil
}

func heldIn(b *bbolt.Bucket, device string) (fence.Token, error) {
	if b == nil {
		return 0, nil
	}
	v := b.Get([]byte(device))
	if v == nil {
		return 0, nil
	}
	if len(v) != 8 {
		return 0, corruptf("held token of device %s", device)
	}
	return fence.Token(binary.BigEndian.Uint64(v)), nil
}
