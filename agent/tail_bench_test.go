package agent

import (
	"testing"
	"time"
)

// BenchmarkTailObserve is the cost of one sample of a lease-threat meter
// (stall, keep-alive round trip, fsync): the Prometheus histogram and the
// window's slot.
//
//	go test ./agent -run '^$' -bench 'Tail(Observe|Status)'
func BenchmarkTailObserve(b *testing.B) {
	s := newTailSeries("bench_seconds", "bench")
	now := time.Now()
	for b.Loop() {
		s.observe(3*time.Millisecond, now)
	}
}

// BenchmarkTailStatus is the cost of the summary (status, each scrape,
// and the warning's check every second): the window of three meters.
func BenchmarkTailStatus(b *testing.B) {
	t := newTails()
	t.fsyncOn = true
	now := time.Now()
	for range 1000 {
		t.stall.observe(time.Millisecond, now)
		t.keepAlive.observe(time.Millisecond, now)
		t.fsync.observe(time.Millisecond, now)
	}
	for b.Loop() {
		_ = t.status(10*time.Second, now)
	}
}
