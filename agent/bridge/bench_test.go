package bridge

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/transport/modbus"
)

// BenchmarkBridgeCommand measures one fenced command to a legacy device
// through the home gateway, sequentially: holder → broker → bridge (decode,
// fence table admit with fsync) → serial link over a real pty → device →
// ack → broker → holder. Reports p50/p99 and the admit (table) p50/p99.
func BenchmarkBridgeCommand(b *testing.B) {
	r := newRig(b)
	r.startBridge(filepath.Join(b.TempDir(), "fence.db"), os.Getenv("BENCH_NO_TABLE") != "")
	body, err := fence.EncodeBody(map[string]any{"addr": 0, "value": 1})
	if err != nil {
		b.Fatal(err)
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		env := &fence.Envelope{V: fence.Version, Device: "plc-1", Token: 1, Seq: uint64(i + 1), ID: "b" + itoa(i),
			Kind: modbus.KindWriteRegister, Body: body}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		start := time.Now()
		ack, err := r.cmdr.Send(ctx, env)
		lat = append(lat, time.Since(start))
		cancel()
		if err != nil || ack.Verdict != fence.Accepted {
			b.Fatalf("%v %v", ack, err)
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

func itoa(i int) string {
	const digits = "0123456789"
	if i == 0 {
		return "0"
	}
	var buf [20]byte
	n := len(buf)
	for ; i > 0; i /= 10 {
		n--
		buf[n] = digits[i%10]
	}
	return string(buf[n:])
}
