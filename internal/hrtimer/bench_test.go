package hrtimer

import (
	"slices"
	"testing"
	"time"

	"github.com/edgefence/edgefence/internal/cputime"
)

// BenchmarkWait: how late a wait returns, and the process's CPU a wait
// costs, for a precise Timer (timerfd), the fallback (time.Timer) and
// time.Sleep, at 50 µs and at Modbus RTU's t3.5 above 19,200 baud
// (1.75 ms). docs/BENCHMARKS.md records them:
//
//	go test -run '^$' -bench Wait -benchtime 2000x ./internal/hrtimer/
func BenchmarkWait(b *testing.B) {
	ctx := b.Context()
	kinds := []struct {
		name string
		wait func(*Timer, time.Duration)
		tm   func() *Timer
	}{
		{"timerfd", func(t *Timer, d time.Duration) { _ = t.Wait(ctx, d) }, New},
		{"time.Timer", func(t *Timer, d time.Duration) { _ = t.Wait(ctx, d) }, func() *Timer { return &Timer{w: newSleeper()} }},
		{"time.Sleep", func(_ *Timer, d time.Duration) { time.Sleep(d) }, func() *Timer { return &Timer{w: newSleeper()} }},
	}
	for _, k := range kinds {
		for _, d := range []time.Duration{50 * time.Microsecond, 1750 * time.Microsecond} {
			b.Run(k.name+"/"+d.String(), func(b *testing.B) {
				tm := k.tm()
				defer tm.Close()
				if k.name == "timerfd" && !tm.Precise() {
					b.Skipf("no timerfd: %v", tm.Err)
				}
				late := make([]time.Duration, 0, b.N)
				cpu0 := cputime.Process()
				b.ResetTimer()
				for range b.N {
					start := time.Now()
					k.wait(tm, d)
					late = append(late, time.Since(start)-d)
				}
				b.StopTimer()
				used := cputime.Process() - cpu0
				slices.Sort(late)
				b.ReportMetric(float64(late[len(late)/2].Microseconds()), "late-p50-µs")
				b.ReportMetric(float64(late[len(late)*99/100].Microseconds()), "late-p99-µs")
				b.ReportMetric(float64(used.Microseconds())/float64(b.N), "cpu-µs/op")
			})
		}
	}
}
