package history

import "fmt"

// InvariantEpoch names the epoch invariant Check adds for histories whose
// fence points record the epoch of each command (Event.Epoch) and the
// epochs they move to (OpEpoch): no command whose epoch is below an epoch
// the fence point had already moved the device to — by an operator's
// reset or the root's epoch statement — is admitted after that move. A
// reset closes the past: an envelope signed before it, replayed or late,
// must be refused whatever its token.
//
// What is checkable from the fence points' own records, as for T1: a
// fence point's history is in its decision order and its OpEpoch line
// follows the commit of the move, so every accept after that line in the
// same source was decided at the new epoch. An accept between the commit
// and the line is not flagged: the check can miss one but never flags an
// admissible accept. An accept discarded as uncommitted does not count.
const InvariantEpoch = "T2"

// epochs is T2's state: per source the epoch every device it verifies is
// at (an OpEpoch without a Device), per (device, source) the device's
// own, each as the event that moved it there.
type epochs struct {
	fleet      map[string]Event
	device     map[point]Event
	violations []Violation
}

// moved takes in an OpEpoch event: epochs only go up.
func (x *epochs) moved(e Event) {
	if e.Device == "" {
		if e.Epoch > x.fleet[e.Source].Epoch {
			x.fleet[e.Source] = e
		}
		return
	}
	p := point{e.Device, e.Source}
	if e.Epoch > x.device[p].Epoch {
		x.device[p] = e
	}
}

// verdict checks a committed OpVerdict against T2.
func (x *epochs) verdict(e Event) {
	if e.Verdict != verdictAccepted || e.Device == "" {
		return
	}
	by := x.fleet[e.Source]
	if d := x.device[point{e.Device, e.Source}]; d.Epoch > by.Epoch {
		by = d
	}
	if e.Epoch >= by.Epoch {
		return
	}
	x.violations = append(x.violations, Violation{Invariant: InvariantEpoch, Device: e.Device, ID: e.ID,
		Detail: fmt.Sprintf("accepted %d/%d of epoch %d at %s, after it moved to epoch %d (%s)",
			e.Token, e.Seq, e.Epoch, e.Source, by.Epoch, movedBy(by))})
}

// movedBy says what an OpEpoch event was.
func movedBy(e Event) string {
	switch {
	case e.ID != "":
		return fmt.Sprintf("reset %s to %d/%d", e.ID, e.Token, e.Seq)
	case e.Reason != "":
		return e.Reason
	}
	return "an epoch statement"
}
