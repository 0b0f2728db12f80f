package offline

import (
	"encoding/binary"
	"fmt"

	"go.etcd.io/bbolt"

	"github.com/edgefence/edgefence/fence"
)

// sessionBucket holds the agent's etcd session: key "lease" is the lease
// id of the session it opened last (8 bytes, big-endian). A restarted agent
// reads it to re-attach to that lease while it lives, so that the lock keys
// the previous run held under it stay its own instead of blocking it.
var (
	sessionBucket = []byte("agent.session")
	leaseKey      = []byte("lease")
)

// issuedBucket maps device → the highest (token, seq) of a command ever
// appended for it (16 bytes, big-endian token then seq). Append raises it
// in the same commit as the entry, so it costs no fsync of its own; a
// restarted agent that re-attaches to its lease carries on above it.
var issuedBucket = []byte("agent.issued")

// SetLease records the id of the etcd lease the agent's session runs
// under, durably, before any lock key is created under it.
func (ob *Outbox) SetLease(id int64) error {
	ob.mu.Lock()
	defer ob.mu.Unlock()
	err := ob.update(func(tx *bbolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(sessionBucket)
		if err != nil {
			return err
		}
		return b.Put(leaseKey, binary.BigEndian.AppendUint64(nil, uint64(id)))
	})
	if err != nil {
		return fmt.Errorf("offline: record session lease: %w", err)
	}
	return nil
}

// Lease returns the lease id recorded by SetLease, 0 if none.
func (ob *Outbox) Lease() (int64, error) {
	var id int64
	err := ob.view(func(tx *bbolt.Tx) error {
		b := tx.Bucket(sessionBucket)
		if b == nil {
			return nil
		}
		v := b.Get(leaseKey)
		if v == nil {
			return nil
		}
		if len(v) != 8 {
			return corruptf("session lease")
		}
		id = int64(binary.BigEndian.Uint64(v))
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("offline: session lease: %w", err)
	}
	return id, nil
}

// Issued returns the highest (token, seq) of a command ever appended for
// device, zeros if none.
func (ob *Outbox) Issued(device string) (fence.Token, uint64, error) {
	var t fence.Token
	var seq uint64
	err := ob.view(func(tx *bbolt.Tx) error {
		var err error
		t, seq, err = issuedIn(tx.Bucket(issuedBucket), device)
		return err
	})
	if err != nil {
		return 0, 0, fmt.Errorf("offline: issued seq of %s: %w", device, err)
	}
	return t, seq, nil
}

func issuedIn(b *bbolt.Bucket, device string) (fence.Token, uint64, error) {
	if b == nil {
		return 0, 0, nil
	}
	v := b.Get([]byte(device))
	if v == nil {
		return 0, 0, nil
	}
	if len(v) != 16 {
		return 0, 0, corruptf("issued seq of device %s", device)
	}
	return fence.Token(binary.BigEndian.Uint64(v)), binary.BigEndian.Uint64(v[8:]), nil
}

// raiseIssued records env's (token, seq) for its device inside tx if it is
// above the record.
func raiseIssued(tx *bbolt.Tx, env *fence.Envelope) error {
	b, err := tx.CreateBucketIfNotExists(issuedBucket)
	if err != nil {
		return err
	}
	t, seq, err := issuedIn(b, env.Device)
	if err != nil {
		return err
	}
	if env.Token < t || (env.Token == t && env.Seq <= seq) {
		return nil
	}
	v := binary.BigEndian.AppendUint64(nil, uint64(env.Token))
	return b.Put([]byte(env.Device), binary.BigEndian.AppendUint64(v, env.Seq))
}
