package shim

import (
	"errors"
	"fmt"
	"time"

	"go.etcd.io/bbolt"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
)

// resetsBucket holds one fence.ResetRecord per device id: the last
// authorised reset applied to its mark.
var resetsBucket = []byte("shim.resets")

// resetVerifier is what checks resets here: Options.Root, else Keys if it
// is the whole trust chain (an *auth.Trust), else nothing.
func (s *Shim) resetVerifier() auth.ResetVerifier {
	if s.opts.Root != nil {
		return s.opts.Root
	}
	if v, ok := s.opts.Keys.(auth.ResetVerifier); ok {
		return v
	}
	return nil
}

// reset applies an operator's reset statement addressed to device (a
// payload auth.IsReset recognised): verified against the root, then the
// new mark in the reset's epoch and the reset's record (its counter above
// the last one's, its epoch above the device's: fence.CheckReset) in one
// transaction, committed with fsync before the ack says accepted. Every
// refusal is invalid with the mark unchanged, counted and logged. Call
// with s.mu held.
func (s *Shim) reset(device string, raw []byte) Result {
	if s.closed {
		return s.refuseReset(device, raw, fence.State{}, ErrClosed)
	}
	if err := fence.ValidateDeviceID(device); err != nil {
		return s.refuseReset("", raw, fence.State{}, err)
	}
	v := s.resetVerifier()
	if v == nil {
		return s.refuseReset(device, raw, s.stateOrZero(device),
			fmt.Errorf("%w: %w: this fence point cannot check a reset", fence.ErrInvalid, auth.ErrNoRoot))
	}
	r, err := v.VerifyReset(raw, device)
	if err != nil {
		return s.refuseReset(device, raw, s.stateOrZero(device), err)
	}
	now := time.Now()
	rec := Record{Epoch: r.Epoch, Mark: r.Mark(), At: now, Holder: "operator reset", ID: r.ID}
	rr := r.Record()
	rr.At = now
	var refused error
	var old fence.State
	floor := s.floor()
	err = s.db.Update(func(tx *bbolt.Tx) error {
		b := tx.Bucket(marksBucket)
		cur, err := getRecord(b, device)
		if err != nil {
			return err
		}
		last, err := getReset(tx, device)
		if err != nil {
			return err
		}
		old = cur.State().At(max(floor, last.Epoch))
		if refused = fence.CheckReset(last, old.Epoch, r.Counter, r.Epoch); refused != nil {
			return nil
		}
		if err := putRecord(b, device, rec); err != nil {
			return err
		}
		rb, err := tx.CreateBucketIfNotExists(resetsBucket)
		if err != nil {
			return err
		}
		v, err := rr.MarshalBinary()
		if err != nil {
			return err
		}
		return rb.Put([]byte(device), v)
	})
	switch {
	case err != nil:
		err = storageErr(err)
		s.storageFailed(device, err)
		return s.refuseReset(device, raw, s.stateOrZero(device), err)
	case refused != nil:
		return s.refuseReset(device, raw, old, refused)
	}
	// A seq advance held in memory belongs to the mark the reset replaced.
	delete(s.pending, device)
	s.stats.resets.Add(1)
	s.log.Warn("fence reset by the operator", "device", device, "mark", rec.Mark.String(), "epoch", rec.Epoch,
		"was", old.Mark.String(), "was_epoch", old.Epoch, "counter", r.Counter, "id", r.ID)
	return Result{Ack: auth.ResetAck(device, r, rec.State(), nil)}
}

// refuseReset answers a reset that was not applied: invalid, the state st
// unchanged, the ack naming the reset id it claims (so that its sender
// learns why).
func (s *Shim) refuseReset(device string, raw []byte, st fence.State, err error) Result {
	s.stats.invalid.Add(1)
	s.stats.resetsRefused.Add(1)
	r, _ := auth.PeekReset(raw)
	id := ""
	if r != nil {
		id = r.ID
	}
	lvl := "reset refused"
	if errors.Is(err, auth.ErrReplayedReset) {
		lvl = "reset refused: replayed"
	}
	s.log.Warn(lvl, "device", device, "id", id, "mark", st.Mark.String(), "epoch", st.Epoch, "err", err)
	return Result{Ack: auth.ResetAck(device, r, st, err)}
}

// LastReset returns the record of device's last authorised reset (the zero
// record if none was applied).
func (s *Shim) LastReset(device string) (fence.ResetRecord, error) {
	var r fence.ResetRecord
	err := s.View(func(tx *bbolt.Tx) error {
		var err error
		r, err = getReset(tx, device)
		return err
	})
	return r, err
}
