package shim

import (
	"errors"
	"time"

	"go.etcd.io/bbolt"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
)

// Request is one command of a batch (ProcessBatch): the device it was
// addressed to and the envelope as received.
type Request struct {
	Device string
	Raw    []byte
}

// ProcessBatch is Process of several commands, in order, for a device
// handler that is a TxApplier: each is decided as if after the ones
// before it (a device named twice sees its first command's mark), and
// the marks and effects of every accepted command are committed in one
// transaction, with one fsync, before any result is returned — each
// accept is durable before its ack exists (invariant I3), as with
// Process. A simulator serving many devices from one file (devices/sim)
// uses it so that devices answering at the same time share a commit, as
// devices with flash of their own would not wait for each other.
//
// If that transaction fails (an effect failed, or the storage), nothing
// of it took effect, and every command is processed again alone, as by
// Process, so that one bad command fails only itself. Without a
// TxApplier, with PersistOnTokenChangeOnly, or when the batch holds a
// trust update or a reset, every command is processed alone.
func (s *Shim) ProcessBatch(reqs []Request, d Device) []Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Result, len(reqs))
	txa, isTx := d.(TxApplier)
	if !isTx || s.opts.PersistOnTokenChangeOnly || s.batchHasControl(reqs) || !s.processBatch(reqs, d, txa, out) {
		for i, r := range reqs {
			out[i] = s.processOne(r.Device, r.Raw, d)
		}
	}
	return out
}

// batchHasControl reports whether reqs holds a trust update or a reset.
func (s *Shim) batchHasControl(reqs []Request) bool {
	for _, r := range reqs {
		if (s.ledger != nil && auth.IsUpdate(r.Raw)) || auth.IsReset(r.Raw) {
			return true
		}
	}
	return false
}

// batchItem is one command of a batch being decided.
type batchItem struct {
	env      *fence.Envelope // nil: refused by screen (out holds the refusal)
	verdict  fence.Verdict
	state    fence.State // after the decision
	epochErr error       // a refusal by epoch (fence.AdmitEpoch)
	err      error       // reading the device's records failed
}

// processBatch decides reqs in one transaction and fills out; false if
// the transaction failed (out is then to be filled command by command).
// Call with s.mu held.
func (s *Shim) processBatch(reqs []Request, d Device, txa TxApplier, out []Result) bool {
	items := make([]batchItem, len(reqs))
	for i, r := range reqs {
		env, refused, ok := s.screen(r.Device, r.Raw, d)
		if !ok {
			out[i] = refused
			continue
		}
		items[i].env = env
	}
	recorded := false
	floor := s.floor()
	err := s.db.Update(func(tx *bbolt.Tx) error {
		recorded = false
		b := tx.Bucket(marksBucket)
		for i := range items {
			it := &items[i]
			if it.env == nil {
				continue
			}
			cur, err := getRecord(b, reqs[i].Device)
			var e uint64
			if err == nil {
				e, err = getResetEpoch(tx, reqs[i].Device)
			}
			if err != nil {
				it.err = err // this device's records only: the others go on
				continue
			}
			it.verdict, it.state, it.epochErr = fence.AdmitEpoch(max(floor, e), cur.State(), it.env.Epoch, it.env.Token, it.env.Seq)
			if it.verdict != fence.Accepted {
				continue
			}
			rec := Record{Epoch: it.state.Epoch, Mark: it.state.Mark, At: time.Now(), Holder: it.env.Holder, ID: it.env.ID}
			if err := putRecord(b, reqs[i].Device, rec); err != nil {
				return err
			}
			if err := guard("apply", func() error { return txa.ApplyTx(tx, it.env) }); err != nil {
				return &applyError{err}
			}
			s.recordAccept(it.env, it.state) // decided: on the record before the commit
			recorded = true
		}
		return nil
	})
	if err != nil {
		if recorded {
			s.recordDurable() // the commit failed after accepts were recorded
		}
		if !errors.As(err, new(*applyError)) {
			s.log.Warn("batch not committed; its commands are decided one by one", "commands", len(reqs), "err", err)
		}
		return false
	}
	for i := range items {
		if items[i].env != nil {
			out[i] = s.batchResult(reqs[i].Device, &items[i])
		}
		if !out[i].Applied {
			s.record(out[i]) // as Process: an applied command's accept is on record already
		}
	}
	return true
}

// batchResult is the result of a screened command of a committed batch.
func (s *Shim) batchResult(device string, it *batchItem) Result {
	switch {
	case it.err != nil:
		err := storageErr(it.err)
		s.storageFailed(device, err)
		return s.refuse(device, it.env, fence.State{}, err.Error())
	case it.verdict == fence.Accepted:
		s.stats.accepted.Add(1)
		return Result{Ack: fence.NewEpochAck(it.env, fence.Accepted, it.state, ""), Envelope: it.env, Applied: true}
	case it.verdict == fence.Stale, it.verdict == fence.Duplicate:
		return s.refused(it.env, it.verdict, it.state, it.epochErr)
	case it.epochErr != nil:
		return s.refuse(device, it.env, it.state, it.epochErr.Error())
	}
	return s.refuse(device, it.env, it.state, "admit: "+it.verdict.String())
}
