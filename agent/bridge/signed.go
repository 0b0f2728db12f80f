package bridge

import (
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
)

// The bridge's table is the fence point of its devices, so its acks are
// their acks (invariant I7): with Config.Signer (the home gateway's key,
// certified for the devices) they go out signed, as a device's own would,
// and holders verify them with auth.GatewayAcks. A read result is a state
// report: signed, it binds the device, the command's (token, seq) — the
// table's mark when it admitted the command, which only grows in a
// device's worker — and a counter that starts at the bridge's start time
// in nanoseconds, so a replayed old result is never newer.

// encodeAck returns a as the bridge publishes it: signed with a Signer.
func (b *Bridge) encodeAck(a *fence.Ack) ([]byte, error) {
	if s := b.cfg.Signer; s != nil {
		return s.SignAck(a)
	}
	return fence.MarshalAck(a)
}

// encodeRead returns r, the result of env's read, as the bridge publishes
// it on dev's state topic: signed with a Signer.
func (b *Bridge) encodeRead(dev string, env *fence.Envelope, r ReadResult) ([]byte, error) {
	raw, err := fence.EncodeBody(r)
	if err != nil || b.cfg.Signer == nil {
		return raw, err
	}
	return b.cfg.Signer.SignState(&auth.StateReport{Device: dev, Token: env.Token, Seq: env.Seq, Epoch: env.Epoch, Counter: b.reports.Add(1),
		State: raw})
}
