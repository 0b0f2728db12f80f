package modbus_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/edgefence/edgefence/devices/legacy"
	"github.com/edgefence/edgefence/internal/modbustest"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/transport/modbus"
	"github.com/edgefence/edgefence/transport/serial"
)

// lineOps are the transactions the line-rate benchmark runs.
var lineOps = []struct {
	name string
	q    modbus.Request
}{
	{"read1", modbus.Request{Func: modbus.FuncReadHolding, Addr: 3, Count: 1}},
	{"write1", modbus.Request{Func: modbus.FuncWriteSingle, Addr: 3, Values: []uint16{42}}},
}

// newLine is an RS-485 line (8N1 unless cfg says otherwise) in a temp
// dir, closed when the test ends.
func newLine(tb testing.TB, cfg sandbox.RS485Config) *sandbox.RS485 {
	tb.Helper()
	cfg.Dir = tb.TempDir()
	l, err := sandbox.NewRS485(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { l.Close() })
	return l
}

// serveGo runs the Go slave (devices/legacy) for unit 1 on the line's
// drop 0 until the test ends.
func serveGo(tb testing.TB, l *sandbox.RS485, regs *legacy.Registers) *legacy.Slave {
	tb.Helper()
	s := &legacy.Slave{Units: legacy.Units{1: regs}}
	ctx, cancel := context.WithCancel(context.Background())
	done, err := l.ServeSlave(ctx, 0, s)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			tb.Errorf("slave: %v", err)
		}
	})
	return s
}

// BenchmarkBusRTULineRate: the bus master on the master end of a paced
// RS-485 line (internal/sandbox.RS485, 8N1: 10 bits a character) and a
// slave on a drop: the Go slave (devices/legacy), then pymodbus, at 9,600
// and 115,200 baud; 1-register reads (0x03) and writes (0x06), one at a
// time. It reports tx/s, the line's limit (sandbox.RTULimit: frames and
// the two t3.5 silences) and their ratio; docs/BENCHMARKS.md records them:
//
//	go test -run '^$' -bench BusRTULineRate -benchtime 300x ./transport/modbus/
func BenchmarkBusRTULineRate(b *testing.B) {
	for _, baud := range []int{9600, 115200} {
		for _, slave := range []string{"go", "pymodbus"} {
			b.Run(fmt.Sprintf("%d/%s", baud, slave), func(b *testing.B) {
				l := newLine(b, sandbox.RS485Config{Baud: baud, Drops: 1})
				if slave == "go" {
					serveGo(b, l, legacy.NewRegisters("u1", 16, nil))
				} else {
					modbustest.StartRTU(b, l.Drops[0], modbustest.Options{Units: []byte{1}, Baud: baud})
				}
				bus, err := modbus.OpenBus(modbus.BusConfig{Name: "bench", RTU: &serial.PortConfig{Path: l.Master, Baud: baud}})
				if err != nil {
					b.Fatal(err)
				}
				defer bus.Close()
				for _, op := range lineOps {
					b.Run(op.name, func(b *testing.B) {
						r, err := l.MeasureLineRate(context.Background(), bus, 1, &op.q, op.name, b.N)
						if err != nil {
							b.Fatal(err)
						}
						b.ReportMetric(r.TxPerSec(), "tx/s")
						b.ReportMetric(r.LimitTxPerSec(), "limit-tx/s")
						b.ReportMetric(r.Ratio(), "ratio")
						b.ReportMetric(float64(r.Errors), "errors")
						b.ReportMetric(float64(r.CPUPerTx().Microseconds()), "cpu-µs/tx")
					})
				}
			})
		}
	}
}
