package modbus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgefence/edgefence/internal/modbustest"
	"github.com/edgefence/edgefence/transport/serial"
)

// The bus against pymodbus (Debian's python3-pymodbus 3.0.0) on a socat
// pty pair and on 127.0.0.1, read back with mbpoll: Modbus peers nobody
// here wrote. Durations are bounded generously, never asserted tight.

const (
	testWait    = 30 * time.Second // bounds every wait for a condition
	testTimeout = 400 * time.Millisecond
	blockSize   = 50
)

func openTestBus(t *testing.T, cfg BusConfig) (*Bus, *modbustest.Buffer) {
	t.Helper()
	logs := &modbustest.Buffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if cfg.Timeout == 0 {
		cfg.Timeout = testTimeout
	}
	b, err := OpenBus(cfg)
	if err != nil {
		t.Fatalf("OpenBus: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	return b, logs
}

// rtuFixture is pymodbus on one end of a pty pair and the bus's config for
// the other.
type rtuFixture struct {
	pair  *modbustest.PtyPair
	slave *modbustest.Server
	port  serial.PortConfig
}

func newRTU(t *testing.T, baud int, parity string, units ...byte) rtuFixture {
	t.Helper()
	pair := modbustest.NewPtyPair(t)
	slave := modbustest.StartRTU(t, pair.A, modbustest.Options{Units: units, Size: blockSize, Baud: baud, Parity: parity})
	return rtuFixture{pair: pair, slave: slave, port: serial.PortConfig{Path: pair.B, Baud: baud, Parity: parity}}
}

func (f rtuFixture) target() modbustest.Target {
	return modbustest.Target{Path: f.pair.B, Baud: f.port.Baud, Parity: f.port.Parity}
}

func mustTransact(t *testing.T, b *Bus, unit byte, q Request) *Response {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	r, err := b.Transact(ctx, unit, &q)
	if err != nil {
		t.Fatalf("unit %d function 0x%02x at %d: %v", unit, q.Func, q.Addr, err)
	}
	return r
}

func initial(unit byte, addr uint16, n int) []uint16 {
	out := make([]uint16, n)
	for i := range out {
		out[i] = modbustest.Initial(unit, addr+uint16(i))
	}
	return out
}

// writes are what exerciseFunctions writes with every write function.
var writes = []Request{
	{Func: FuncWriteSingle, Addr: 10, Values: []uint16{0xBEEF}},
	{Func: FuncWriteMultiple, Addr: 20, Values: []uint16{1, 2, 65535}},
	{Func: FuncWriteCoil, Addr: 5, Values: []uint16{1}},
	{Func: FuncWriteCoils, Addr: 8, Values: []uint16{1, 0, 1, 1, 0, 0, 0, 0, 1}},
}

// exerciseFunctions reads and writes with every function code through b,
// and checks the named exception of a read beyond the block.
func exerciseFunctions(t *testing.T, b *Bus, unit byte) {
	t.Helper()
	if r := mustTransact(t, b, unit, Request{Func: FuncReadHolding, Addr: 3, Count: 4}); !slices.Equal(r.Values, initial(unit, 3, 4)) {
		t.Errorf("0x03: %v", r.Values)
	}
	if r := mustTransact(t, b, unit, Request{Func: FuncReadInput, Addr: 0, Count: 2}); !slices.Equal(r.Values, initial(unit, 0, 2)) {
		t.Errorf("0x04: %v", r.Values)
	}
	wantDI := make([]uint16, 11)
	for i := range wantDI {
		wantDI[i] = uint16((int(unit) + 2 + i) % 2)
	}
	if r := mustTransact(t, b, unit, Request{Func: FuncReadDiscrete, Addr: 2, Count: 11}); !slices.Equal(r.Values, wantDI) {
		t.Errorf("0x02: %v, want %v", r.Values, wantDI)
	}
	for _, w := range writes {
		mustTransact(t, b, unit, w)
	}
	if r := mustTransact(t, b, unit, Request{Func: FuncReadHolding, Addr: 10, Count: 13}); r.Values[0] != 0xBEEF || !slices.Equal(r.Values[10:], []uint16{1, 2, 65535}) {
		t.Errorf("registers read back: %v", r.Values)
	}
	if r := mustTransact(t, b, unit, Request{Func: FuncReadCoils, Addr: 4, Count: 14}); !slices.Equal(r.Values, []uint16{0, 1, 0, 0, 1, 0, 1, 1, 0, 0, 0, 0, 1, 0}) {
		t.Errorf("coils read back: %v", r.Values)
	}
	q := &Request{Func: FuncReadHolding, Addr: blockSize - 1, Count: 2}
	r, err := b.Transact(context.Background(), unit, q)
	var ee *ExceptionError
	if !errors.As(err, &ee) || !errors.Is(err, ErrException) || ee.Code != ExIllegalAddress || r == nil || r.Exception != ExIllegalAddress ||
		!strings.Contains(err.Error(), "illegal data address (0x02)") {
		t.Errorf("read beyond the block: %+v, %v", r, err)
	}
	if st := b.Stats(); st.Exceptions != 1 || st.Timeouts != 0 || st.Transactions != 10 || st.Busy <= 0 {
		t.Errorf("stats %+v", st)
	}
}

// checkWithMbpoll reads what exerciseFunctions wrote with mbpoll, writes
// with mbpoll, and returns what the bus must read back afterwards.
func checkWithMbpoll(t *testing.T, g modbustest.Target, unit byte) {
	t.Helper()
	if got := modbustest.MbpollRead(t, g, unit, modbustest.HoldingRegisters, 20, 3); !slices.Equal(got, []uint16{1, 2, 65535}) {
		t.Errorf("mbpoll reads registers %v", got)
	}
	if got := modbustest.MbpollRead(t, g, unit, modbustest.Coils, 8, 9); !slices.Equal(got, writes[3].Values) {
		t.Errorf("mbpoll reads coils %v", got)
	}
	modbustest.MbpollWrite(t, g, unit, modbustest.HoldingRegisters, 30, 4242)
	modbustest.MbpollWrite(t, g, unit, modbustest.Coils, 40, 1)
}

func checkMbpollWrites(t *testing.T, b *Bus, unit byte) {
	t.Helper()
	if r := mustTransact(t, b, unit, Request{Func: FuncReadHolding, Addr: 30, Count: 1}); r.Values[0] != 4242 {
		t.Errorf("mbpoll's register write reads %v", r.Values)
	}
	if r := mustTransact(t, b, unit, Request{Func: FuncReadCoils, Addr: 40, Count: 1}); r.Values[0] != 1 {
		t.Errorf("mbpoll's coil write reads %v", r.Values)
	}
}

func TestBusRTUFunctions(t *testing.T) {
	for _, c := range []struct {
		baud   int
		parity string
	}{{19200, "N"}, {9600, "E"}} {
		t.Run(fmt.Sprintf("%d-8%s1", c.baud, c.parity), func(t *testing.T) {
			f := newRTU(t, c.baud, c.parity, 7)
			b, _ := openTestBus(t, BusConfig{Name: "rs485", RTU: &f.port})
			exerciseFunctions(t, b, 7)
			// mbpoll needs the line: the bus lets go of it, then opens it again.
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			checkWithMbpoll(t, f.target(), 7)
			b, _ = openTestBus(t, BusConfig{Name: "rs485", RTU: &f.port})
			checkMbpollWrites(t, b, 7)
		})
	}
}

func TestBusTCPFunctions(t *testing.T) {
	slave := modbustest.StartTCP(t, modbustest.Options{Units: []byte{1}, Size: blockSize})
	b, _ := openTestBus(t, BusConfig{Name: "plc-net", TCP: slave.Addr()})
	exerciseFunctions(t, b, 1)
	checkWithMbpoll(t, slave.TCPTarget(), 1) // a second connection while the bus keeps its own
	checkMbpollWrites(t, b, 1)
}
