package agent

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.etcd.io/bbolt"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/internal/backoff"
)

// Epochs (fence.AdmitEpoch): every command carries the epoch it is issued
// in, and a fence point refuses one of an epoch below its own (stale) or
// above it (invalid: it has no statement of that epoch). The agent stamps
// each device's commands with the epoch it knows the device to be at:
//
//   - for an `auth: required` device, at least the fleet's epoch: the
//     newest epoch statement of the operator's root its trust holds
//     (`edgefence keys epoch`, read from etcd, kept in trust.db, relayed to
//     the device in its trust update);
//   - the epoch the device itself said it is at, in an ack the agent
//     accepted (signed by the device's key for an `auth: required` one):
//     an operator's fence reset puts a device in an epoch of its own.
//
// Tokens of different epochs say nothing of each other, so when a
// device's epoch goes up the agent's guard for it starts over: the
// highest token held for it (durable in the outbox) and its fence point's
// last known mark come down to 0 before the new epoch is recorded. Its
// queued commands of the earlier epoch are ended stale without being sent
// (superseded); those already sent are answered stale by the device
// ("epoch N closed"), which is neither a deposition nor a regression. A
// kind in reissue_kinds is queued again in the new epoch.
//
// The epochs are kept in the agent's trust store (Options.TrustDB,
// bucket epochBucket): per device, and the fleet's epoch the guards of the
// `auth: required` devices were brought down for (fleetKey).

var (
	epochBucket = []byte("agent.epochs")
	fleetKey    = []byte("\x00fleet") // not a device id: ids start with [A-Za-z0-9_-]
)

// epochs is the agent's record of the devices' epochs (safe for
// concurrent use: each write is one bbolt transaction that only raises).
type epochs struct {
	db *bbolt.DB // nil: memory only
}

// load returns the epochs recorded: per device, and the fleet's.
func (e *epochs) load() (map[string]uint64, uint64, error) {
	out := map[string]uint64{}
	var fleet uint64
	if e.db == nil {
		return out, 0, nil
	}
	err := e.db.View(func(tx *bbolt.Tx) error {
		b := tx.Bucket(epochBucket)
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, v []byte) error {
			if len(v) != 8 {
				return fmt.Errorf("epoch of %q: %d bytes", k, len(v))
			}
			if string(k) == string(fleetKey) {
				fleet = binary.BigEndian.Uint64(v)
			} else {
				out[string(k)] = binary.BigEndian.Uint64(v)
			}
			return nil
		})
	})
	if err != nil {
		return nil, 0, fmt.Errorf("epochs: %w", err)
	}
	return out, fleet, nil
}

// put records epoch for key (a device id, or fleetKey), durably, if it is
// above the one recorded.
func (e *epochs) put(key []byte, epoch uint64) error {
	if e.db == nil {
		return nil
	}
	return e.db.Update(func(tx *bbolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(epochBucket)
		if err != nil {
			return err
		}
		if v := b.Get(key); len(v) == 8 && binary.BigEndian.Uint64(v) >= epoch {
			return nil
		}
		return b.Put(key, binary.BigEndian.AppendUint64(nil, epoch))
	})
}

// errEpochStore: the guard or the epoch could not be written.
var errEpochStore = errors.New("epoch not recorded durably")

// epochOf returns the epoch d's commands are stamped with now.
func (d *device) epochOf() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.epoch
}

// raiseEpoch moves d to epoch e if it is above the one d is at: the guard
// comes down durably first (the outbox's held token, to 0), then the
// epoch is recorded (trust.db; key is d's id, or fleetKey when the whole
// fleet moves and the caller records it once), then it takes effect. It
// reports whether d moved.
//
// Raises of one device may run at once (the fleet's, an answer's): each
// lowers the guard and records its epoch, and only the highest takes
// effect. A late one can at most lower the guard of the epoch after it,
// which only costs that epoch's first token a check the fence point makes
// anyway.
func (a *Agent) raiseEpoch(d *device, e uint64, why string, record bool) (bool, error) {
	d.mu.Lock()
	was := d.epoch
	d.mu.Unlock()
	if e <= was {
		return false, nil
	}
	if err := a.outbox.LowerHeld(d.id, 0); err != nil {
		return false, fmt.Errorf("%w: %s: %w", errEpochStore, d.id, err)
	}
	if record {
		if err := a.epochs.put([]byte(d.id), e); err != nil {
			return false, fmt.Errorf("%w: %s: %w", errEpochStore, d.id, err)
		}
	}
	d.mu.Lock()
	if e <= d.epoch {
		d.mu.Unlock()
		return false, nil // a higher raise came first
	}
	was = d.epoch
	d.epoch = e
	d.maxToken, d.fenceMark = 0, 0
	if d.state == StateRefused {
		d.setStateLocked(StateCampaigning, fmt.Sprintf("in epoch %d now (%s): the token regression is behind it", e, why), a.now())
	}
	d.mu.Unlock()
	d.retryNow() // a token regression refused it: no longer in this epoch
	level := slog.LevelWarn
	if !record {
		level = slog.LevelDebug // the fleet's: one line for all (runEpochs)
	}
	a.log.Log(context.Background(), level, "device in a new epoch: commands of the earlier one are closed, the token guard starts over",
		"device", d.id, "epoch", e, "was", was, "why", why)
	a.delivery.kickPending(d) // its queued commands of the earlier epoch end superseded
	return true, nil
}

