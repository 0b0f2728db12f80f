// Package legacy models the devices edgefence cannot change: PLCs, meters and
// drives on RS-232/RS-485 whose firmware knows nothing of tokens. It has the
// wire protocol such devices speak — Modbus PDUs (function codes 0x03 read
// holding registers, 0x06 write single register, 0x10 write multiple
// registers, and exception responses), carried in edgefence's serial frames
// instead of Modbus RTU's timing-and-CRC-16 framing — and a register device
// simulator that applies whatever arrives, with no fencing of its own.
//
// The simulator is the proof that the gateway's fence table is the only thing
// standing between a stale holder and such a device: it logs every applied
// write as a JSON line, and tests read that log.
//
// Commands reach a legacy device as ordinary fenced envelopes; CommandPDU
// turns an envelope's kind and body into the PDU the gateway sends after the
// fence table admitted it:
//
//	write_register   {"addr": A, "value": V}        → 0x06
//	write_registers  {"addr": A, "values": [V...]}  → 0x10 (1..123 registers)
//	read_registers   {"addr": A, "count": N}        → 0x03 (1..125 registers)
package legacy
