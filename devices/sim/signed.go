package sim

import (
	"strings"
	"sync/atomic"
	"unicode/utf8"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// A device with a key of its own (FleetConfig.Signers,
// FirmwareConfig.Signer) speaks for itself (invariant I7): its acks are
// signed acks (auth.Signer.SignAck), its state reports signed reports
// binding the device, its fence mark after the command and a counter
// (auth.StateReport). The counter starts at the process's start time in
// nanoseconds and grows by one per report, so it only grows across
// restarts too (with a clock that does not go back), and a replayed old
// report is never newer than the last one.

// encodeAck returns a as the device sends it: signed if it has a key.
func (f *Fleet) encodeAck(device string, a *fence.Ack) ([]byte, error) {
	return signAck(f.signers[device], a)
}

// encodeState returns st as the device reports it under fence state m:
// signed if it has a key.
func (f *Fleet) encodeState(device string, m fence.State, st State) ([]byte, error) {
	raw, err := MarshalState(st)
	if err != nil {
		return nil, err
	}
	return signState(f.signers[device], &f.reports, device, m, raw)
}

// signAck encodes a, signed by s if s is not nil.
func signAck(s *auth.Signer, a *fence.Ack) ([]byte, error) {
	if s != nil {
		return s.SignAck(a)
	}
	return fence.MarshalAck(a)
}

// signState returns the state report raw of device under fence state m:
// signed by s (with the next value of counter) if s is not nil, else raw.
func signState(s *auth.Signer, counter *atomic.Uint64, device string, m fence.State, raw []byte) ([]byte, error) {
	if s == nil {
		return raw, nil
	}
	return s.SignState(&auth.StateReport{Device: device, Token: m.Mark.Token, Seq: m.Mark.Seq, Epoch: m.Epoch, Counter: counter.Add(1), State: raw})
}

// ackTopic returns the topic a device acks a command on: its ack topic, or
// the command's response topic rt if responseTopicOK; refused says rt was
// set and refused.
func ackTopic(topics mqtt.Topics, device, rt string) (topic string, refused bool) {
	if rt == "" {
		return topics.Ack(device), false
	}
	if responseTopicOK(topics, device, rt) {
		return rt, false
	}
	return topics.Ack(device), true
}

// responseTopicOK refuses response topics that are not plain topic names or
// that point into the devices' own tree anywhere but this device's ack
// topic: a command must not make a device publish onto another device's
// command or state topic.
func responseTopicOK(topics mqtt.Topics, device, rt string) bool {
	if len(rt) > 65535 || !utf8.ValidString(rt) || strings.ContainsAny(rt, "+#\x00") || strings.HasPrefix(rt, "$") {
		return false
	}
	if d, leaf, ok := topics.Parse(rt); ok {
		return d == device && leaf == mqtt.LeafAck
	}
	return !strings.HasPrefix(rt, strings.TrimSuffix(topics.Cmd("x"), "x/cmd")) // <prefix>/dev/
}
