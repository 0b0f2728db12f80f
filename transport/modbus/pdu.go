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
	MaxReadBits            = 2000 // 6.1, 6.2
	MaxWriteCoils          = 1968 // 6.11
	maxPDU                 = 253
)

// On the wire, a single coil's value (6.5).
const (
	coilOn  uint16 = 0xFF00
	coilOff uint16 = 0x0000
)

// Sentinel errors.
var (
	// ErrPDU means a PDU is malformed: wrong length, unknown function,
	// counts out of range.
	ErrPDU = errors.New("modbus: malformed PDU")
	// ErrException means the device answered with a Modbus exception; the
	// error is an *ExceptionError naming it.
	ErrException = errors.New("modbus: device exception")
)

// Request is one Modbus request. Reads (0x01, 0x02, 0x03, 0x04) use Count;
// writes use Values: registers, or coils as 0 and 1 (one value for 0x05 and
// 0x06).
type Request struct {
	Func   byte
	Addr   uint16
	Count  uint16   // read: registers or bits to read
	Values []uint16 // write: values (one for FuncWriteSingle and FuncWriteCoil)
}

// Response is one Modbus response: Values for a read (bits as 0 and 1), the
// echo of a write, or an exception.
type Response struct {
	Func      byte // the request's function code (without the exception flag)
	Exception byte // 0 if none
	Addr      uint16
	Count     uint16
	Values    []uint16
}

// Err returns nil, or an *ExceptionError if the response is an exception.
func (r *Response) Err() error {
	if r.Exception == 0 {
		return nil
	}
	return &ExceptionError{Func: r.Func, Code: r.Exception}
}

// IsWrite reports whether q changes the device's state.
func (q *Request) IsWrite() bool {
	switch q.Func {
	case FuncWriteCoil, FuncWriteSingle, FuncWriteCoils, FuncWriteMultiple:
		return true
	}
	return false
}

// isBits reports whether function f reads or writes coils or discrete
// inputs (bits) rather than registers.
func isBits(f byte) bool {
	return f == FuncReadCoils || f == FuncReadDiscrete || f == FuncWriteCoil || f == FuncWriteCoils
}

// isRead reports whether function f is one of the four reads.
func isRead(f byte) bool {
	return f == FuncReadCoils || f == FuncReadDiscrete || f == FuncReadHolding || f == FuncReadInput
}

// Validate checks counts, values and ranges.
func (q *Request) Validate() error {
	n, lo, hi := len(q.Values), 1, 0
	switch q.Func {
	case FuncReadCoils, FuncReadDiscrete:
		n, hi = int(q.Count), MaxReadBits
	case FuncReadHolding, FuncReadInput:
		n, hi = int(q.Count), MaxReadRegisters
	case FuncWriteSingle, FuncWriteCoil:
		lo, hi = 1, 1
	case FuncWriteMultiple:
		hi = MaxWriteRegisters
	case FuncWriteCoils:
		hi = MaxWriteCoils
	default:
		return fmt.Errorf("%w: function 0x%02x", ErrPDU, q.Func)
	}
	if n < lo || n > hi {
		return fmt.Errorf("%w: function 0x%02x: count %d not in %d..%d", ErrPDU, q.Func, n, lo, hi)
	}
	if isBits(q.Func) && q.IsWrite() {
		for i, v := range q.Values {
			if v > 1 {
				return fmt.Errorf("%w: coil value %d at %d: want 0 or 1", ErrPDU, v, i)
			}
		}
	}
	if int(q.Addr)+int(q.Span()) > 1<<16 {
		return fmt.Errorf("%w: items %d+%d beyond the address space", ErrPDU, q.Addr, q.Span())
	}
	return nil
}

