package bridge

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/edgefence/edgefence/devices/legacy"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/internal/modbustest"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/transport/modbus"
	"github.com/edgefence/edgefence/transport/modbus/profile"
	"github.com/edgefence/edgefence/transport/serial"
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
		b.Run(name, func(b *testing.B) { benchFenced(b, slave.Addr(), units[:n]) })
	}
	// The same fenced command to the Go slave (devices/legacy) on
	// 127.0.0.1: what is left is the gateway's own cost.
	b.Run("fenced-goslave", func(b *testing.B) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- (&legacy.Slave{Units: legacy.Units{1: legacy.NewRegisters("u1", 8, nil)}}).ServeTCP(ctx, ln)
		}()
		defer func() { cancel(); <-done }()
		benchFenced(b, ln.Addr().String(), units[:1])
	})
}

// benchFenced sends b.N fenced writes spread over one device per unit.
func benchFenced(b *testing.B, addr string, units []byte) {
	tbl, err := fence.OpenTable(filepath.Join(b.TempDir(), "fence.db"), nil)
	if err != nil {
		b.Fatal(err)
	}
	devs := make([]Device, len(units))
	for i, u := range units {
		devs[i] = Device{ID: "plc-" + itoa(int(u)), Modbus: &ModbusUnit{Bus: "net", Unit: u}}
	}
	r := startMbRig(b, tbl, []Bus{{BusConfig: modbus.BusConfig{Name: "net", TCP: addr}}}, devs)
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

// pollBenchProfile is a meter of the kind a site has a hundred of: two
// reported fields in three holding registers, read in one poll a second,
// and a writable setpoint.
const pollBenchProfile = `model: bench-meter
poll_interval: 1s
fields:
  - {name: power, table: holding, address: 0, type: uint16}
  - {name: energy, table: holding, address: 1, type: uint32}
  - {name: limit, table: holding, address: 5, type: uint16, writable: true, poll_interval: never}
`

// BenchmarkModbusPollLoad puts 100 devices (units 1..100 of the Go slave)
// on one RTU line (the RS-485 simulator, paced at the baud rate), each
// polled every second under the default cap (poll_utilisation 0.5), and
// measures one command at a time to unit 1 under that load, 100 ms apart.
// It reports the command's p50/p99, the polls achieved per second (100
// would be every device every second), the polls' and the bus's share of
// the time, and each device's mean poll period.
func BenchmarkModbusPollLoad(b *testing.B) {
	for _, baud := range []int{9600, 115200} {
		b.Run(fmt.Sprintf("baud=%d", baud), func(b *testing.B) { benchPollLoad(b, baud, 100) })
	}
}

func benchPollLoad(b *testing.B, baud, n int) {
	line, err := sandbox.NewRS485(sandbox.RS485Config{Baud: baud, Drops: 1, Dir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer line.Close()
	units := legacy.Units{}
	for u := 1; u <= n; u++ {
		units[byte(u)] = legacy.NewRegisters("u"+itoa(u), 8, nil)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done, err := line.ServeSlave(ctx, 0, &legacy.Slave{Units: units})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { cancel(); <-done }()
	prof, err := profile.Parse([]byte(pollBenchProfile), "bench-meter.yaml")
	if err != nil {
		b.Fatal(err)
	}
	devs := make([]Device, n)
	for i := range devs {
		devs[i] = Device{ID: "m-" + itoa(i+1), Modbus: &ModbusUnit{Bus: "rs485", Unit: byte(i + 1), Profile: prof}}
	}
	tbl, err := fence.OpenTable(filepath.Join(b.TempDir(), "fence.db"), nil)
	if err != nil {
		b.Fatal(err)
	}
	r := startMbRig(b, tbl, []Bus{{BusConfig: modbus.BusConfig{Name: "rs485", RTU: &serial.PortConfig{Path: line.Master, Baud: baud}}}}, devs)
	time.Sleep(2 * time.Second) // the pollers settle into their rhythm
	before, start := r.br.Buses()[0], time.Now()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		t0 := time.Now()
		if a := r.send("m-1", 1, uint64(i+1), KindTwinSet, twinSet(b, map[string]any{"limit": i})); a.Verdict != fence.Accepted {
			b.Fatalf("%+v", a)
		}
		lat = append(lat, time.Since(t0))
		time.Sleep(100 * time.Millisecond)
	}
	b.StopTimer()
	after, elapsed := r.br.Buses()[0], time.Since(start).Seconds()
	slices.Sort(lat)
	polls := float64(after.Polls - before.Polls)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
	b.ReportMetric(polls/elapsed, "polls/s")
	b.ReportMetric(float64(n)*elapsed/polls, "s/poll-period")
	b.ReportMetric((after.PollBusy-before.PollBusy).Seconds()/elapsed, "poll-share")
	b.ReportMetric((after.Stats.Busy-before.Stats.Busy).Seconds()/elapsed, "bus-share")
}
