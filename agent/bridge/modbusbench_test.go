package bridge

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/internal/modbustest"
	"github.com/edgefence/edgefence/transport/modbus"
)

// BenchmarkModbusTCP measures register writes to one pymodbus server on
// 127.0.0.1 in the same run, three ways:
//
//	bare:     the bus master alone (modbus.Bus.Transact), no fence;
//	fenced:   a holder's command through the home gateway: holder → broker →
//	          bridge (decode, fence table admit with fsync) → bus → slave →
//	          ack → broker → holder, one at a time;
//	fenced-N: N devices (units on the one endpoint) commanded at once, one
//	          command at a time each: their admits share fsyncs.
//
// It reports transactions per second and, for the fenced runs, p50/p99.
func BenchmarkModbusTCP(b *testing.B) {
	modbustest.Require(b)
	units := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	slave := modbustest.StartTCP(b, modbustest.Options{Units: units})
	b.Run("bare", func(b *testing.B) {
		bus, err := modbus.OpenBus(modbus.BusConfig{Name: "bench", TCP: slave.Addr()})
		if err != nil {
			b.Fatal(err)
		}
		defer bus.Close()
		q := &modbus.Request{Func: modbus.FuncWriteSingle, Addr: 0}
		b.ResetTimer()
		for i := range b.N {
			q.Values = []uint16{uint16(i)}
			if _, err := bus.Transact(context.Background(), 1, q); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tx/s")
	})
	for _, n := range []int{1, 8} {
		name := "fenced"
		if n > 1 {
			name = fmt.Sprintf("fenced-%d", n)
		}
		b.Run(name, func(b *testing.B) { benchFenced(b, slave, units[:n]) })
	}
}

// benchFenced sends b.N fenced writes spread over one device per unit.
func benchFenced(b *testing.B, slave *modbustest.Server, units []byte) {
	tbl, err := fence.OpenTable(filepath.Join(b.TempDir(), "fence.db"), nil)
	if err != nil {
		b.Fatal(err)
	}
	devs := make([]Device, len(units))
	for i, u := range units {
		devs[i] = Device{ID: "plc-" + itoa(int(u)), Modbus: &ModbusUnit{Bus: "net", Unit: u}}
	}
	r := startMbRig(b, tbl, []Bus{{BusConfig: modbus.BusConfig{Name: "net", TCP: slave.Addr()}}}, devs)
	lat := make([][]time.Duration, len(devs))
	per := (b.N + len(devs) - 1) / len(devs)
	b.ResetTimer()
	var wg sync.WaitGroup
	for d := range devs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				start := time.Now()
				a := r.send(devs[d].ID, 1, uint64(i+1), modbus.KindWriteRegister, rawWrite(b, 0, uint16(i)))
				lat[d] = append(lat[d], time.Since(start))
				if a.Verdict != fence.Accepted {
					b.Errorf("%s: %+v", devs[d].ID, a)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	all := slices.Concat(lat...)
	slices.Sort(all)
	b.ReportMetric(float64(len(all))/b.Elapsed().Seconds(), "tx/s")
	b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
}
