package legacy

import (
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/edgefence/edgefence/transport/modbus"
)

// DefaultRegisters is the size of a simulated device's register bank.
const DefaultRegisters = 256

// Applied is one line of a device's applied-writes log.
type Applied struct {
	Time   time.Time `json:"time"`
	Device string    `json:"device"`
	Addr   uint16    `json:"addr"`
	Values []uint16  `json:"values"`
}

// Registers is a simulated legacy device: a bank of holding registers that
// applies every write it is sent. It has no fence: tokens never reach it.
type Registers struct {
	id  string
	now func() time.Time

	mu     sync.Mutex
	regs   []uint16
	log    io.Writer
	writes uint64
	errs   uint64
}

// NewRegisters returns a device with n registers (DefaultRegisters if n is
// 0) logging applied writes to log (nil: none).
func NewRegisters(id string, n int, log io.Writer) *Registers {
	if n <= 0 {
		n = DefaultRegisters
	}
	if n > 1<<16 {
		n = 1 << 16
	}
	return &Registers{id: id, now: time.Now, regs: make([]uint16, n), log: log}
}

// Handle answers one request PDU with a response PDU, applying writes. Bad
// requests get Modbus exception responses, never a panic.
func (d *Registers) Handle(pdu []byte) []byte {
	q, err := modbus.DecodeRequest(pdu)
	if err != nil {
		d.mu.Lock()
		d.errs++
		d.mu.Unlock()
		fn := byte(0)
		if len(pdu) > 0 {
			fn = pdu[0] &^ modbus.ExceptionFlag
		}
		code := modbus.ExIllegalValue
		if q != nil && q.Func != modbus.FuncReadHolding && q.Func != modbus.FuncWriteSingle && q.Func != modbus.FuncWriteMultiple {
			code = modbus.ExIllegalFunction
		}
		return (&modbus.Response{Func: fn, Exception: code}).Encode()
	}
	if q.Func != modbus.FuncReadHolding && q.Func != modbus.FuncWriteSingle && q.Func != modbus.FuncWriteMultiple {
		// Coils, discrete and input registers: a holding-register device has none.
		d.mu.Lock()
		d.errs++
		d.mu.Unlock()
		return (&modbus.Response{Func: q.Func, Exception: modbus.ExIllegalFunction}).Encode()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if int(q.Addr)+int(q.Span()) > len(d.regs) {
		d.errs++
		return (&modbus.Response{Func: q.Func, Exception: modbus.ExIllegalAddress}).Encode()
	}
	switch q.Func {
	case modbus.FuncReadHolding:
		vals := append([]uint16(nil), d.regs[q.Addr:int(q.Addr)+int(q.Count)]...)
		return (&modbus.Response{Func: q.Func, Values: vals}).Encode()
	default:
		copy(d.regs[q.Addr:], q.Values)
		d.writes++
		if d.log != nil {
			line, _ := json.Marshal(Applied{Time: d.now(), Device: d.id, Addr: q.Addr, Values: q.Values})
			_, _ = d.log.Write(append(line, '\n')) // one Write per line
		}
		return (&modbus.Response{Func: q.Func, Addr: q.Addr, Count: uint16(len(q.Values)), Values: q.Values}).Encode()
	}
}

// Register returns register addr's value.
func (d *Registers) Register(addr uint16) (uint16, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if int(addr) >= len(d.regs) {
		return 0, fmt.Errorf("legacy: register %d beyond %d", addr, len(d.regs))
	}
	return d.regs[addr], nil
}

// Stats returns the number of applied writes and of refused requests.
func (d *Registers) Stats() (writes, errors uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.writes, d.errs
}

// ReadApplied parses an applied-writes log.
func ReadApplied(r io.Reader) ([]Applied, error) {
	dec := json.NewDecoder(r)
	var out []Applied
	for {
		var a Applied
		if err := dec.Decode(&a); err == io.EOF {
			return out, nil
		} else if err != nil {
			return out, fmt.Errorf("legacy: applied log line %d: %w", len(out)+1, err)
		}
		out = append(out, a)
	}
}
