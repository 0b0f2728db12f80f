package shim

import (
	"fmt"

	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/fence/history"
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
	s.recordList("") // a list provisioned or kept is in effect from the start
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
	if got.Applied > 0 {
		s.recordList(device)
	}
	return Result{Update: &got}
}

// recordList records the revocation list in effect in the history
// (history.OpTrust), after its commit, if it is newer than the last one
// recorded. Call with s.mu held.
func (s *Shim) recordList(device string) {
	raw, version := s.ledger.Trust().RevocationList()
	if s.opts.History == nil || raw == nil || version <= s.listed {
		return
	}
	list, err := auth.ParseRevocations(raw)
	if err != nil { // it verified when it was learned
		s.log.Warn("history: revocation list not recorded", "err", err)
		return
	}
	e := history.Event{Op: history.OpTrust, Device: device, Reason: fmt.Sprintf("revocation list version %d", version)}
	for _, kid := range list.KeyIDs {
		e.Revoked = append(e.Revoked, string(kid))
	}
	if err := s.opts.History.Record(e); err != nil {
		s.log.Warn("history not written", "device", device, "err", err)
		return
	}
	s.listed = version
}
