package offline_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/offline"
)

// BenchmarkAppend measures durable appends: one fsynced bbolt commit each,
// from one goroutine, round-robin over 16 devices.
func BenchmarkAppend(b *testing.B) {
	ob := open(b, dbPath(b), &offline.Options{MaxTotal: 1 << 30, MaxPerDevice: 1 << 30, MaxTotalBytes: 1 << 40, MaxBytesPerDevice: 1 << 40})
	ctx := context.Background()
	i := 0
	for b.Loop() {
		e := entry(fmt.Sprintf("dev-%d", i%16), fmt.Sprintf("c-%d", i), 1, uint64(i+1))
		if err := ob.Append(ctx, e); err != nil {
			b.Fatal(err)
		}
		i++
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "appends/s")
}

// BenchmarkResolve measures durable resolves (one fsynced commit each) of
// entries appended before the timer started.
func BenchmarkResolve(b *testing.B) {
	ob := open(b, dbPath(b), &offline.Options{MaxTotal: 1 << 30, MaxPerDevice: 1 << 30, MaxTotalBytes: 1 << 40, MaxBytesPerDevice: 1 << 40})
	ctx := context.Background()
	var acks []*fence.Ack
	for i := range b.N {
		e := entry(fmt.Sprintf("dev-%d", i%16), fmt.Sprintf("c-%d", i), 1, uint64(i+1))
		if err := ob.Append(ctx, e); err != nil {
			b.Fatal(err)
		}
		acks = append(acks, ack(e, fence.Accepted, ""))
	}
	b.ResetTimer()
	for i := range b.N {
		if err := ob.Resolve(acks[i].ID, acks[i]); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "resolves/s")
}