// Span is how many registers or bits q reads or writes.
func (q *Request) Span() uint16 {
	if isRead(q.Func) {
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
	case FuncReadCoils, FuncReadDiscrete, FuncReadHolding, FuncReadInput:
		b = binary.BigEndian.AppendUint16(b, q.Count)
	case FuncWriteSingle:
		b = binary.BigEndian.AppendUint16(b, q.Values[0])
	case FuncWriteCoil:
		b = binary.BigEndian.AppendUint16(b, coilWord(q.Values[0]))
	case FuncWriteMultiple:
		b = binary.BigEndian.AppendUint16(b, uint16(len(q.Values)))
		b = appendRegisters(b, q.Values)
	case FuncWriteCoils:
		b = binary.BigEndian.AppendUint16(b, uint16(len(q.Values)))
		b = appendBits(b, q.Values)
	}
	return b, nil
}

func coilWord(v uint16) uint16 {
	if v != 0 {
		return coilOn
	}
	return coilOff
}

// appendRegisters appends a byte count and the registers, big-endian.
func appendRegisters(b []byte, vals []uint16) []byte {
	b = append(b, byte(2*len(vals)))
	for _, v := range vals {
		b = binary.BigEndian.AppendUint16(b, v)
	}
	return b
}

// appendBits appends a byte count and the bits packed eight to a byte,
// the first in the lowest bit, the last byte padded with zeros (6.1).
func appendBits(b []byte, bits []uint16) []byte {
	packed := make([]byte, (len(bits)+7)/8)
	for i, v := range bits {
		if v != 0 {
			packed[i/8] |= 1 << (i % 8)
		}
	}
	b = append(b, byte(len(packed)))
	return append(b, packed...)
}

// unpackBits returns the first n bits of packed as 0 and 1, and whether the
// padding bits after them are all zero.
func unpackBits(packed []byte, n int) ([]uint16, bool) {
	out := make([]uint16, n)
	for i := range out {
		out[i] = uint16(packed[i/8]>>(i%8)) & 1
	}
	padded := n%8 == 0 || packed[len(packed)-1]>>(n%8) == 0
	return out, padded
}

func registers(b []byte, n int) []uint16 {
	out := make([]uint16, n)
	for i := range out {
		out[i] = binary.BigEndian.Uint16(b[2*i:])
	}
	return out
}

