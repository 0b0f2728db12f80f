package agent

import (
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/offline"
)

// A fence point that lacks what this gateway's trust update carries (the
// gateway's certificate, the fleet's epoch statement: the device was
// offline, or had no session at the broker, when the update went out, or
// lost it) refuses the command
// invalid with its mark unchanged, so the command was not applied. The
// agent then publishes the update again and resends the same envelope,
// at most trustRetries times for one command, before the refusal stands
// as the command's verdict.

// trustRetries is how often one command is resent after a trust update
// because its fence point lacked the trust.
const trustRetries = 2

// retryWithTrust decides whether e, refused with ack, is resent after its
// device's trust update (published before the resend by trustSender).
func (q *delivery) retryWithTrust(w *worker, e *offline.Entry, ack *fence.Ack) bool {
	if !auth.NeedsTrust(ack) || w.trustTries >= trustRetries || !q.trust.owe(w.d.id) {
		return false
	}
	w.trustTries++
	q.stats.trustRetried.Add(1)
	q.log.Warn("fence point lacks this gateway's trust; trust update published again, command resent", "device", w.d.id,
		"id", e.Envelope.ID, "token", e.Envelope.Token, "seq", e.Envelope.Seq, "reason", ack.Reason, "try", w.trustTries)
	return true
}
