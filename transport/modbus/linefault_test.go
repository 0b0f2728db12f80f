package modbus_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgefence/edgefence/devices/legacy"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/transport/modbus"
	"github.com/edgefence/edgefence/transport/serial"
)

// applied reads the slave's applied-writes log.
func applied(t *testing.T, path string) []legacy.Applied {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	a, err := legacy.ReadApplied(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// Bit errors on an RS-485 line (sandbox.RS485.FlipBits), the bus master on
// its master end and the Go slave on a drop. A write whose answer is
// corrupted fails with an error of unknown fate (ErrTimeout wrapping
// ErrCRC, or ErrFrame when the flip hit the unit or function byte), is
// counted, and the next transaction works; the write was applied once, as
// the slave's log shows, since the bus never retries. A corrupted request
// is dropped by the slave: never applied, and the bus times out.
func TestBusRTUBitErrors(t *testing.T) {
	const baud, n = 19200, 12
	l := newLine(t, sandbox.RS485Config{Baud: baud, Drops: 1, Seed: 14})
	logPath := filepath.Join(t.TempDir(), "applied.jsonl")
	log, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	regs := legacy.NewRegisters("u1", 64, log)
	slave := serveGo(t, l, regs)
	// A second, not less: on a loaded machine a clean answer has taken
	// over 300 ms (CI: "unit 1 silent for 300ms" on the read after a write).
	bus, err := modbus.OpenBus(modbus.BusConfig{Name: "noisy", RTU: &serial.PortConfig{Path: l.Master, Baud: baud}, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer bus.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	crc := 0
	for i := range uint16(n) {
		if err := l.FlipBits(1, sandbox.ToMaster); err != nil {
			t.Fatal(err)
		}
		_, err := bus.Transact(ctx, 1, &modbus.Request{Func: modbus.FuncWriteSingle, Addr: i, Values: []uint16{100 + i}})
		if !errors.Is(err, modbus.ErrTimeout) || errors.Is(err, modbus.ErrNotSent) || !(errors.Is(err, modbus.ErrCRC) || errors.Is(err, modbus.ErrFrame)) {
			t.Fatalf("write %d, its answer corrupted: %v (want ErrTimeout with ErrCRC or ErrFrame)", i, err)
		}
		if errors.Is(err, modbus.ErrCRC) {
			crc++
		}
		r, err := bus.Transact(ctx, 1, &modbus.Request{Func: modbus.FuncReadHolding, Addr: i, Count: 1})
		if err != nil || r.Values[0] != 100+i {
			t.Fatalf("the read after write %d: %+v %v", i, r, err)
		}
	}
	st := bus.Stats()
	if crc == 0 || st.CRCErrors != uint64(crc) || st.CRCErrors+st.FrameErrors != n || st.Timeouts != n || st.Transactions != 2*n {
		t.Errorf("%d ErrCRC; bus stats %+v", crc, st)
	}
	got := applied(t, logPath)
	if len(got) != n {
		t.Fatalf("%d writes applied, want %d (each once): %+v", len(got), n, got)
	}
	for i, a := range got {
		if a.Addr != uint16(i) || len(a.Values) != 1 || a.Values[0] != 100+uint16(i) {
			t.Errorf("applied write %d: %+v", i, a)
		}
	}

	// A corrupted request: the slave drops it, nothing is applied, the bus
	// hears nothing (fate unknown to it) and the next request works.
	if err := l.FlipBits(1, sandbox.ToDrops); err != nil {
		t.Fatal(err)
	}
	if _, err := bus.Transact(ctx, 1, &modbus.Request{Func: modbus.FuncWriteSingle, Addr: 63, Values: []uint16{7}}); !errors.Is(err, modbus.ErrTimeout) {
		t.Fatalf("a corrupted request: %v", err)
	}
	if v, _ := regs.Register(63); v != 0 {
		t.Fatalf("a corrupted request applied: register 63 = %d", v)
	}
	if _, err := bus.Transact(ctx, 1, &modbus.Request{Func: modbus.FuncReadHolding, Addr: 63, Count: 1}); err != nil {
		t.Fatalf("after a corrupted request: %v", err)
	}
	if k := len(applied(t, logPath)); k != n {
		t.Errorf("%d writes applied after a corrupted request, want %d", k, n)
	}
	if ls, ss := l.Stats(), slave.Stats(); ls.Flipped != n+1 || ss.Bad == 0 || ss.Requests != 2*n+1 {
		t.Errorf("line %+v, slave %+v", ls, ss)
	}
}
