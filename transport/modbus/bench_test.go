package modbus

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/edgefence/edgefence/internal/modbustest"
)

// BenchmarkBusTCP is the bare bus (no fence) against pymodbus on
// 127.0.0.1: one caller, 1-register reads (0x03) and writes (0x06), one
// transaction at a time as on any Modbus bus. docs/BENCHMARKS.md records
// its figures.
func BenchmarkBusTCP(b *testing.B) {
	slave := modbustest.StartTCP(b, modbustest.Options{Units: []byte{1}})
	bus, err := OpenBus(BusConfig{Name: "bench", TCP: slave.Addr()})
	if err != nil {
		b.Fatal(err)
	}
	defer bus.Close()
	ctx := context.Background()
	for _, c := range []struct {
		name string
		q    Request
	}{
		{"read1", Request{Func: FuncReadHolding, Addr: 3, Count: 1}},
		{"write1", Request{Func: FuncWriteSingle, Addr: 3, Values: []uint16{42}}},
	} {
		b.Run(c.name, func(b *testing.B) {
			start := time.Now()
			for b.Loop() {
				if _, err := bus.Transact(ctx, 1, &c.q); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "tx/s")
		})
	}
	// The floor: the same reads by hand on a connection of the benchmark's
	// own (no goroutine, no queue, no checks but the length), what
	// pymodbus itself allows.
	b.Run("read1-raw", func(b *testing.B) {
		conn, err := net.Dial("tcp", slave.Addr())
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		adu, _ := EncodeTCP(MBAP{Transaction: 1, Unit: 1}, []byte{FuncReadHolding, 0, 3, 0, 1})
		rsp := make([]byte, MBAPLen+4)
		start := time.Now()
		for b.Loop() {
			if _, err := conn.Write(adu); err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(conn, rsp); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "tx/s")
	})
}
