package shim

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"go.etcd.io/bbolt"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/fence/history"
)

// Result is the full outcome of one command at the fence point.
type Result struct {
	Ack fence.Ack
	// Envelope is the decoded command, nil if it could not be decoded.
	Envelope *fence.Envelope
	// Applied reports that the command took effect (its ApplyTx committed,
	// or its Apply returned nil).
	Applied bool
	// Update is set when raw was a trust update, not a command
	// (Options.Keys): what it did. There is no ack to send (Ack is zero).
	Update *auth.Learned
}

// Handle decides one command addressed to device (for instance the device
// named by the MQTT topic it arrived on) and returns the ack to send back.
//
// raw is decoded with fence.UnmarshalEnvelope; an undecodable envelope, one
// naming another device, or one d.Check refuses is Invalid and leaves the
// mark unchanged. Otherwise fence.AdmitEpoch decides (the epoch first: see
// State), inside one bbolt write transaction that also stores the new mark
// (and, for a TxApplier, the effect), committed with fsync before Apply
// runs. Duplicates are acknowledged again and never re-applied. The ack
// carries the device's epoch and mark after the decision. Handle never
// panics.
func (s *Shim) Handle(device string, raw []byte, d Device) fence.Ack {
	return s.Process(device, raw, d).Ack
}

// Process is Handle returning the decoded envelope and whether the command
// took effect as well. A trust update (Options.Keys) is taken in here
// too: Result.Update says what it did, and Handle returns the zero Ack.
func (s *Shim) Process(device string, raw []byte, d Device) Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.processOne(device, raw, d)
}

// processOne is Process with s.mu held.
func (s *Shim) processOne(device string, raw []byte, d Device) Result {
	if s.ledger != nil && auth.IsUpdate(raw) {
		return s.learn(device, raw) // trust.go: not a command, no ack
	}
	if auth.IsReset(raw) { // the operator's reset, not a command (reset.go)
		return s.reset(device, raw)
	}
	s.signer = ""
	res := s.process(device, raw, d)
	if !res.Applied {
		// An applied command's accept was recorded before its commit
		// (recordAccept); every other outcome is recorded now.
		s.record(res)
	}
	return res
}

// record writes a decision to the history, if any. Call with s.mu held,
// so that the lines are in decision order.
func (s *Shim) record(res Result) {
	if s.opts.History == nil {
		return
	}
	a := res.Ack
	e := history.Event{Op: history.OpVerdict, Device: a.Device, ID: a.ID, Token: uint64(a.Token), Seq: a.Seq,
		Verdict: a.Verdict.String(), Reason: a.Reason, Signer: s.signer}
	if res.Envelope != nil {
		e.Kind = res.Envelope.Kind
		if s.opts.HistoryNote != nil {
			s.opts.HistoryNote(res.Envelope, &e)
		}
	}
	if err := s.opts.History.Record(e); err != nil {
		s.log.Warn("history not written", "device", a.Device, "id", a.ID, "err", err)
	}
}

// recordAccept writes the accept of env to the history, if any, before the
// commit that makes it durable (inside the write transaction, or before
// the effect of a deferred seq advance): a SIGKILL after the commit cannot
// lose the line. Call with s.mu held.
func (s *Shim) recordAccept(env *fence.Envelope, st fence.State) {
	if s.opts.History != nil {
		s.record(Result{Ack: fence.NewEpochAck(env, fence.Accepted, st, ""), Envelope: env})
	}
}

// recordDurable records which recorded accepts did not become durable
// (history.Writer.Recover): on Open, and after a failed commit. Call with
// s.mu held, or before the Shim is shared.
func (s *Shim) recordDurable() {
	if err := s.opts.History.Recover(s.durable); err != nil {
		s.log.Warn("history: durable marks not recorded", "err", err)
	}
}

// durable returns the device's mark as committed in the store, as
// history.Writer.Recover wants it. With PersistOnTokenChangeOnly a seq
// advance is never committed but takes effect all the same, so only the
// token is durable: the seq returned is the largest there is.
func (s *Shim) durable(device string) (token, seq uint64, err error) {
	var r Record
	err = s.db.View(func(tx *bbolt.Tx) error {
		var err error
		r, err = getRecord(tx.Bucket(marksBucket), device)
		return err
	})
	if s.opts.PersistOnTokenChangeOnly {
		return uint64(r.Mark.Token), math.MaxUint64, err
	}
	return uint64(r.Mark.Token), r.Mark.Seq, err
}

