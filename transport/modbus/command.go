package modbus

import (
	"fmt"

	"github.com/edgefence/edgefence/fence"
)

// Command kinds a legacy register device accepts through the fence.
const (
	KindWriteRegister  = "write_register"
	KindWriteRegisters = "write_registers"
	KindReadRegisters  = "read_registers"
)

type writeBody struct {
	Addr   *uint16  `cbor:"addr"`
	Value  *uint16  `cbor:"value"`
	Values []uint16 `cbor:"values"`
	Count  *uint16  `cbor:"count"`
}

// CommandPDU turns a fenced envelope into the Modbus request the gateway
// sends once the fence table admitted it. Errors wrap fence.ErrInvalid, so
// the gateway answers them with an Invalid ack before anything reaches the
// table or the wire.
func CommandPDU(env *fence.Envelope) (*Request, error) {
	var b writeBody
	if len(env.Body) == 0 {
		return nil, fmt.Errorf("%w: %s needs a body", fence.ErrInvalid, env.Kind)
	}
	if err := fence.DecodeBody(env.Body, &b); err != nil {
		return nil, err
	}
	if b.Addr == nil {
		return nil, fmt.Errorf("%w: %s: addr required", fence.ErrInvalid, env.Kind)
	}
	var q Request
	switch env.Kind {
	case KindWriteRegister:
		if b.Value == nil || b.Values != nil || b.Count != nil {
			return nil, fmt.Errorf("%w: %s takes addr and value", fence.ErrInvalid, env.Kind)
		}
		q = Request{Func: FuncWriteSingle, Addr: *b.Addr, Values: []uint16{*b.Value}}
	case KindWriteRegisters:
		if b.Values == nil || b.Value != nil || b.Count != nil {
			return nil, fmt.Errorf("%w: %s takes addr and values", fence.ErrInvalid, env.Kind)
		}
		q = Request{Func: FuncWriteMultiple, Addr: *b.Addr, Values: b.Values}
	case KindReadRegisters:
		if b.Count == nil || b.Value != nil || b.Values != nil {
			return nil, fmt.Errorf("%w: %s takes addr and count", fence.ErrInvalid, env.Kind)
		}
		q = Request{Func: FuncReadHolding, Addr: *b.Addr, Count: *b.Count}
	default:
		return nil, fmt.Errorf("%w: kind %q is not one of %s, %s, %s", fence.ErrInvalid, env.Kind,
			KindWriteRegister, KindWriteRegisters, KindReadRegisters)
	}
	if err := q.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", fence.ErrInvalid, err)
	}
	return &q, nil
}
