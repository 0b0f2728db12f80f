package auth

import (
	"fmt"

	"github.com/fxamacker/cbor/v2"
	"github.com/veraison/go-cose"

	"github.com/edgefence/edgefence/fence"
)

// A signed state report is a COSE_Sign1 (ES256, the device key's kid
// protected) with the protected content type ContentState and a
// StateReport as payload (deterministic CBOR, small integer keys): the
// device, its fence mark (and epoch) when it reported, a counter, and the
// state (a CBOR map). The epoch, mark and counter order a device's reports:
// the receiver keeps the newest (epoch, mark, counter) it accepted per
// device and refuses any report not after it, so an old report replayed
// cannot roll the twin back, not even after a reset lowered the mark. The counter only has to grow between reports under one mark: a
// device with a clock may use the time, one without keeps a counter in
// flash.

// ContentState is the protected content type of a signed state report.
const ContentState = "application/edgefence-state+cbor"

// MaxStateSize bounds the state a report carries, and MaxSignedStateSize
// a signed report (the state, its fields, COSE): a report fits the MQTT
// packet limit as a command does (mqtt.LargestPacket).
const (
	MaxStateSize       = fence.MaxEnvelopeSize
	MaxSignedStateSize = MaxStateSize + fence.MaxAuthSize
)

// StateReport is a device's signed statement of its state.
type StateReport struct {
	Device  string          `cbor:"1,keyasint"`
	Token   fence.Token     `cbor:"2,keyasint"` // the device's fence mark when it reported (0: none yet)
	Seq     uint64          `cbor:"3,keyasint"`
	Counter uint64          `cbor:"4,keyasint"` // grows with every report under one mark
	State   cbor.RawMessage `cbor:"5,keyasint"` // a CBOR map
	// Epoch is the device's epoch when it reported (0: none yet; omitted
	// then): marks of different epochs say nothing of each other.
	Epoch uint64 `cbor:"6,keyasint,omitempty"`
}

// Mark returns the fence mark the report was made under.
func (r *StateReport) Mark() fence.Mark { return fence.Mark{Token: r.Token, Seq: r.Seq} }

// FenceState returns the fence state (epoch and mark) the report was made
// under.
func (r *StateReport) FenceState() fence.State { return fence.State{Epoch: r.Epoch, Mark: r.Mark()} }

// After reports whether r is newer than prev: a higher epoch, or the same
// epoch and a higher mark, or the same mark and a higher counter.
func (r *StateReport) After(prev *StateReport) bool {
	if r.Epoch != prev.Epoch {
		return r.Epoch > prev.Epoch
	}
	if r.Token != prev.Token {
		return r.Token > prev.Token
	}
	if r.Seq != prev.Seq {
		return r.Seq > prev.Seq
	}
	return r.Counter > prev.Counter
}

func (r *StateReport) validate() error {
	if err := fence.ValidateDeviceID(r.Device); err != nil {
		return err
	}
	if len(r.State) == 0 || r.State[0]>>5 != 5 { // major type 5: a map
		return fmt.Errorf("state: want a CBOR map")
	}
	if len(r.State) > MaxStateSize {
		return fmt.Errorf("state of %d bytes, limit %d", len(r.State), MaxStateSize)
	}
	return nil
}

var stateDec = func() cbor.DecMode {
	m, err := cbor.DecOptions{
		DupMapKey:         cbor.DupMapKeyEnforcedAPF,
		IndefLength:       cbor.IndefLengthForbidden,
		TagsMd:            cbor.TagsForbidden,
		MaxNestedLevels:   32,
		ExtraReturnErrors: cbor.ExtraDecErrorUnknownField,
	}.DecMode()
	if err != nil {
		panic(err) // static options
	}
	return m
}()

// SignState returns r as a signed state report.
func (s *Signer) SignState(r *StateReport) ([]byte, error) {
	if err := r.validate(); err != nil {
		return nil, fmt.Errorf("auth: state report: %w", err)
	}
	payload, err := trustEnc.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("auth: state report: %w", err)
	}
	return s.signContent(ContentState, payload)
}

// VerifiedState is what VerifyState learned: the report and who signed it.
type VerifiedState struct {
	Report *StateReport
	KeyID  []byte
}

// UnverifiedState decodes raw, a signed state report, without checking
// its signature: nothing in it may be acted on. It serves a receiver that
// decides from the fields whether the report is worth a verify at all;
// what it then uses must come from VerifyState.
func UnverifiedState(raw []byte) (*StateReport, error) {
	_, _, r, err := openState(raw)
	return r, err
}

// openState decodes raw, a signed state report, and validates the report;
// its signature is not checked.
func openState(raw []byte) (*cose.Sign1Message, []byte, *StateReport, error) {
	msg, kid, err := openContent(raw, ContentState, MaxSignedStateSize)
	if err != nil {
		return nil, nil, nil, err
	}
	var r StateReport
	if err := stateDec.Unmarshal(msg.Payload, &r); err != nil {
		return nil, nil, nil, refuse(ErrMalformed, "state report payload: %v", err)
	}
	if err := r.validate(); err != nil {
		return nil, nil, nil, refuse(ErrMalformed, "state report: %v", err)
	}
	return msg, kid, &r, nil
}

// VerifyState checks raw, a signed state report, against keys: a key that
// may speak for the device it names must have signed it. Every refusal
// wraps fence.ErrInvalid and one of this package's sentinels. Whether it
// is newer than the last one accepted (StateReport.After) is the caller's
// to check.
func VerifyState(raw []byte, keys DeviceKeys) (*VerifiedState, error) {
	msg, kid, r, err := openState(raw)
	if err != nil {
		return nil, err
	}
	if err := checkSignature(msg, kid, r.Device, keys.DeviceKey, "state report"); err != nil {
		return nil, err
	}
	return &VerifiedState{Report: r, KeyID: kid}, nil
}