// process is Process with s.mu held.
func (s *Shim) process(device string, raw []byte, d Device) Result {
	env, refused, ok := s.screen(device, raw, d)
	if !ok {
		return refused
	}
	live, stored, e, err := s.current(device)
	if err != nil {
		s.storageFailed(device, err)
		return s.refuse(device, env, fence.State{}, err.Error())
	}
	verdict, next, eerr := fence.AdmitEpoch(e, live.State(), env.Epoch, env.Token, env.Seq)
	switch {
	case verdict == fence.Accepted:
	case verdict == fence.Stale, verdict == fence.Duplicate:
		return s.refused(env, verdict, next, eerr)
	case eerr != nil: // an epoch the shim holds no statement of
		return s.refuse(device, env, next, eerr.Error())
	default: // Envelope.Validate already refused token 0 and seq 0
		return s.refuse(device, env, next, "admit: "+verdict.String())
	}

	txa, isTx := d.(TxApplier)
	rec := Record{Epoch: next.Epoch, Mark: next.Mark, At: time.Now(), Holder: env.Holder, ID: env.ID}
	if s.opts.PersistOnTokenChangeOnly && !isTx && next.Mark.Token == stored.Mark.Token && next.Epoch == stored.Epoch {
		// Seq-only advance under the durable token and epoch: no write, no fsync.
		s.pending[device] = rec
		s.stats.deferred.Add(1)
		s.recordAccept(env, next)
	} else if refused, ok := s.persist(device, env, rec, e, live.State().At(e), txa); !ok {
		return refused
	}

	if !isTx {
		// Durable before effect: the mark is committed (or, by the caller's
		// choice, deferred for a same-token seq); the command is consumed.
		if err := guard("apply", func() error { return d.Apply(env) }); err != nil {
			s.stats.applyFailed.Add(1)
			return s.refuse(device, env, next,
				"effect failed after the mark moved; the command is consumed, send a new one: "+err.Error())
		}
	}

	s.stats.accepted.Add(1)
	return Result{Ack: fence.NewEpochAck(env, fence.Accepted, next, ""), Envelope: env, Applied: true}
}

// screen decodes raw and runs every check that needs no stored mark: the
// addressed device, the envelope, the device handler's Check. ok is false
// with the refusal to send.
func (s *Shim) screen(device string, raw []byte, d Device) (env *fence.Envelope, refused Result, ok bool) {
	if s.closed {
		return nil, s.refuse(device, nil, fence.State{}, ErrClosed.Error()), false
	}
	if err := fence.ValidateDeviceID(device); err != nil {
		return nil, s.refuse("", nil, fence.State{}, "addressed device: "+err.Error()), false
	}
	env, err := s.decode(raw)
	if err != nil {
		// auth.Reason: the wording of a refusal a trust update cures is
		// every fence point's (auth.NeedsTrust).
		return nil, s.refuse(device, s.addressable(device, raw), s.stateOrZero(device), auth.Reason(err)), false
	}
	if env.Device != device {
		return nil, s.refuse(device, env, s.stateOrZero(device),
			fmt.Sprintf("envelope names device %q but was addressed to %q", env.Device, device)), false
	}
	if d == nil {
		return nil, s.refuse(device, env, s.stateOrZero(device), "no device handler"), false
	}
	if err := guard("check", func() error { return d.Check(env) }); err != nil {
		return nil, s.refuse(device, env, s.stateOrZero(device), err.Error()), false
	}
	return env, Result{}, true
}

// decode returns the envelope in raw: signed and verified with
// Options.Keys, or plain without them.
func (s *Shim) decode(raw []byte) (*fence.Envelope, error) {
	if s.opts.Keys == nil {
		return fence.UnmarshalEnvelope(raw)
	}
	v, err := auth.Verify(raw, s.opts.Keys)
	if err != nil {
		s.stats.unauth.Add(1)
		s.log.Warn("unauthenticated command refused", "err", err)
		return nil, err
	}
	s.signer = string(v.KeyID)
	return v.Envelope, nil
}

// addressable returns the envelope a refused signed command claims to be,
// unverified, if it names device: only to address the refusal's ack, so
// that its sender learns why. Otherwise nil.
func (s *Shim) addressable(device string, raw []byte) *fence.Envelope {
	if s.opts.Keys == nil {
		return nil
	}
	env, err := auth.Claimed(raw)
	if err != nil || env.Device != device {
		return nil
	}
	return env
}

