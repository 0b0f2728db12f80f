// Package hrtimer waits for short, exact delays: the silences of a serial
// line (Modbus RTU's t3.5 is 1.75 ms above 19,200 baud), where Go's own
// timers wake up to a millisecond late.
//
// Go's runtime on Linux waits for its timers in epoll_wait, whose timeout
// counts whole milliseconds: a delay under 1 ms becomes 1 ms, 1.75 ms
// becomes 1 ms and then another 1 ms. A Timer on Linux is a timerfd
// (CLOCK_MONOTONIC) registered with the runtime's network poller: the
// waiting goroutine is parked, holds no P and burns no CPU, and epoll
// returns when the kernel's high-resolution timer fires, whatever Go's
// rounding. Elsewhere, or where a timerfd cannot be had, a Timer is a
// time.Timer (Precise reports which).
//
// A Timer belongs to one goroutine, which calls Wait and Until one at a
// time; Close may come from any goroutine, and ends a wait in progress.
// Each Timer holds one file descriptor until Close and starts no goroutine
// of its own.
package hrtimer

import (
	"context"
	"errors"
	"time"
)

// ErrClosed is returned by a wait on a closed Timer, or one that Close
// ended.
var ErrClosed = errors.New("hrtimer: timer closed")

// waiter is a Timer's mechanism: a timerfd, or a time.Timer.
type waiter interface {
	wait(ctx context.Context, d time.Duration) error
	close() error
}

// Timer waits for exact delays. The zero value is not usable: call New.
type Timer struct {
	w       waiter
	precise bool
	// Err is why the Timer is not precise on a system that has timerfds
	// (nil when it is, or when the system has none): for the owner's log.
	Err error
}

// New returns a Timer: a timerfd on Linux, a time.Timer where the system
// has none or refuses one (Timer.Err says why).
func New() *Timer {
	w, err := newTimerfd()
	if err != nil {
		t := &Timer{w: newSleeper()}
		if !errors.Is(err, errUnsupported) {
			t.Err = err
		}
		return t
	}
	return &Timer{w: w, precise: true}
}

// Precise reports whether the Timer waits on the kernel's high-resolution
// timer (a timerfd) rather than Go's millisecond-rounded one.
func (t *Timer) Precise() bool { return t.precise }

// Wait returns after d (at once if d <= 0), or with ctx's error if ctx
// ends first, or ErrClosed. A wait is never shorter than d.
func (t *Timer) Wait(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d <= 0 {
		return nil
	}
	return t.w.wait(ctx, d)
}

// Until is Wait until the time at (by the monotonic clock when at has a
// monotonic reading, as time.Now's do).
func (t *Timer) Until(ctx context.Context, at time.Time) error {
	return t.Wait(ctx, time.Until(at))
}

// Close releases the Timer's file descriptor and ends a wait in progress
// with ErrClosed. It is idempotent.
func (t *Timer) Close() error { return t.w.close() }
