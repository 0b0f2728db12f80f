// Package hiccup is a hiccup meter: a goroutine that sleeps a fixed
// interval at a time and reports how late it woke. Lateness is what every
// goroutine of the process suffered at that moment: CPU starvation, GC
// stop-the-world pauses, a process frozen by SIGSTOP or a VM paused, swap.
// The idea is Gil Tene's jHiccup; the cost is one timer wake per interval.
package hiccup

import (
	"context"
	"time"
)

// Run wakes every interval until ctx ends and calls observe with how late
// each wake was (0 or more) and when it ran. It measures real time (the
// monotonic clock), never an injected one: what it measures is the
// scheduler. observe runs on Run's goroutine; a slow observe is measured
// as lateness of the next wake only if it delays the timer's reset, which
// it does not: the next interval starts after observe returns.
func Run(ctx context.Context, interval time.Duration, observe func(late time.Duration, now time.Time)) {
	t := time.NewTimer(interval)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// Not the channel's value: that is when the timer fired, not
		// when this goroutine got to run.
		now := time.Now()
		observe(max(now.Sub(last)-interval, 0), now)
		last = time.Now()
		t.Reset(interval)
	}
}