// persist commits the accept of env (the mark rec, and with a TxApplier
// the effect, in one transaction), recording it in the history before the
// commit. The check is repeated inside the transaction (e: the shim's own
// epoch for the device, as current gave it): it is the authoritative one.
// ok is false with the refusal to send (live is the state the refusal
// carries).
func (s *Shim) persist(device string, env *fence.Envelope, rec Record, e uint64, live fence.State, txa TxApplier) (refused Result, ok bool) {
	recorded := false
	err := s.db.Update(func(tx *bbolt.Tx) error {
		b := tx.Bucket(marksBucket)
		cur, err := getRecord(b, device)
		if err != nil {
			return err
		}
		if p, ok := s.pending[device]; ok && fence.StateLess(cur.State(), p.State()) {
			cur = p
		}
		// The authoritative check-and-update, atomic in this transaction.
		v, n, _ := fence.AdmitEpoch(e, cur.State(), env.Epoch, env.Token, env.Seq)
		if v != fence.Accepted {
			return fmt.Errorf("%w: state moved to %v during the decision", ErrStorage, cur.State())
		}
		rec.Epoch, rec.Mark = n.Epoch, n.Mark
		if err := putRecord(b, device, rec); err != nil {
			return err
		}
		if txa != nil {
			if err := guard("apply", func() error { return txa.ApplyTx(tx, env) }); err != nil {
				return &applyError{err}
			}
		}
		// Decided: on the record before the commit (history).
		s.recordAccept(env, rec.State())
		recorded = true
		return nil
	})
	if err != nil {
		if recorded {
			s.recordDurable() // the commit failed after the accept was recorded
		}
		if ae := (*applyError)(nil); errors.As(err, &ae) {
			s.stats.applyFailed.Add(1)
			return s.refuse(device, env, live, ae.err.Error()), false
		}
		err = storageErr(err)
		s.storageFailed(device, err)
		return s.refuse(device, env, live, err.Error()), false
	}
	delete(s.pending, device)
	return Result{}, true
}

// storageFailed counts a decision refused because the marks could not be
// read or written, and logs a corrupt mark record (the device's commands
// are refused until an operator repairs or removes it).
func (s *Shim) storageFailed(device string, err error) {
	s.stats.storage.Add(1)
	if errors.Is(err, fence.ErrMarkRecordCorrupt) {
		s.stats.corrupt.Add(1)
		s.log.Error("mark record corrupt: the device's commands are refused until it is repaired",
			"device", device, "path", s.path, "err", err)
	}
}

// refused answers a stale or duplicate command; st is the device's state,
// epochErr the refusal by epoch (AdmitEpoch), if it was one.
func (s *Shim) refused(env *fence.Envelope, v fence.Verdict, st fence.State, epochErr error) Result {
	var reason string
	m := st.Mark
	switch {
	case epochErr != nil:
		s.stats.stale.Add(1)
		reason = epochErr.Error()
		s.log.Info("stale command refused: its epoch is closed", "device", env.Device, "id", env.ID, "token", env.Token,
			"seq", env.Seq, "holder", env.Holder, "epoch", env.Epoch, "device_epoch", st.Epoch)
	case v == fence.Stale:
		s.stats.stale.Add(1)
		reason = fmt.Sprintf("token %d below the high-water mark %s", env.Token, m)
		s.log.Info("stale command refused", "device", env.Device, "id", env.ID, "token", env.Token,
			"seq", env.Seq, "holder", env.Holder, "mark", m.String())
	case v == fence.Duplicate:
		s.stats.duplicate.Add(1)
		reason = fmt.Sprintf("already applied: %d/%d not above %s", env.Token, env.Seq, m)
	}
	return Result{Ack: fence.NewEpochAck(env, v, st, reason), Envelope: env}
}

// refuse answers an Invalid verdict. env may be nil (undecodable) and device
// empty (not a valid device id). st is the device's state, unchanged.
func (s *Shim) refuse(device string, env *fence.Envelope, st fence.State, reason string) Result {
	s.stats.invalid.Add(1)
	reason = strings.ToValidUTF8(reason, "?")
	s.log.Warn("invalid command refused", "device", device, "reason", reason)
	e := env
	if e == nil {
		e = &fence.Envelope{}
	}
	ack := fence.NewEpochAck(e, fence.Invalid, st, reason)
	ack.Device = device // the addressed device, which may differ from env.Device
	if fence.ValidateDeviceID(device) != nil {
		ack.Device = ""
	}
	return Result{Ack: ack, Envelope: env}
}

// stateOrZero reads the device's state for an Invalid ack; a storage
// error there is reported by the next real decision, not here.
func (s *Shim) stateOrZero(device string) fence.State {
	live, _, e, err := s.current(device)
	if err != nil {
		return fence.State{}
	}
	return live.State().At(e)
}

type applyError struct{ err error }

func (e *applyError) Error() string { return e.err.Error() }
func (e *applyError) Unwrap() error { return e.err }

// guard calls device code, turning a panic into an error.
func guard(what string, f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%s panicked: %v", what, r)
		}
	}()
	if err := f(); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}
