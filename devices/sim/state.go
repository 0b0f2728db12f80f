package sim

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"

	"github.com/fxamacker/cbor/v2"
	"go.etcd.io/bbolt"

	"github.com/edgefence/edgefence/devices/shim"
	"github.com/edgefence/edgefence/fence"
)

// Command kinds a Thermostat understands.
const (
	KindSet  = "set"
	KindPing = "ping"
	// KindTwinSet is the command the agent's twin reconciler sends: its
	// body is a twin delta, a CBOR map of the fields to change.
	KindTwinSet = "twin.set"
)

// TwinFields are the fields a twin.set body may name.
var TwinFields = []string{"setpoint", "mode", "relay"}

// Setpoint bounds accepted by a set command.
const (
	MinSetpoint = -50.0
	MaxSetpoint = 150.0
)

// Modes a Thermostat can be in.
var Modes = []string{"off", "heat", "cool", "auto"}

// State is one simulated device's state. It is encoded as a CBOR map with
// these text keys (on the state topic and in the database) and as JSON with
// the same names (in the verdict log).
type State struct {
	Setpoint float64 `json:"setpoint" cbor:"setpoint"`
	Mode     string  `json:"mode" cbor:"mode"`
	Relay    bool    `json:"relay" cbor:"relay"`

	Applied   uint64      `json:"applied" cbor:"applied"`       // commands applied so far
	LastToken fence.Token `json:"last_token" cbor:"last_token"` // last applied command
	LastSeq   uint64      `json:"last_seq" cbor:"last_seq"`
	LastID    string      `json:"last_id" cbor:"last_id"`
}

// InitialState is the state of a device that has applied nothing.
func InitialState() State { return State{Setpoint: 20, Mode: "off"} }

// SetBody is the body of a set command. Nil fields are left unchanged.
type SetBody struct {
	Setpoint *float64 `cbor:"setpoint,omitempty"`
	Mode     *string  `cbor:"mode,omitempty"`
	Relay    *bool    `cbor:"relay,omitempty"`
}

// Encode encodes b as an envelope body.
func (b SetBody) Encode() (cbor.RawMessage, error) { return fence.EncodeBody(b) }

// ErrCommand means a command is not one a Thermostat accepts. It is wrapped
// in the Invalid ack's reason.
var ErrCommand = errors.New("sim: bad command")

// stateBucket holds one CBOR State per device id, beside the shim's marks.
var stateBucket = []byte("sim.state")

var stateEnc, stateDec = func() (cbor.EncMode, cbor.DecMode) {
	enc, err := cbor.CoreDetEncOptions().EncMode()
	if err != nil {
		panic(err)
	}
	dec, err := cbor.DecOptions{
		DupMapKey:   cbor.DupMapKeyEnforcedAPF,
		IndefLength: cbor.IndefLengthForbidden,
		TagsMd:      cbor.TagsForbidden,
		UTF8:        cbor.UTF8RejectInvalid,
		MaxMapPairs: 64,
	}.DecMode()
	if err != nil {
		panic(err)
	}
	return enc, dec
}()

// MarshalState encodes s as published on the state topic.
func MarshalState(s State) ([]byte, error) { return stateEnc.Marshal(s) }

// UnmarshalState decodes a state published on the state topic.
func UnmarshalState(b []byte) (State, error) {
	var s State
	if err := stateDec.Unmarshal(b, &s); err != nil {
		return State{}, fmt.Errorf("sim: decode state: %w", err)
	}
	return s, nil
}

// Thermostat is the simulated device model, one value for any number of
// devices (the envelope names the device). It implements shim.Device and
// shim.TxApplier.
type Thermostat struct{}

var (
	_ shim.Device    = Thermostat{}
	_ shim.TxApplier = Thermostat{}
)

// Check validates a command without side effects.
func (Thermostat) Check(env *fence.Envelope) error {
	_, err := parse(env)
	return err
}

// Apply is never called by the shim for a TxApplier; it refuses.
func (Thermostat) Apply(*fence.Envelope) error {
	return errors.New("sim: Thermostat applies only inside the shim's transaction")
}

