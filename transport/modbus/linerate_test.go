package modbus_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/edgefence/edgefence/devices/legacy"
	"github.com/edgefence/edgefence/internal/cputime"
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

// The environment that makes TestBusCPUChild the bus process of
// BenchmarkBusRTUCPU.
const (
	cpuChildPort = "EDGEFENCE_BUSCPU_PORT"
	cpuChildBaud = "EDGEFENCE_BUSCPU_BAUD"
	cpuChildN    = "EDGEFENCE_BUSCPU_N"
)

// BenchmarkBusRTUCPU: the CPU a gateway spends on an RTU transaction, in a
// process that runs the bus master alone (this test binary again, as
// TestBusCPUChild) against the paced line and the Go slave run by the
// benchmark's own process; 1-register reads, one at a time. It reports the
// bus process's CPU (user + system, getrusage) per transaction, the line
// and slave's (this process's), and tx/s against the line's limit:
//
//	go test -run '^$' -bench BusRTUCPU -benchtime 1000x ./transport/modbus/
func BenchmarkBusRTUCPU(b *testing.B) {
	for _, baud := range []int{9600, 115200} {
		b.Run(strconv.Itoa(baud), func(b *testing.B) {
			l := newLine(b, sandbox.RS485Config{Baud: baud, Drops: 1})
			serveGo(b, l, legacy.NewRegisters("u1", 16, nil))
			cmd := exec.CommandContext(b.Context(), os.Args[0], "-test.run=^TestBusCPUChild$", "-test.count=1")
			cmd.Env = append(os.Environ(), cpuChildPort+"="+l.Master, cpuChildBaud+"="+strconv.Itoa(baud), cpuChildN+"="+strconv.Itoa(b.N))
			rig := cputime.Process()
			out, err := cmd.Output()
			rig = cputime.Process() - rig
			if err != nil {
				b.Fatalf("bus process: %v\n%s", err, out)
			}
			var n, errs int
			var elapsed, cpu time.Duration
			if _, err := fmt.Sscanf(string(out), "buscpu %d %d %d %d", &n, &errs, &elapsed, &cpu); err != nil {
				b.Fatalf("bus process said %q: %v", out, err)
			}
			limit, err := sandbox.RTULimit(baud, l.CharTime(), 8, 7)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(n)/elapsed.Seconds(), "tx/s")
			b.ReportMetric(float64(limit*time.Duration(n))/float64(elapsed), "ratio")
			b.ReportMetric(float64(cpu.Microseconds())/float64(n), "bus-cpu-µs/tx")
			b.ReportMetric(float64(rig.Microseconds())/float64(n), "rig-cpu-µs/tx")
			b.ReportMetric(float64(errs), "errors")
		})
	}
}

// TestBusCPUChild is BenchmarkBusRTUCPU's bus process: it skips unless the
// benchmark started it. It runs the transactions and prints how many, how
// many failed (a tenth failing fails it, as in MeasureLineRate), how long
// they took and its CPU time over them, in nanoseconds.
func TestBusCPUChild(t *testing.T) {
	port := os.Getenv(cpuChildPort)
	if port == "" {
		t.Skip("the bus process of BenchmarkBusRTUCPU")
	}
	baud, berr := strconv.Atoi(os.Getenv(cpuChildBaud))
	n, nerr := strconv.Atoi(os.Getenv(cpuChildN))
	if berr != nil || nerr != nil {
		t.Fatalf("bad %s or %s: %v, %v", cpuChildBaud, cpuChildN, berr, nerr)
	}
	bus, err := modbus.OpenBus(modbus.BusConfig{Name: "cpu", RTU: &serial.PortConfig{Path: port, Baud: baud}})
	if err != nil {
		t.Fatal(err)
	}
	defer bus.Close()
	q := &modbus.Request{Func: modbus.FuncReadHolding, Addr: 3, Count: 1}
	ctx := context.Background()
	for range 3 { // the port open, the slave past its first frame
		if _, err := bus.Transact(ctx, 1, q); err != nil {
			t.Fatalf("warm-up: %v", err)
		}
	}
	errs := 0
	start, cpu := time.Now(), cputime.Process()
	for i := range n {
		if _, err := bus.Transact(ctx, 1, q); err != nil {
			t.Logf("transaction %d: %v", i, err)
			if errs++; errs > n/10 {
				t.Fatalf("%d of %d transactions failed", errs, i+1)
			}
		}
	}
	elapsed, cpu := time.Since(start), cputime.Process()-cpu
	fmt.Printf("buscpu %d %d %d %d\n", n, errs, elapsed.Nanoseconds(), cpu.Nanoseconds())
}
