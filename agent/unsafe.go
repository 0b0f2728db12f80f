package agent

// The agent's one test and demo switch, Options.UnsafeIgnoreSessionLoss,
// is honoured only by a build with -tags edgefence_unsafe (unsafeBuild).
// Every place that asks goes through ignoresLoss or usable, so in a
// shipped build the constant folds every branch on it away, and New
// refuses the option (ErrUnsafeBuild).

// lossRule is Options.UnsafeIgnoreSessionLoss as each part of the agent
// sees it (embedded: a.ignoresLoss(), a.usable(ctl)).
type lossRule struct{ unsafe bool }

// ignoresLoss reports whether controllers carry on under a lost session's
// token, like a process frozen before it could notice (invariant I6 off).
func (r lossRule) ignoresLoss() bool { return unsafeBuild && r.unsafe }

// usable reports whether ctl may issue commands: it is the device's
// controller and its lock is not lost (or ignoresLoss).
func (r lossRule) usable(ctl *controller) bool {
	return ctl != nil && (!ctl.lost.Load() || r.ignoresLoss())
}