// fleetEpoch moves every `auth: required` device to the fleet's epoch e
// (the newest epoch statement the trust holds), then records e as the
// fleet's. Devices' guards come down in parallel (the outbox's group
// commit batches them).
func (a *Agent) fleetEpoch(e uint64) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		sem   = make(chan struct{}, 32)
	)
	for _, id := range a.order {
		d := a.devices[id]
		if d.auth != AuthRequired {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if _, err := a.raiseEpoch(d, e, "the operator's epoch statement", false); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if first != nil {
		return first
	}
	if err := a.epochs.put(fleetKey, e); err != nil {
		return fmt.Errorf("%w: the fleet's: %w", errEpochStore, err)
	}
	return nil
}

// loadEpochs sets each device's epoch from the store: its own, or for an
// `auth: required` device the fleet's if that is higher.
func (a *Agent) loadEpochs() (fleet uint64, err error) {
	per, fleet, err := a.epochs.load()
	if err != nil {
		return 0, err
	}
	for id, d := range a.devices {
		e := per[id]
		if d.auth == AuthRequired {
			e = max(e, fleet)
		}
		d.epoch = e
	}
	return fleet, nil
}

// ackEpoch learns d's epoch from ack, an answer of d's fence point the
// agent accepted (verified, for an `auth: required` device): a device at
// a higher epoch than the agent stamps (an operator's reset put it there)
// gets that epoch from now on.
func (a *Agent) ackEpoch(d *device, ack *fence.Ack) {
	if ack.Epoch <= d.epochOf() {
		return
	}
	if _, err := a.raiseEpoch(d, ack.Epoch, fmt.Sprintf("its fence point answered at epoch %d", ack.Epoch), true); err != nil {
		a.log.Error("device's new epoch not taken: will be learned again from its next answer", "device", d.id, "err", err)
	}
}

// runEpochs moves the `auth: required` devices to the fleet's epoch each
// time the trust holds a newer epoch statement than the one they were
// moved to, until ctx ends. fleet is the epoch they are at now.
func (a *Agent) runEpochs(ctx context.Context, fleet uint64) {
	delay := backoff.Backoff{Min: time.Second, Max: 30 * time.Second}
	for {
		changed := a.keep.changes()
		if e := a.keep.t.Epoch(); e > fleet {
			if err := a.fleetEpoch(e); err != nil {
				wait := delay.Next()
				a.log.Error("the fleet's new epoch not taken yet; will retry", "epoch", e, "err", err, "retry_in", wait)
				if !backoff.Sleep(ctx, wait) {
					return
				}
				continue
			}
			a.log.Warn("the fleet is in a new epoch (the operator's epoch statement)", "epoch", e, "was", fleet)
			fleet = e
			delay.Reset()
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
}

// resetFromEtcd takes a reset of dev published in etcd (`edgefence fence
// reset --config`: the keeper's follow), verified against the root: a
// device put in a higher epoch than the agent stamps moves to it, its
// mark the reset's.
func (a *Agent) resetFromEtcd(dev string, raw []byte) {
	d := a.devices[dev]
	if d == nil || a.keep == nil {
		return
	}
	r, err := a.keep.t.VerifyReset(raw, dev)
	if err != nil {
		a.log.Warn("fence reset in etcd refused: not the operator root's for this device", "device", dev, "err", err)
		return
	}
	moved, err := a.raiseEpoch(d, r.Epoch, "the operator's fence reset "+r.ID, true)
	if err != nil {
		a.log.Error("fence reset in etcd not taken: will be again when the device answers", "device", dev, "err", err)
		return
	}
	if moved {
		d.mu.Lock()
		d.fenceMark = r.Token
		d.mu.Unlock()
	}
}
