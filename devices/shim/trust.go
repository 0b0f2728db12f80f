package shim

import (
	"github.com/edgefence/edgefence/fence/auth"
)

// trustBucket holds the trust statements learned over the air
// (auth.Ledger: one per certificate key id, one revocation list, one
// epoch statement).
var trustBucket = []byte("shim.trust")

// openLedger makes the shim learn trust updates when its Keys is an
// *auth.Trust: what it learned before is replayed into the Trust now,
// before any decision. Call from Open, before the Shim is shared.
func (s *Shim) openLedger() error {
	tr, ok := s.opts.Keys.(*auth.Trust)
	if !ok {
		return nil
	}
	l, replay, err := auth.OpenLedger(tr, s.db, trustBucket)
	if err != nil {
		return err
	}
	s.ledger = l
	replay.Log(s.log, tr, true, "path", s.path)
	return nil
}

// learn takes in a trust update arriving as a command payload (see
// auth.Ledger.Learn): each newer statement is committed with fsync before
// it takes effect. A trust update is not a command: no mark moves, and
// there is no ack to send (Result.Update is set, Result.Ack is zero);
// what it did is counted (Stats.Trust*) and every refusal logged. Call
// with s.mu held.
func (s *Shim) learn(device string, raw []byte) Result {
	var got auth.Learned
	if s.closed {
		got.Refused, got.Refusals = 1, []error{ErrClosed}
	} else {
		got, _ = s.ledger.Learn(raw) // every refusal is in got.Refusals
	}
	s.stats.trust.Add(got)
	got.Log(s.log, s.ledger.Trust(), false, "device", device)
	return Result{Update: &got}
}
