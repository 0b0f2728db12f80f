package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/edgefence/edgefence/devices/legacy"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/transport/modbus"
	"github.com/edgefence/edgefence/transport/serial"
)

// openMaster returns a pty's pollable master and the slave's path; the
// slave stays open for the test.
func openMaster(t *testing.T) (*os.File, string) {
	t.Helper()
	m, s, err := sandbox.OpenPty()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return m, s.Name()
}

// TestSerialLegacyDevice runs `edgefence-devsim --serial` on a real pty and
// talks to it from the gateway side with the serial link: writes are
// applied and logged, reads answer, bad PDUs get exceptions, a retried
// transaction is not applied twice.
func TestSerialLegacyDevice(t *testing.T) {
	master, slave := openMaster(t)
	applied := filepath.Join(t.TempDir(), "applied.jsonl")
	d := startDevsim(t, "--serial", slave, "--devices", "plc-7", "--registers", "32", "--log", applied)
	d.awaitReady(t)

	link, err := serial.NewLink(master, serial.LinkConfig{Timeout: 2 * time.Second, Retries: 5})
	if err != nil {
		t.Fatal(err)
	}
	defer link.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	do := func(q modbus.Request) *modbus.Response {
		t.Helper()
		pdu, err := q.Encode()
		if err != nil {
			t.Fatal(err)
		}
		resp, err := link.Do(ctx, pdu)
		if err != nil {
			t.Fatalf("Do %+v: %v\n%s", q, err, d.log())
		}
		r, err := modbus.DecodeResponse(&q, resp)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := do(modbus.Request{Func: modbus.FuncWriteMultiple, Addr: 4, Values: []uint16{11, 12}}); r.Err() != nil {
		t.Fatal(r.Err())
	}
	if r := do(modbus.Request{Func: modbus.FuncWriteSingle, Addr: 5, Values: []uint16{99}}); r.Err() != nil {
		t.Fatal(r.Err())
	}
	if r := do(modbus.Request{Func: modbus.FuncReadHolding, Addr: 3, Count: 3}); r.Err() != nil || !slices.Equal(r.Values, []uint16{0, 11, 99}) {
		t.Fatalf("read: %+v %v", r, r.Err())
	}
	if r := do(modbus.Request{Func: modbus.FuncWriteSingle, Addr: 32, Values: []uint16{1}}); r.Exception != modbus.ExIllegalAddress {
		t.Fatalf("out of range: %+v", r)
	}
	link.Close()
	d.stop(t, syscall.SIGTERM)

	f, err := os.Open(applied)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	log, err := legacy.ReadApplied(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(log) != 2 || log[0].Device != "plc-7" || log[0].Addr != 4 || !slices.Equal(log[1].Values, []uint16{99}) {
		t.Fatalf("applied log %+v", log)
	}
}

func TestSerialUsage(t *testing.T) {
	for _, args := range [][]string{
		{"--serial", "/dev/null", "--mqtt", "mqtt://h"},
		{"--serial", "/dev/null", "--dir", "x"},
		{"--serial", "/dev/null", "--history", "h.jsonl"},
	} {
		d := startDevsim(t, args...)
		if code := d.wait(t); code != 2 {
			t.Errorf("%q: exit %d", args, code)
		}
	}
}
