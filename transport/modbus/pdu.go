package modbus

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Modbus function codes this package speaks.
const (
	FuncReadCoils     byte = 0x01
	FuncReadDiscrete  byte = 0x02
	FuncReadHolding   byte = 0x03
	FuncReadInput     byte = 0x04
	FuncWriteCoil     byte = 0x05
	FuncWriteSingle   byte = 0x06
	FuncWriteCoils    byte = 0x0F
	FuncWriteMultiple byte = 0x10
	ExceptionFlag     byte = 0x80 // set in a response's function code: an exception
	MaxReadRegisters       = 125  // Modbus application protocol v1.1b3, 6.3
	MaxWriteRegisters      = 123  // 6.12
	maxPDU                 = 253
)

// Modbus exception codes.
const (
	ExIllegalFunction byte = 0x01
	ExIllegalAddress  byte = 0x02
	ExIllegalValue    byte = 0x03
	ExDeviceFailure   byte = 0x04
)

// Sentinel errors.
var (
	// ErrPDU means a PDU is malformed: wrong length, unknown function,
	// counts out of range.
	ErrPDU = errors.New("modbus: malformed PDU")
	// ErrException means the device answered with a Modbus exception.
	ErrException = errors.New("modbus: device exception")
)

// Request is one Modbus request.
type Request struct {
	Func   byte
	Addr   uint16
	Count  uint16   // read: registers to read
	Values []uint16 // write: values (one for FuncWriteSingle)
}

// Response is one Modbus response: Values for a read, or an exception.
type Response struct {
	Func      byte // the request's function code (without the exception flag)
	Exception byte // 0 if none
	Addr      uint16
	Count     uint16
	Values    []uint16
}

// Err returns an error wrapping ErrException if the response is an exception.
func (r *Response) Err() error {
	if r.Exception == 0 {
		return nil
	}
	return fmt.Errorf("%w: function 0x%02x, exception 0x%02x", ErrException, r.Func, r.Exception)
}

// Validate checks counts and ranges.
func (q *Request) Validate() error {
	switch q.Func {
	case FuncReadHolding:
		if q.Count < 1 || q.Count > MaxReadRegisters {
			return fmt.Errorf("%w: read count %d not in 1..%d", ErrPDU, q.Count, MaxReadRegisters)
		}
	case FuncWriteSingle:
		if len(q.Values) != 1 {
			return fmt.Errorf("%w: write single needs one value, got %d", ErrPDU, len(q.Values))
		}
	case FuncWriteMultiple:
		if len(q.Values) < 1 || len(q.Values) > MaxWriteRegisters {
			return fmt.Errorf("%w: write count %d not in 1..%d", ErrPDU, len(q.Values), MaxWriteRegisters)
		}
	default:
		return fmt.Errorf("%w: function 0x%02x", ErrPDU, q.Func)
	}
	if int(q.Addr)+int(q.Span()) > 1<<16 {
		return fmt.Errorf("%w: registers %d+%d beyond the address space", ErrPDU, q.Addr, q.Span())
	}
	return nil
}

// Span is how many registers q reads or writes.
func (q *Request) Span() uint16 {
	if q.Func == FuncReadHolding {
		return q.Count
	}
	return uint16(len(q.Values))
}

// Encode returns the request PDU.
func (q *Request) Encode() ([]byte, error) {
	if err := q.Validate(); err != nil {
		return nil, err
	}
	b := []byte{q.Func}
	b = binary.BigEndian.AppendUint16(b, q.Addr)
	switch q.Func {
	case FuncReadHolding:
		b = binary.BigEndian.AppendUint16(b, q.Count)
	case FuncWriteSingle:
		b = binary.BigEndian.AppendUint16(b, q.Values[0])
	case FuncWriteMultiple:
		b = binary.BigEndian.AppendUint16(b, uint16(len(q.Values)))
		b = append(b, byte(2*len(q.Values)))
		for _, v := range q.Values {
			b = binary.BigEndian.AppendUint16(b, v)
		}
	}
	return b, nil
}