// DecodeRequest parses a request PDU. Errors wrap ErrPDU; an unknown
// function code is reported so the device can answer ExIllegalFunction.
func DecodeRequest(b []byte) (*Request, error) {
	if len(b) < 5 || len(b) > maxPDU {
		return nil, fmt.Errorf("%w: request of %d bytes", ErrPDU, len(b))
	}
	q := &Request{Func: b[0], Addr: binary.BigEndian.Uint16(b[1:3])}
	second := binary.BigEndian.Uint16(b[3:5])
	switch q.Func {
	case FuncReadCoils, FuncReadDiscrete, FuncReadHolding, FuncReadInput, FuncWriteSingle, FuncWriteCoil:
		if len(b) != 5 {
			return nil, fmt.Errorf("%w: function 0x%02x: request of %d bytes, want 5", ErrPDU, q.Func, len(b))
		}
		switch q.Func {
		case FuncWriteSingle:
			q.Values = []uint16{second}
		case FuncWriteCoil:
			if second != coilOn && second != coilOff {
				return nil, fmt.Errorf("%w: write coil value 0x%04x, want 0xff00 or 0x0000", ErrPDU, second)
			}
			q.Values = []uint16{second >> 15}
		default:
			q.Count = second
		}
	case FuncWriteMultiple, FuncWriteCoils:
		if len(b) < 6 {
			return nil, fmt.Errorf("%w: function 0x%02x: request of %d bytes", ErrPDU, q.Func, len(b))
		}
		n, want := int(second), 2*int(second)
		if q.Func == FuncWriteCoils {
			want = (n + 7) / 8
		}
		if int(b[5]) != want || len(b) != 6+want || n == 0 {
			return nil, fmt.Errorf("%w: function 0x%02x: %d items, byte count %d, %d bytes", ErrPDU, q.Func, n, b[5], len(b))
		}
		if q.Func == FuncWriteMultiple {
			q.Values = registers(b[6:], n)
		} else {
			var padded bool
			if q.Values, padded = unpackBits(b[6:], n); !padded {
				return nil, fmt.Errorf("%w: write coils: padding bits not zero", ErrPDU)
			}
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
	case FuncReadHolding, FuncReadInput:
		b = appendRegisters(b, r.Values)
	case FuncReadCoils, FuncReadDiscrete:
		b = appendBits(b, r.Values)
	case FuncWriteSingle:
		b = binary.BigEndian.AppendUint16(b, r.Addr)
		b = binary.BigEndian.AppendUint16(b, r.Values[0])
	case FuncWriteCoil:
		b = binary.BigEndian.AppendUint16(b, r.Addr)
		b = binary.BigEndian.AppendUint16(b, coilWord(r.Values[0]))
	case FuncWriteMultiple, FuncWriteCoils:
		b = binary.BigEndian.AppendUint16(b, r.Addr)
		b = binary.BigEndian.AppendUint16(b, r.Count)
	}
	return b
}

// ResponseLen is the length of the PDU that answers req without an
// exception (an exception answer is 2 bytes): what a reader of an RTU line
// uses to delimit a frame without relying on timing.
func ResponseLen(req *Request) int {
	switch req.Func {
	case FuncReadHolding, FuncReadInput:
		return 2 + 2*int(req.Count)
	case FuncReadCoils, FuncReadDiscrete:
		return 2 + (int(req.Count)+7)/8
	}
	return 5 // the writes' echo
}

// DecodeResponse parses a response PDU to req. Errors wrap ErrPDU; an
// exception response decodes without error (see Response.Err). Decoding is
// strict — the byte count must fit the request, a write's echo must match
// it — except for the padding bits of a bit read, which are ignored.
func DecodeResponse(req *Request, b []byte) (*Response, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	if len(b) < 2 || len(b) > maxPDU {
		return nil, fmt.Errorf("%w: response of %d bytes", ErrPDU, len(b))
	}
	if b[0] == req.Func|ExceptionFlag {
		if len(b) != 2 || b[1] == 0 {
			return nil, fmt.Errorf("%w: exception response % x", ErrPDU, b)
		}
		return &Response{Func: req.Func, Exception: b[1]}, nil
	}
	if b[0] != req.Func {
		return nil, fmt.Errorf("%w: response function 0x%02x to request 0x%02x", ErrPDU, b[0], req.Func)
	}
	if want := ResponseLen(req); len(b) != want || (isRead(req.Func) && int(b[1]) != want-2) {
		return nil, fmt.Errorf("%w: function 0x%02x: response of %d bytes (byte count %d) for %d items, want %d bytes",
			ErrPDU, req.Func, len(b), b[1], req.Span(), want)
	}
	r := &Response{Func: req.Func}
	if isRead(req.Func) {
		r.Addr, r.Count = req.Addr, req.Count
		if isBits(req.Func) {
			r.Values, _ = unpackBits(b[2:], int(req.Count))
		} else {
			r.Values = registers(b[2:], int(req.Count))
		}
		return r, nil
	}
	return r, decodeEcho(req, r, b)
}

// decodeEcho checks a write's 5-byte answer against the request and fills
// r with it.
func decodeEcho(req *Request, r *Response, b []byte) error {
	r.Addr = binary.BigEndian.Uint16(b[1:3])
	second := binary.BigEndian.Uint16(b[3:5])
	switch req.Func {
	case FuncWriteSingle:
		r.Values = []uint16{second}
		if r.Addr != req.Addr || second != req.Values[0] {
			return fmt.Errorf("%w: write single echo %d=%d, sent %d=%d", ErrPDU, r.Addr, second, req.Addr, req.Values[0])
		}
	case FuncWriteCoil:
		if r.Addr != req.Addr || second != coilWord(req.Values[0]) {
			return fmt.Errorf("%w: write coil echo %d=0x%04x, sent %d=0x%04x", ErrPDU, r.Addr, second, req.Addr, coilWord(req.Values[0]))
		}
		r.Values = []uint16{req.Values[0]}
	default:
		r.Count = second
		if r.Addr != req.Addr || int(second) != len(req.Values) {
			return fmt.Errorf("%w: function 0x%02x echo %d+%d, sent %d+%d", ErrPDU, req.Func, r.Addr, second, req.Addr, len(req.Values))
		}
	}
	return nil
}
