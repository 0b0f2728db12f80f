package modbustest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/edgefence/edgefence/transport/modbus"
)

// The slave's faults and its write log, seen by a master nobody here
// wrote (mbpoll) and by transport/modbus's bus: every applied write is
// logged once, with its unit, table, address and values and the process
// that applied it (a restart changes it); a busy answer applies nothing;
// a foreign unit id and a stalled answer fail the master's transaction
// while the write was applied.
func TestSlaveWriteLogAndFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("starts pymodbus")
	}
	s := StartTCP(t, Options{Units: []byte{3, 4}, Size: 10, WriteLog: true, AnswerAs: map[byte]byte{4: 5}, Busy: 1})
	bus, err := modbus.OpenBus(modbus.BusConfig{Name: "t", TCP: s.Addr(), Timeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer bus.Close()
	ctx := context.Background()
	write := func(unit byte, f byte, addr uint16, v ...uint16) error {
		_, err := bus.Transact(ctx, unit, &modbus.Request{Func: f, Addr: addr, Values: v})
		return err
	}
	if len(s.Writes(t)) != 0 {
		t.Fatalf("a fresh slave logged writes: %v", s.Writes(t))
	}
	// Busy: answered exception 0x06, not applied.
	var ex *modbus.ExceptionError
	if err := write(3, modbus.FuncWriteSingle, 1, 42); !errors.As(err, &ex) || ex.Code != modbus.ExDeviceBusy {
		t.Fatalf("first write: %v, want device busy", err)
	}
	if ws := s.Writes(t); len(ws) != 0 {
		t.Fatalf("a busy answer applied %v", ws)
	}
	MbpollWrite(t, s.TCPTarget(), 3, HoldingRegisters, 1, 42, 43)
	MbpollWrite(t, s.TCPTarget(), 3, Coils, 4, 1)
	// An illegal address is refused by the datastore: not applied.
	if err := write(3, modbus.FuncWriteSingle, 50, 1); !errors.Is(err, modbus.ErrException) {
		t.Fatalf("write beyond the block: %v", err)
	}
	// Unit 4 answers as unit 5: the master drops the answer; the write was applied.
	if err := write(4, modbus.FuncWriteSingle, 2, 7); !errors.Is(err, modbus.ErrFrame) || !errors.Is(err, modbus.ErrTimeout) {
		t.Fatalf("write to unit 4 answered as unit 5: %v", err)
	}
	ws := s.Writes(t)
	pid := ws[0].PID
	want := []Write{
		{PID: pid, Unit: 3, Table: HoldingRegisters, Addr: 1, Values: []uint16{42, 43}},
		{PID: pid, Unit: 3, Table: Coils, Addr: 4, Values: []uint16{1}},
		{PID: pid, Unit: 4, Table: HoldingRegisters, Addr: 2, Values: []uint16{7}},
	}
	if !slices.EqualFunc(ws, want, func(a, b Write) bool {
		return a.PID == b.PID && a.Unit == b.Unit && a.Table == b.Table && a.Addr == b.Addr && slices.Equal(a.Values, b.Values)
	}) {
		t.Fatalf("write log %+v, want %+v", ws, want)
	}
	// Stalled: the write is applied, its answer held until the stall ends.
	s.Stall(t, true)
	if err := write(3, modbus.FuncWriteCoil, 5, 1); !errors.Is(err, modbus.ErrTimeout) {
		t.Fatalf("stalled write: %v", err)
	}
	if got := WritesTo(s.Writes(t), 3, Coils, 5); len(got) != 1 {
		t.Fatalf("stalled write applied %v times", got)
	}
	s.Stall(t, false)
	// A restart keeps the log and changes the pid; its busy count starts again.
	s.Restart(t)
	err = write(3, modbus.FuncWriteSingle, 1, 9)
	for deadline := time.Now().Add(startWait); errors.Is(err, modbus.ErrNotSent) && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond) // the bus redials
		err = write(3, modbus.FuncWriteSingle, 1, 9)
	}
	if !errors.As(err, &ex) {
		t.Fatalf("first write after the restart: %v, want device busy", err)
	}
	MbpollWrite(t, s.TCPTarget(), 3, HoldingRegisters, 1, 9)
	ws = s.Writes(t)
	if last := ws[len(ws)-1]; len(ws) != 5 || last.PID == pid || !slices.Equal(last.Values, []uint16{9}) {
		t.Fatalf("after the restart: %+v", ws)
	}
	if got := WritesTo(ws, 3, HoldingRegisters, 1); len(got) != 2 {
		t.Fatalf("WritesTo: %v", got)
	}
}
