// Package modbustest runs Modbus peers nobody here wrote, for tests: a
// pymodbus 3.0.0 slave (Debian's python3-pymodbus, run by /usr/bin/python3
// from the script embedded here) on a tty path or on a free 127.0.0.1
// port, which a test can kill and restart; mbpoll, an independent master,
// to read back and write; and a socat pty pair to put between them.
//
// Require skips a test when pymodbus, mbpoll or socat is missing, or fails
// it under CI=true (make deps installs them).
//
// The slave's registers start known: holding and input register i of unit
// u hold u*256 + i%256 (Initial), discrete input i is (u+i)%2, coils are 0;
// every block spans Options.Size addresses from 0, so a read beyond it is
// answered "illegal data address". Units not in Options.Units get no
// answer at all.
//
// For fault tests (faults.go) a slave keeps a write log (Options.WriteLog:
// every write its datastore applied, read back with Server.Writes), the
// witness that a write was applied once, twice or never whatever its
// master was told; it can answer as another unit (Options.AnswerAs),
// answer its first writes "slave device busy" without applying them
// (Options.Busy), and hold the answer to an applied write (Server.Stall),
// to be killed mid-transaction.
//
// A pty has no parity bit: Linux clears PARENB on it, and pyserial (through
// glibc's tcsetattr check) then refuses to open it with parity, so on a pty
// the slave serves 8N1 whatever Options.Parity says (and says so on its
// stderr). A test "at 9600 8E1" exercises the master's settings and timing,
// not parity bits.
//
// socat creates its pty links before it sets the ptys raw: a port opened
// in between has its termios (tarm/serial's VMIN 0, VTIME n) replaced by
// raw's (VMIN 1, VTIME 0), and its reads block for ever. NewPtyPair
// returns only once socat has started its transfer loop.
package modbustest
