// Package legacy simulates the devices edgefence cannot change: PLCs,
// meters and drives whose firmware knows nothing of tokens. Registers is a
// register device that applies every Modbus request that arrives
// (transport/modbus), with no fencing of its own, and logs every applied
// write as a JSON line (ReadApplied) for tests to read. Slave serves
// several of them by unit id as a Modbus RTU slave on a serial port
// (ServeRTU: a fast peer for the line-rate benchmark and the bus's fault
// tests) or a Modbus TCP server (ServeTCP).
//
// It is the proof that the gateway's fence table is the only thing standing
// between a stale holder and such a device.
package legacy