// ApplyTx applies the command to the device's stored state, in the shim's
// write transaction.
func (Thermostat) ApplyTx(tx *bbolt.Tx, env *fence.Envelope) error {
	set, err := parse(env)
	if err != nil {
		return err
	}
	b, err := tx.CreateBucketIfNotExists(stateBucket)
	if err != nil {
		return err
	}
	s, err := getState(b, env.Device)
	if err != nil {
		return err
	}
	if set.Setpoint != nil {
		s.Setpoint = *set.Setpoint
	}
	if set.Mode != nil {
		s.Mode = *set.Mode
	}
	if set.Relay != nil {
		s.Relay = *set.Relay
	}
	s.Applied++
	s.LastToken, s.LastSeq, s.LastID = env.Token, env.Seq, env.ID
	v, err := MarshalState(s)
	if err != nil {
		return err
	}
	return b.Put([]byte(env.Device), v)
}

// parse validates a command and returns its changes (none for ping).
func parse(env *fence.Envelope) (SetBody, error) {
	switch env.Kind {
	case KindPing:
		if len(env.Body) != 0 && !(len(env.Body) == 1 && env.Body[0] == 0xf6) { // absent or null
			return SetBody{}, fmt.Errorf("%w: ping takes no body", ErrCommand)
		}
		return SetBody{}, nil
	case KindSet:
	case KindTwinSet:
		return parseTwinSet(env)
	default:
		return SetBody{}, fmt.Errorf("%w: unknown kind %q (want %q, %q or %q)", ErrCommand, env.Kind, KindSet, KindTwinSet, KindPing)
	}
	if len(env.Body) == 0 {
		return SetBody{}, fmt.Errorf("%w: set needs a body", ErrCommand)
	}
	var set SetBody
	if err := fence.DecodeBody(env.Body, &set); err != nil {
		if _, ok := errors.AsType[*fence.UnknownFieldError](err); ok {
			return SetBody{}, fmt.Errorf("%w: set: %w (a thermostat has %q)", ErrCommand, err, TwinFields)
		}
		return SetBody{}, fmt.Errorf("%w: set body: %w", ErrCommand, err)
	}
	return checkSet(set)
}

// parseTwinSet validates a twin.set body: a CBOR map naming only fields in
// TwinFields (anything else is refused, naming the field), with the values
// a set command takes.
func parseTwinSet(env *fence.Envelope) (SetBody, error) {
	if len(env.Body) == 0 {
		return SetBody{}, fmt.Errorf("%w: twin.set needs a body (a map of fields)", ErrCommand)
	}
	var m map[string]any
	if err := fence.DecodeBody(env.Body, &m); err != nil {
		return SetBody{}, fmt.Errorf("%w: twin.set body is not a map with text keys: %w", ErrCommand, err)
	}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if !slices.Contains(TwinFields, k) {
			return SetBody{}, fmt.Errorf("%w: twin.set: unknown field %q (a thermostat has %q)", ErrCommand, k, TwinFields)
		}
	}
	var set SetBody
	if err := fence.DecodeBody(env.Body, &set); err != nil {
		return SetBody{}, fmt.Errorf("%w: twin.set body: %w", ErrCommand, err)
	}
	return checkSet(set)
}

// checkSet validates the changes of a set or twin.set command.
func checkSet(set SetBody) (SetBody, error) {
	if set.Setpoint == nil && set.Mode == nil && set.Relay == nil {
		return SetBody{}, fmt.Errorf("%w: set changes nothing (want setpoint, mode or relay)", ErrCommand)
	}
	if sp := set.Setpoint; sp != nil && (math.IsNaN(*sp) || *sp < MinSetpoint || *sp > MaxSetpoint) {
		return SetBody{}, fmt.Errorf("%w: setpoint %v outside %v..%v", ErrCommand, *sp, MinSetpoint, MaxSetpoint)
	}
	if m := set.Mode; m != nil && !slices.Contains(Modes, *m) {
		return SetBody{}, fmt.Errorf("%w: mode %q not one of %q", ErrCommand, *m, Modes)
	}
	return set, nil
}

func getState(b *bbolt.Bucket, device string) (State, error) {
	if b == nil {
		return InitialState(), nil
	}
	v := b.Get([]byte(device))
	if v == nil {
		return InitialState(), nil
	}
	s, err := UnmarshalState(v)
	if err != nil {
		return State{}, fmt.Errorf("%w: device %s: %w", shim.ErrStorage, device, err)
	}
	return s, nil
}

// readState reads a device's state through its fence point.
func readState(s fencePoint, device string) (State, error) {
	var st State
	err := s.View(func(tx *bbolt.Tx) error {
		var err error
		st, err = getState(tx.Bucket(stateBucket), device)
		return err
	})
	return st, err
}
