package history

import (
	"fmt"
	"strings"
)

// InvariantRevocation names the trust invariant Check adds for histories
// whose fence points record who signed each command (Event.Signer) and
// the revocation lists they commit (OpTrust): nothing signed by a revoked
// key is admitted at a fence point after it learned the revocation. An
// envelope the key signed before the revocation is no exception: a late
// or replayed command of a revoked gateway must be refused.
//
// What is checkable from the fence points' own records: a fence point's
// history is in its decision order, and its OpTrust line follows the
// commit of the list, so every accept after that line in the same source
// was decided with the list in effect. An accept before it may have been
// decided after the commit (between commit and line): not flagged, so the
// check can miss such a one but never flags an admissible accept. An
// accept discarded as uncommitted (OpOpened) does not count.
//
// (A second trust invariant, that nothing signed before an operator's
// reset or epoch is admitted after it, belongs with the signed epoch; its
// check would sit beside this one, fed by the epoch's own history event.)
const InvariantRevocation = "T1"

// revocations is T1's state: per source, the revoked key ids and the
// version of the list that revoked each.
type revocations struct {
	bySource   map[string]map[string]string // source → key id → "version N" (Event.Reason)
	violations []Violation
}

// learned takes in an OpTrust event: its list replaces the source's (a
// list names every key revoked so far; versions only go up).
func (r *revocations) learned(e Event) {
	m := make(map[string]string, len(e.Revoked))
	for _, kid := range e.Revoked {
		m[kid] = e.Reason
	}
	r.bySource[e.Source] = m
}

// verdict checks a committed OpVerdict against T1.
func (r *revocations) verdict(e Event) {
	if e.Verdict != verdictAccepted || e.Signer == "" {
		return
	}
	why, ok := r.bySource[e.Source][e.Signer]
	if !ok {
		return
	}
	r.violations = append(r.violations, Violation{Invariant: InvariantRevocation, Device: e.Device, ID: e.ID,
		Detail: fmt.Sprintf("accepted %d/%d signed by revoked key %q at %s, after it learned the revocation (%s)",
			e.Token, e.Seq, e.Signer, e.Source, strings.TrimSpace(why))})
}
