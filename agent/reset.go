package agent

import (
	"context"
	"fmt"
	"math"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
)

// FenceResetAck takes an ack that answered no command of this agent (the
// MQTT Commander's unmatched acks, mqtt.Commander.OnUnmatched). The ack of
// an operator's fence reset that the device's fence point applied — its id
// a reset id (fence/auth), verdict accepted — says the fence point now
// holds the mark the ack carries, which may be far below the one the agent
// learned from stale answers: the agent's regression guard (no token not
// above the device's known mark is used) takes the new mark, so that the
// next campaign's token commands the device again, without a restart. A
// controller whose token the reset spent (not above the new mark) lets the
// lock go and campaigns again, for a token above it. Every other ack is
// ignored.
//
// raw is the ack as it arrived: for an `auth: required` device it must be
// signed by the device's enrolled key (deviceAuth.checkReset), or it is
// dropped and counted like any forged ack. For an `auth: off` device a
// forged reset ack can at most make the agent try a token the device
// refuses again as stale — the regression path once more — and, for a
// holder, cost a hand-over.
func (a *Agent) FenceResetAck(dev string, ack *fence.Ack, raw []byte) {
	d, ok := a.devices[dev]
	if !ok || ack.Verdict != fence.Accepted || !auth.ValidResetID(ack.ID) || ack.MaxToken == 0 {
		return
	}
	if a.devauth != nil && a.devauth.required[dev] {
		v, err := a.devauth.checkReset(dev, ack.ID, raw)
		if err != nil {
			return // counted and logged by checkReset
		}
		ack = v
	}
	a.ackEpoch(d, ack) // a reset puts the device in an epoch of its own
	a.leases.fenceReset(d, ack.Mark(), ack.ID)
}

// lowerGuard is the way back for a gateway whose own guard (the highest
// token it ever held, or the device's mark it learned) refuses token after
// a token regression the operator has repaired with a fence reset it did
// not see: the reset, root-signed, published in etcd by `edgefence fence
// reset` (<prefix>/trust/resets/<device>), verified against auth.trust_root.
// A reset puts the device in an epoch of its own with the reset's mark: if
// that epoch is above the one the agent stamps, the device moves to it
// (raiseEpoch: the guard starts over, durably; the commands queued in the
// epoch before end superseded, never sent) and the reset's mark becomes
// the device's known mark. It reports whether it moved the device.
// Without a trust root, or a reset that verifies, nothing changes: the
// device's own fence stays the authority either way.
func (l *leases) lowerGuard(ctx context.Context, d *device, token fence.Token) bool {
	if l.publishedReset == nil {
		return false
	}
	r, ok := l.publishedReset(ctx, d.id)
	if !ok {
		return false
	}
	moved, err := l.hooks.raiseEpoch(d, r.Epoch, "the operator's fence reset in etcd "+r.ID, true)
	if err != nil {
		l.stats.outboxErr.Add(1)
		l.log.Error("fence reset found, but the device's new epoch cannot be recorded durably; device still refused", "device", d.id, "err", err)
		return false
	}
	if !moved {
		return false // an older reset, or one the agent knew: not the refusal's business
	}
	d.mu.Lock()
	d.fenceMark = r.Token
	d.mu.Unlock()
	l.stats.resets.Add(1)
	l.log.Warn("fence reset found in etcd: the device is in the reset's epoch", "device", d.id, "token", token, "epoch", r.Epoch,
		"mark", r.Mark().String(), "id", r.ID, "holder", l.gateway)
	return true
}

// fenceReset records that d's fence point was reset to m.
func (l *leases) fenceReset(d *device, m fence.Mark, id string) {
	d.mu.Lock()
	was := d.fenceMark
	d.fenceMark = m.Token
	ctl := d.ctl
	d.mu.Unlock()
	l.stats.resets.Add(1)
	l.log.Warn("fence reset by the operator", "device", d.id, "fence_token", m.Token, "mark", m.String(), "was", was, "id", id,
		"holder", l.gateway)
	// Spent: every seq of the token is at or below the mark.
	if ctl == nil || ctl.token > m.Token || ctl.token == m.Token && m.Seq < math.MaxUint64 {
		return
	}
	if ctl.lost.Swap(true) {
		return // another verdict, or the session's end, came first
	}
	l.setStateReason(d, ctl, StateLost, fmt.Sprintf("fence reset to %s: our token %d is not above it; campaigning again", m, ctl.token))
	l.recampaign(d, ctl.token, ctl.key, ctl.lease, false)
}