// DecodeRequest parses a request PDU. Errors wrap ErrPDU; an unknown
// function code is reported so the device can answer ExIllegalFunction.
func DecodeRequest(b []byte) (*Request, error) {
	if len(b) < 5 || len(b) > maxPDU {
		return nil, fmt.Errorf("%w: request of %d bytes", ErrPDU, len(b))
	}
	q := &Request{Func: b[0], Addr: binary.BigEndian.Uint16(b[1:3])}
	switch q.Func {
	case FuncReadHolding:
		if len(b) != 5 {
			return nil, fmt.Errorf("%w: read request of %d bytes, want 5", ErrPDU, len(b))
		}
		q.Count = binary.BigEndian.Uint16(b[3:5])
	case FuncWriteSingle:
		if len(b) != 5 {
			return nil, fmt.Errorf("%w: write single of %d bytes, want 5", ErrPDU, len(b))
		}
		q.Values = []uint16{binary.BigEndian.Uint16(b[3:5])}
	case FuncWriteMultiple:
		if len(b) < 6 {
			return nil, fmt.Errorf("%w: write multiple of %d bytes", ErrPDU, len(b))
		}
		n := int(binary.BigEndian.Uint16(b[3:5]))
		if int(b[5]) != 2*n || len(b) != 6+2*n {
			return nil, fmt.Errorf("%w: write multiple: %d registers, byte count %d, %d bytes", ErrPDU, n, b[5], len(b))
		}
		q.Values = make([]uint16, n)
		for i := range q.Values {
			q.Values[i] = binary.BigEndian.Uint16(b[6+2*i:])
		}
	default:
		return q, fmt.Errorf("%w: function 0x%02x", ErrPDU, q.Func)
	}
	return q, q.Validate()
}

// Encode returns the response PDU.
func (r *Response) Encode() []byte {
	if r.Exception != 0 {
		return []byte{r.Func | ExceptionFlag, r.Exception}
	}
	b := []byte{r.Func}
	switch r.Func {
	case FuncReadHolding:
		b = append(b, byte(2*len(r.Values)))
		for _, v := range r.Values {
			b = binary.BigEndian.AppendUint16(b, v)
		}
	case FuncWriteSingle:
		b = binary.BigEndian.AppendUint16(b, r.Addr)
		b = binary.BigEndian.AppendUint16(b, r.Values[0])
	case FuncWriteMultiple:
		b = binary.BigEndian.AppendUint16(b, r.Addr)
		b = binary.BigEndian.AppendUint16(b, r.Count)
	}
	return b
}

// DecodeResponse parses a response PDU to req. Errors wrap ErrPDU; an
// exception response decodes without error (see Response.Err).
func DecodeResponse(req *Request, b []byte) (*Response, error) {
	if len(b) < 2 || len(b) > maxPDU {
		return nil, fmt.Errorf("%w: response of %d bytes", ErrPDU, len(b))
	}
	if b[0] == req.Func|ExceptionFlag {
		if len(b) != 2 {
			return nil, fmt.Errorf("%w: exception response of %d bytes", ErrPDU, len(b))
		}
		return &Response{Func: req.Func, Exception: b[1]}, nil
	}
	if b[0] != req.Func {
		return nil, fmt.Errorf("%w: response function 0x%02x to request 0x%02x", ErrPDU, b[0], req.Func)
	}
	r := &Response{Func: req.Func}
	switch req.Func {
	case FuncReadHolding:
		n := int(b[1])
		if n != 2*int(req.Count) || len(b) != 2+n {
			return nil, fmt.Errorf("%w: read response with %d bytes for %d registers", ErrPDU, n, req.Count)
		}
		r.Addr, r.Count = req.Addr, req.Count
		r.Values = make([]uint16, req.Count)
		for i := range r.Values {
			r.Values[i] = binary.BigEndian.Uint16(b[2+2*i:])
		}
	case FuncWriteSingle, FuncWriteMultiple:
		if len(b) != 5 {
			return nil, fmt.Errorf("%w: write response of %d bytes", ErrPDU, len(b))
		}
		r.Addr = binary.BigEndian.Uint16(b[1:3])
		second := binary.BigEndian.Uint16(b[3:5])
		if req.Func == FuncWriteSingle {
			r.Values = []uint16{second}
			if r.Addr != req.Addr || second != req.Values[0] {
				return nil, fmt.Errorf("%w: write single echo %d=%d, sent %d=%d", ErrPDU, r.Addr, second, req.Addr, req.Values[0])
			}
		} else {
			r.Count = second
			if r.Addr != req.Addr || int(second) != len(req.Values) {
				return nil, fmt.Errorf("%w: write multiple echo %d+%d, sent %d+%d", ErrPDU, r.Addr, second, req.Addr, len(req.Values))
			}
		}
	}
	return r, nil
}
