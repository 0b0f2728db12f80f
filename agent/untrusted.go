package agent

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/internal/backoff"
)

// Liveness with trust (invariant I8): no gateway holds a device it cannot
// command. An `auth: required` device this gateway cannot command with
// trust goes to state untrusted — Status gives why and the fix —, one log
// line at ERROR and edgefence_trust_releases_total{reason}, for one of:
//
//   - own_certificate: this gateway's own certificate (auth.certificate)
//     is revoked by the newest list, expired or not yet valid, or does
//     not name the device (keeper.mayCommand). The agent lets the lock go
//     if it holds it and does not campaign for the device until that
//     changes: it looks again when a statement comes in, and every
//     trustRecheck.
//   - signer_refused: the device refused this gateway's signer (a
//     command ended invalid for a key — or an epoch — the device does not
//     know after the trust updates, revoked, not authorised, expired, of
//     the wrong role, a bad signature, or unsigned).
//   - acks_unverified: the device answers, but this gateway cannot verify
//     its acks (no device certificate, a key not enrolled, ...): one
//     command got unverifiedLimit acks that did not verify and none that
//     did, over as many attempts.
//
// For the last two the lock is let go and the device campaigned for again
// after the refusal backoff (recampaign: at most refusalBackoffMax), so
// that a gateway that can command it gets it meanwhile.

// Reasons of a trust release (the metric's label).
const (
	untrustOwnCert      = "own_certificate"
	untrustSigner       = "signer_refused"
	untrustAcks         = "acks_unverified"
	untrustReasonsCount = 3
)

// untrustReasons are the labels, in the order of leaseCounters.untrusted.
var untrustReasons = [untrustReasonsCount]string{untrustOwnCert, untrustSigner, untrustAcks}

// trustRecheck is how often a device left for this gateway's own
// certificate is looked at again without news.
const trustRecheck = time.Minute

// unverifiedLimit is how many unverifiable acks of one command, over as
// many attempts, make the device untrusted (acks_unverified).
const unverifiedLimit = 3

// untrustFix is what the operator does about each reason.
var untrustFix = [untrustReasonsCount]string{
	"install a new key and certificate for this gateway (edgefence keys new, keys certify) and restart it",
	"check the device's trust: its root, this gateway's certificate and the revocation list it holds (edgefence keys verify)",
	"enrol the device's key (edgefence keys enrol) or publish its certificate (edgefence keys publish --certs)",
}

// untrustIndex is reason's index in untrustReasons.
func untrustIndex(reason string) int {
	for i, r := range untrustReasons {
		if r == reason {
			return i
		}
	}
	return 0
}

// signerRefused reports whether ack refuses a command because the fence
// point does not accept this gateway's signer.
func signerRefused(ack *fence.Ack) bool {
	if ack.Verdict != fence.Invalid {
		return false
	}
	if auth.NeedsTrust(ack) {
		return true // and the trust updates did not cure it
	}
	for _, e := range [...]error{auth.ErrUnknownKey, auth.ErrRevoked, auth.ErrNotAuthorised, auth.ErrExpired,
		auth.ErrWrongRole, auth.ErrBadSignature, auth.ErrUnsigned} {
		if strings.Contains(ack.Reason, e.Error()) {
			return true
		}
	}
	return false
}

// mayCommand is nil if this gateway may command d as far as its own
// certificate says (always for `auth: off` devices).
func (l *leases) mayCommand(d *device) error {
	if d.auth != AuthRequired {
		return nil
	}
	return l.keep.mayCommand(d.id)
}

// untrusted records that d cannot be commanded with trust for reason
// (untrustReasons), why, and lets ctl's lock go: for own_certificate the
// device is left until the certificate changes (campaign's gate), else it
// is campaigned for again after the refusal backoff.
func (l *leases) untrusted(d *device, ctl *controller, reason, why string) {
	if ctl.lost.Swap(true) {
		return // another verdict, or the session's end, came first
	}
	i := untrustIndex(reason)
	l.stats.untrusted[i].Add(1)
	text := fmt.Sprintf("%s: %s; %s", reason, why, untrustFix[i])
	if reason == untrustOwnCert {
		l.noCommands(d, ctl.token, why)
	}
	l.log.Error("lease released: this gateway cannot command the device with trust", "device", d.id, "token", ctl.token,
		"reason", reason, "why", why, "fix", untrustFix[i], "holder", l.gateway)
	l.setStateReason(d, ctl, StateUntrusted, text)
	l.recampaign(d, ctl.token, ctl.key, ctl.lease, false)
}

