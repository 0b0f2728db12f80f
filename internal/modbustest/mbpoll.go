package modbustest

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
)

// Table is a Modbus data table as mbpoll names it (-t).
type Table string

// The four tables.
const (
	Coils            Table = "0"
	DiscreteInputs   Table = "1"
	InputRegisters   Table = "3:hex"
	HoldingRegisters Table = "4:hex"
)

// Target is where mbpoll talks: a TCP slave (Addr) or a tty (Path) at a
// baud rate and parity.
type Target struct {
	Addr     string // host:port for Modbus TCP
	Path     string // tty for Modbus RTU
	Baud     int    // default 19200
	Parity   string // "N" (default), "E" or "O"
	StopBits int    // default 1
}

// TCPTarget is the target of a TCP slave.
func (s *Server) TCPTarget() Target { return Target{Addr: s.Addr()} }

func (g Target) args() []string {
	if g.Addr != "" {
		host, port, err := net.SplitHostPort(g.Addr)
		if err != nil {
			host, port = g.Addr, "502"
		}
		return []string{"-m", "tcp", "-p", port, host}
	}
	o := Options{Baud: g.Baud, Parity: g.Parity, StopBits: g.StopBits}.withDefaults()
	parity := map[string]string{"N": "none", "E": "even", "O": "odd"}[o.Parity]
	return []string{"-m", "rtu", "-b", strconv.Itoa(o.Baud), "-P", parity, "-s", strconv.Itoa(o.StopBits), g.Path}
}

var mbpollValue = regexp.MustCompile(`(?m)^\[(\d+)\]:\s+(\S+)`)

// MbpollRead reads count items of table from addr (PDU addressing, from 0)
// of unit with mbpoll, and fails t if mbpoll fails.
func MbpollRead(t testing.TB, g Target, unit byte, table Table, addr uint16, count int) []uint16 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startWait)
	defer cancel()
	vals, err := Read(ctx, g, unit, table, addr, count)
	if err != nil {
		t.Fatal(err)
	}
	return vals
}

// Read is MbpollRead for callers without a testing.TB (a scenario's final
// read-back): mbpoll's failure, or an answer without count values, is its
// error.
func Read(ctx context.Context, g Target, unit byte, table Table, addr uint16, count int) ([]uint16, error) {
	out, err := mbpoll(ctx, g, unit, table, addr, []string{"-c", strconv.Itoa(count)}, nil)
	if err != nil {
		return nil, err
	}
	got := mbpollValue.FindAllStringSubmatch(out, -1)
	if len(got) != count {
		return nil, fmt.Errorf("modbustest: mbpoll read %d values, want %d:\n%s", len(got), count, out)
	}
	vals := make([]uint16, count)
	for i, m := range got {
		v, err := strconv.ParseUint(m[2], 0, 16)
		if err != nil {
			return nil, fmt.Errorf("modbustest: mbpoll value %q: %w", m[2], err)
		}
		vals[i] = uint16(v)
	}
	return vals, nil
}

// MbpollWrite writes values to table (Coils or HoldingRegisters) from addr
// of unit with mbpoll, and fails t if mbpoll fails.
func MbpollWrite(t testing.TB, g Target, unit byte, table Table, addr uint16, values ...uint16) {
	t.Helper()
	var args []string
	for _, v := range values {
		args = append(args, strconv.Itoa(int(v)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), startWait)
	defer cancel()
	if _, err := mbpoll(ctx, g, unit, table, addr, nil, args); err != nil {
		t.Fatal(err)
	}
}

// mbpoll runs mbpoll once, with opts before the target and values (to
// write) after it, and returns its output.
func mbpoll(ctx context.Context, g Target, unit byte, table Table, addr uint16, opts, values []string) (string, error) {
	args := []string{"-1", "-0", "-o", "2", "-a", strconv.Itoa(int(unit)), "-t", string(table), "-r", strconv.Itoa(int(addr))}
	args = append(args, opts...)
	args = append(args, g.args()...)
	args = append(args, values...)
	out, err := exec.CommandContext(ctx, "mbpoll", args...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("modbustest: mbpoll %v: %w\n%s", args, err, out)
	}
	return string(out), nil
}
