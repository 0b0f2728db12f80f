package sim

import (
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
)

// A device with a key of its own (FleetConfig.Signers) speaks for itself
// (invariant I7): its acks are signed acks (auth.Signer.SignAck), its
// state reports signed reports binding the device, its fence mark after
// the command and a counter (auth.StateReport). The counter starts at the
// fleet's start time in nanoseconds and grows by one per report, so it
// only grows across restarts too (with a clock that does not go back),
// and a replayed old report is never newer than the last one.

// encodeAck returns a as the device sends it: signed if it has a key.
func (f *Fleet) encodeAck(device string, a *fence.Ack) ([]byte, error) {
	if s := f.signers[device]; s != nil {
		return s.SignAck(a)
	}
	return fence.MarshalAck(a)
}

// encodeState returns st as the device reports it under mark m: signed if
// it has a key.
func (f *Fleet) encodeState(device string, m fence.Mark, st State) ([]byte, error) {
	raw, err := MarshalState(st)
	if err != nil {
		return nil, err
	}
	s := f.signers[device]
	if s == nil {
		return raw, nil
	}
	return s.SignState(&auth.StateReport{Device: device, Token: m.Token, Seq: m.Seq, Counter: f.reports.Add(1), State: raw})
}