// distrusted is campaign's gate: d may not be commanded under this
// gateway's own certificate (why). It puts d in state untrusted (logged
// once an episode) and campaigns again once the trust changes, or after
// trustRecheck. It is called holding one of run's slots and counted in
// run.wg, as campaign is.
func (l *leases) distrusted(run *sessionRun, d *device, why error) {
	i := untrustIndex(untrustOwnCert)
	text := fmt.Sprintf("%s: %v; %s", untrustOwnCert, why, untrustFix[i])
	d.mu.Lock()
	again := d.state == StateUntrusted
	d.setStateLocked(StateUntrusted, text, l.now())
	d.mu.Unlock()
	l.noCommands(d, 0, why.Error())
	if !again {
		l.stats.untrusted[i].Add(1)
		l.log.Error("not campaigning: this gateway's certificate does not let it command the device", "device", d.id,
			"why", why, "fix", untrustFix[i], "holder", l.gateway)
	}
	changed := l.keep.changes()
	run.wg.Add(1)
	go func() {
		defer run.wg.Done()
		t := time.NewTimer(trustRecheck)
		defer t.Stop()
		select {
		case <-run.ctx.Done():
			return
		case <-changed:
		case <-t.C:
		}
		if acquireSlot(run.ctx, run.slots) {
			l.campaign(run, d)
		}
	}()
}

// noCommands ends what d's queue holds under this gateway's tokens (up to
// token and the highest it held): its own certificate does not let it
// command d (why), so it will not campaign for d and never sees another
// holder supersede them. The commands never sent end stale, superseded,
// never sent; one that may have been sent is sent again for its verdict
// (the fence point answers it).
func (l *leases) noCommands(d *device, token fence.Token, why string) {
	d.mu.Lock()
	top := max(token, d.maxToken, d.deposedAt)
	if d.last != nil {
		top = max(top, d.last.token)
	}
	d.deposedAt = top
	d.untrusted = "this gateway may not command the device: " + why
	d.mu.Unlock()
	l.hooks.heldElsewhere(d) // delivery: its queue ends as superseded
}

// watchOwnTrust lets go of every held `auth: required` device this
// gateway's own certificate no longer lets it command, each time a
// statement comes in and every trustRecheck, until ctx ends.
func (l *leases) watchOwnTrust(ctx context.Context) {
	if l.keep == nil || l.keep.kid == nil {
		return
	}
	for {
		changed := l.keep.changes()
		for _, id := range l.order {
			d := l.devices[id]
			err := l.mayCommand(d)
			if err == nil {
				continue
			}
			d.mu.Lock()
			ctl := d.ctl
			d.mu.Unlock()
			if ctl != nil && !ctl.lost.Load() {
				l.untrusted(d, ctl, untrustOwnCert, err.Error())
			}
		}
		t := time.NewTimer(trustRecheck)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-changed:
		case <-t.C:
		}
		t.Stop()
		if !backoff.Sleep(ctx, 10*time.Millisecond) { // a burst of statements is looked at once
			return
		}
	}
}

// untrustedAfter acts on what one attempt at e showed, for an `auth:
// required` device held under e's token: its signer refused by the
// device (ack), or — no verdict (ack nil) — its acks unverifiable.
func (q *delivery) untrustedAfter(w *worker, e *fence.Envelope, ack *fence.Ack) {
	d := w.d
	if d.auth != AuthRequired {
		return
	}
	reason, why := "", ""
	switch {
	case ack != nil && signerRefused(ack):
		reason, why = untrustSigner, "the device refuses this gateway's signer: "+ack.Reason
	case ack == nil && w.tries >= unverifiedLimit:
		n, err := q.auth.unverifiedFor(d.id, e.ID)
		if n < unverifiedLimit {
			return
		}
		reason, why = untrustAcks, fmt.Sprintf("%d acks of command %s did not verify: %v", n, e.ID, err)
	default:
		return
	}
	d.mu.Lock()
	ctl := d.ctl
	d.mu.Unlock()
	if ctl != nil && ctl.token == e.Token && !ctl.lost.Load() {
		q.leases.untrusted(d, ctl, reason, why)
	}
}
