// Package modbus is the Modbus application protocol as the gateway fence
// speaks it to devices that cannot check a token.
//
// PDUs (pdu.go): read coils 0x01, read discrete inputs 0x02 (1..2000 bits,
// packed low bit first), read holding 0x03 and input 0x04 registers
// (1..125), write single coil 0x05 (0xFF00/0x0000 on the wire, 0 and 1 in
// Request.Values), write single register 0x06, write multiple coils 0x0F
// (1..1968) and registers 0x10 (1..123), with strict decoding (ErrPDU: a
// byte count that does not fit the request, a write's echo that does not
// match it) and exception responses named (ExceptionName, *ExceptionError,
// errors.Is ErrException). CommandPDU turns an admitted envelope's kind and
// body into the request the gateway sends:
//
//	write_register   {"addr": A, "value": V}        → 0x06
//	write_registers  {"addr": A, "values": [V...]}  → 0x10 (1..123 registers)
//	read_registers   {"addr": A, "count": N}        → 0x03 (1..125 registers)
//
// The field's framing (adu.go): Modbus RTU (unit id, PDU, CRC-16; t1.5/t3.5
// from the baud rate, RTUTiming) and Modbus TCP (the MBAP header), checked
// strictly (ErrCRC, ErrFrame: another unit's or transaction's answer is not
// ours).
//
// The bus master (bus.go, rtu.go, tcp.go): OpenBus opens one RS-485 line
// (over transport/serial's Conn, which survives unplug and replug) or one
// TCP endpoint, with any number of units behind it. One goroutine per bus
// owns the port or connection and runs the transactions of all callers
// one at a time, first come first served; Transact tries once and never
// retries, and its error says what the caller may do: ErrNotSent (nothing
// went out; retry at will), ErrTimeout (fate unknown; ErrCRC and ErrFrame
// come wrapped in it), an *ExceptionError (refused by the device),
// ErrBroadcast (a write to unit 0). On RTU an answer is delimited by its
// length, known from the request and the function code that comes back,
// never by timing (tarm/serial reads in tenths of a second); t3.5 of
// silence precedes each request, and after a bad or missing answer the
// line is drained until quiet for 100 ms. On TCP each request carries a
// new MBAP transaction id, a late answer to an earlier one is dropped, and
// a broken connection is redialled with backoff (internal/backoff); one
// the server closed while idle is noticed before the next request is
// written. Stats counts transactions, timeouts, bad frames, exceptions,
// requests not sent and the line time used (Busy, for utilisation).
// Goroutines: the bus's own, a serial reader (RTU) or a reader per
// connection (TCP); Close stops them all.
package modbus
