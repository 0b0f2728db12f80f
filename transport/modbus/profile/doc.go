// Package profile reads device profiles: one YAML file per device model
// that maps a Modbus device's registers and coils to twin fields and command
// kinds (the EdgeX / Node-RED idea, in edgefence's own format). The gateway
// fence plans with it: a desired twin field becomes the write that sets it
// (PlanFields), a command kind the writes it stands for (PlanCommand), and
// the reported fields are read in as few requests as the device allows
// (PollBlocks, Decode). Planning never touches the bus.
//
// # Format
//
//	model: acme-em100          # required; devices name it: modbus: {profile: acme-em100}
//	description: 3-phase meter # free text
//	poll_interval: 5s          # default of the fields' poll_interval; default 10s; "never": none
//	max_gap: 4                 # unmapped registers (coils) a poll may read through to join two reads; default 4, 0: never
//	fields:
//	  - name: voltage_l1       # the twin field: [A-Za-z][A-Za-z0-9_]*, at most 64, unique
//	    table: input           # holding | input | coil | discrete (required)
//	    address: 0             # 0..65535, as on the wire (0-based; register 30001 is input 0)
//	    type: float32          # int16 uint16 int32 uint32 float32 (registers; required), bool (coil, discrete; the default there)
//	    word_order: big        # 32-bit types only: big (high word first, the default) | little
//	    scale: 0.1             # engineering = raw × scale + offset; scale ≠ 0, default 1
//	    offset: 0              # default 0
//	    unit: V                # free text, for people
//	    enum: {off: 0, heat: 1} # integer types without scale/offset: the twin holds the name
//	    writable: false        # a desired twin value is written (holding, coil only)
//	    idempotent: true       # the write may be retried after a lost answer (holding, coil; default true)
//	    verify: false          # read back after writing (holding, coil)
//	    poll_interval: 1s      # overrides the profile's; "never" (or 0s): not polled
//	commands:                  # kinds beyond twin.set
//	  - kind: reset_energy     # [A-Za-z0-9._:/-], at most 64, unique; not twin.set, write_register(s), read_registers
//	    writes:                # raw constants, in order (1 to 16)
//	      - {table: holding, address: 0xF010, value: 3}    # holding: -32768..65535; coil: 0 or 1
//	      - {table: holding, address: 0xF020, values: [1, 2]} # holding only: 1..123 registers
//	    idempotent: false      # default false for writes: a one-shot action is not repeated blindly
//	  - kind: set_mode         # body {"value": v} written to a field (holding or coil)
//	    field: mode
//	    idempotent: true       # default: the field's
//
// Every problem is an *Error naming the file, line and dotted key
// (fields[2].type); unknown keys, aliases and keys given twice are errors.
// Two fields whose registers overlap on one table are refused.
//
// # Values
//
// Registers are big-endian 16-bit words as Modbus sends them; a 32-bit value
// takes two registers, high word first unless word_order is little. int16
// and int32 are two's complement, float32 IEEE 754. Reading, raw × scale +
// offset is the engineering value: an int64 when scale is 1 and offset 0,
// else a float64 rounded to the decimals of scale and offset (raw 2301 at
// scale 0.1 is 230.1); a float32 is its shortest decimal (230.1, not
// 230.10000610351562); an enum field is its name, or the number if the
// device holds a value the enum does not list; a coil or discrete input is
// a bool. Writing, (value − offset) / scale is rounded to the nearest
// integer and must fit the type; a value that does not is refused
// (fence.ErrInvalid), as is a field that is unknown or not writable.
//
// One 16-bit holding write is a 0x06 request, a 32-bit one a 0x10, a coil a
// 0x05. Poll reads are 0x01 (coils), 0x02 (discrete inputs), 0x03
// (holding), 0x04 (input registers): the fields of one table and one
// interval, in address order, joined while the gap between them is at most
// max_gap and the read at most 125 registers or 2000 bits.
package profile
