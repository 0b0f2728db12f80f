// Package modbus is the Modbus application protocol as the gateway fence
// speaks it to devices that cannot check a token: PDUs (function codes 0x03
// read holding registers, 0x06 write single register, 0x10 write multiple
// registers, and exception responses) with strict decoding (ErrPDU), and
// CommandPDU, which turns an admitted envelope's kind and body into the
// request the gateway sends:
//
//	write_register   {"addr": A, "value": V}        → 0x06
//	write_registers  {"addr": A, "values": [V...]}  → 0x10 (1..123 registers)
//	read_registers   {"addr": A, "count": N}        → 0x03 (1..125 registers)
//
// Today the bridge sends the PDUs in edgefence's serial frames
// (transport/serial: COBS + CRC-32C). The field's own framing is here
// (adu.go): Modbus RTU (unit id, PDU, CRC-16; t1.5/t3.5 from the baud rate,
// RTUTiming) and Modbus TCP (the MBAP header), checked strictly (ErrCRC,
// ErrFrame: another unit's or transaction's answer is not ours). The bus
// worker that speaks them to real devices comes next (issue 14).
package modbus
