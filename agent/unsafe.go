package agent

// The agent's one test and demo switch, Options.UnsafeIgnoreSessionLoss,
// is honoured only by a build with -tags edgefence_unsafe (unsafeBuild).
// Every place that asks goes through ignoresLoss or usable, so in a
// shipped build the constant folds every branch on it away, and New
// refuses the option (ErrUnsafeBuild).

// ignoresLoss reports whether controllers carry on under a lost session's
// token, like a process frozen before it could notice (invariant I6 off).
func (a *Agent) ignoresLoss() bool { return unsafeBuild && a.unsafe }

// usable reports whether ctl may issue commands: it is the device's
// controller and its lock is not lost (or ignoresLoss).
func (a *Agent) usable(ctl *controller) bool {
	return ctl != nil && (!ctl.lost.Load() || a.ignoresLoss())
}
