package profile

import (
	"time"

	"github.com/edgefence/edgefence/transport/modbus"
)

// Defaults and limits of a profile.
const (
	DefaultPollInterval = 10 * time.Second
	MinPollInterval     = 100 * time.Millisecond
	DefaultMaxGap       = 4
	MaxGap              = 64   // max_gap's ceiling
	MaxReadBits         = 2000 // coils or discrete inputs in one read (Modbus v1.1b3, 6.1, 6.2)
	MaxFileSize         = 1 << 20
	MaxNameLen          = 64
	MaxCommandWrites    = 16
)

// Reserved command kinds: the twin's own and the raw register kinds the
// bridge speaks (transport/modbus.CommandPDU).
var reservedKinds = []string{"twin.set", modbus.KindWriteRegister, modbus.KindWriteRegisters, modbus.KindReadRegisters}

// Profile is one device model's register map, validated.
type Profile struct {
	File         string        // where it was read from ("" for Parse without a name)
	Model        string        // what devices' modbus.profile names
	Description  string        //
	PollInterval time.Duration // the fields' default; 0: never
	MaxGap       int           // unmapped registers (coils) a poll reads through
	Fields       []*Field      // in the file's order
	Commands     []*Command    // in the file's order

	byName map[string]*Field
	byKind map[string]*Command
	blocks []Block
}

// Field is a twin field on a register (or two) or a coil.
type Field struct {
	Name         string
	Table        Table
	Address      uint16
	Type         Type
	LittleEndian bool    // 32-bit types: low word first
	Scale        float64 // never 0
	Offset       float64
	Unit         string
	Enum         map[string]int64 // name → raw value; nil: a number
	Writable     bool             // desired twin values are written
	Idempotent   bool             // a write may be retried after a lost answer
	Verify       bool             // read back after a write
	PollInterval time.Duration    // 0: not polled

	enumNames map[int64]string
	index     int // in the file's fields
	decimals  int // rounding of a scaled integer's engineering value; -1: none
}

// Command is a command kind of the device's own.
type Command struct {
	Kind       string
	Field      string  // set: the body's value is written to this field
	Writes     []Write // or these constants, in order
	Idempotent bool
}

// Write is one constant write of a command.
type Write struct {
	Table   Table // Holding or Coil
	Address uint16
	Values  []uint16 // coils: 0 or 1
}

// Table is a Modbus data table.
type Table uint8

// The four Modbus tables.
const (
	Holding Table = iota + 1
	Input
	Coil
	Discrete
)

var tableNames = map[string]Table{"holding": Holding, "input": Input, "coil": Coil, "discrete": Discrete}

func (t Table) String() string {
	if int(t) < len(tableStrings) && t != 0 {
		return tableStrings[t]
	}
	return "table?"
}

var tableStrings = [...]string{Holding: "holding", Input: "input", Coil: "coil", Discrete: "discrete"}

// Bits reports whether t holds bits (coils, discrete inputs), not registers.
func (t Table) Bits() bool { return t == Coil || t == Discrete }

// Writable reports whether Modbus can write t.
func (t Table) Writable() bool { return t == Holding || t == Coil }

// ReadFunc is the function code that reads t.
func (t Table) ReadFunc() byte {
	switch t {
	case Coil:
		return modbus.FuncReadCoils
	case Discrete:
		return modbus.FuncReadDiscrete
	case Input:
		return modbus.FuncReadInput
	default:
		return modbus.FuncReadHolding
	}
}

// maxRead is the most items one read of t may ask for.
func (t Table) maxRead() int {
	if t.Bits() {
		return MaxReadBits
	}
	return modbus.MaxReadRegisters
}

// Type is a field's value type.
type Type uint8

// Field types.
const (
	Int16 Type = iota + 1
	Uint16
	Int32
	Uint32
	Float32
	Bool
)

var typeNames = map[string]Type{"int16": Int16, "uint16": Uint16, "int32": Int32, "uint32": Uint32, "float32": Float32, "bool": Bool}

func (t Type) String() string {
	if int(t) < len(typeStrings) && t != 0 {
		return typeStrings[t]
	}
	return "type?"
}

var typeStrings = [...]string{Int16: "int16", Uint16: "uint16", Int32: "int32", Uint32: "uint32", Float32: "float32", Bool: "bool"}

// Width is how many registers (or bits) a value of t takes.
func (t Type) Width() int {
	if t == Int32 || t == Uint32 || t == Float32 {
		return 2
	}
	return 1
}

// intRange is the raw range of an integer type.
func (t Type) intRange() (lo, hi int64) {
	switch t {
	case Int16:
		return -1 << 15, 1<<15 - 1
	case Uint16:
		return 0, 1<<16 - 1
	case Int32:
		return -1 << 31, 1<<31 - 1
	default:
		return 0, 1<<32 - 1
	}
}

// Op is one planned write.
type Op struct {
	Req        *modbus.Request
	Field      string // the field written; "" for a command's constants
	Idempotent bool   // may be sent again after a lost answer
	Verify     bool   // read back after writing (ReadBack, Matches)
}

// ReadBack is the read of what o writes.
func (o Op) ReadBack() *modbus.Request {
	f := modbus.FuncReadHolding
	if o.Req.Func == modbus.FuncWriteCoil || o.Req.Func == modbus.FuncWriteCoils {
		f = modbus.FuncReadCoils
	}
	return &modbus.Request{Func: f, Addr: o.Req.Addr, Count: uint16(len(o.Req.Values))}
}

// Matches reports whether r, the answer to ReadBack, shows what o wrote.
func (o Op) Matches(r *modbus.Response) bool {
	if r == nil || r.Exception != 0 || len(r.Values) < len(o.Req.Values) {
		return false
	}
	coil := o.Req.Func == modbus.FuncWriteCoil || o.Req.Func == modbus.FuncWriteCoils
	for i, v := range o.Req.Values {
		got := r.Values[i]
		if coil && (got != 0) != (v != 0) || !coil && got != v {
			return false
		}
	}
	return true
}

// Block is one poll read: the fields it covers, in address order, and how
// often it is due.
type Block struct {
	Req      *modbus.Request
	Fields   []string
	Interval time.Duration
}
