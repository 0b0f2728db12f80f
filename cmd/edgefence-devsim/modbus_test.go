package main

import (
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/edgefence/edgefence/devices/legacy"
	"github.com/edgefence/edgefence/internal/modbustest"
)

// freeAddr returns a free 127.0.0.1 address.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// `edgefence-devsim --modbus-tcp` and `--modbus-rtu` serve simulated
// Modbus devices that mbpoll, a master nobody here wrote, reads and
// writes: each unit its own registers, every applied write logged.
func TestModbusSlaves(t *testing.T) {
	modbustest.Require(t)
	applied := filepath.Join(t.TempDir(), "applied.jsonl")
	addr := freeAddr(t)
	d := startDevsim(t, "--modbus-tcp", addr, "--modbus-units", "3,4", "--registers", "16", "--log", applied)
	d.awaitReady(t)
	tcp := modbustest.Target{Addr: addr}
	modbustest.MbpollWrite(t, tcp, 3, modbustest.HoldingRegisters, 2, 77, 78)
	if v := modbustest.MbpollRead(t, tcp, 3, modbustest.HoldingRegisters, 2, 2); v[0] != 77 || v[1] != 78 {
		t.Fatalf("unit 3 reads %v", v)
	}
	if v := modbustest.MbpollRead(t, tcp, 4, modbustest.HoldingRegisters, 2, 1); v[0] != 0 {
		t.Fatalf("unit 4 reads %v: another unit's write applied", v)
	}
	d.stop(t, syscall.SIGTERM)

	pair := modbustest.NewPtyPair(t)
	r := startDevsim(t, "--modbus-rtu", pair.A, "--modbus-units", "9", "--log", applied)
	r.awaitReady(t)
	rtu := modbustest.Target{Path: pair.B}
	modbustest.MbpollWrite(t, rtu, 9, modbustest.HoldingRegisters, 0, 4242)
	if v := modbustest.MbpollRead(t, rtu, 9, modbustest.HoldingRegisters, 0, 1); v[0] != 4242 {
		t.Fatalf("unit 9 reads %v", v)
	}
	r.stop(t, syscall.SIGTERM)

	f, err := os.Open(applied)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	log, err := legacy.ReadApplied(f)
	if err != nil || len(log) != 2 || log[0].Device != "unit-3" || log[1].Device != "unit-9" || log[1].Values[0] != 4242 {
		t.Fatalf("applied log %+v %v", log, err)
	}
}

func TestModbusUsage(t *testing.T) {
	for _, args := range [][]string{
		{"--modbus-tcp", "127.0.0.1:0", "--mqtt", "mqtt://h"},
		{"--modbus-tcp", "127.0.0.1:0", "--modbus-rtu", "/dev/null"},
		{"--modbus-tcp", "127.0.0.1:0", "--modbus-units", "0"},
		{"--modbus-tcp", "127.0.0.1:0", "--modbus-units", "1,1"},
		{"--modbus-rtu", "/dev/null", "--serial", "/dev/null"},
	} {
		d := startDevsim(t, args...)
		if code := d.wait(t); code != 2 {
			t.Errorf("%q: exit %d", args, code)
		}
	}
}
