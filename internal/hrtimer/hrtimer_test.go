package hrtimer

import (
	"context"
	"errors"
	"os"
	"runtime"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// No Timer leaves a goroutine behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// timers is one Timer of each kind this system has: the precise one (on
// Linux) and the time.Timer fallback.
func timers(t *testing.T) map[string]*Timer {
	t.Helper()
	out := map[string]*Timer{"sleeper": {w: newSleeper()}}
	p := New()
	if runtime.GOOS == "linux" && !p.Precise() {
		t.Fatalf("no timerfd on Linux: %v", p.Err)
	}
	if p.Precise() {
		out["timerfd"] = p
	} else {
		p.Close()
	}
	for _, tm := range out {
		t.Cleanup(func() { tm.Close() })
	}
	return out
}

// A wait is never shorter than asked, and a Timer serves wait after wait.
func TestWaitNeverEarly(t *testing.T) {
	for name, tm := range timers(t) {
		t.Run(name, func(t *testing.T) {
			for _, d := range []time.Duration{0, -time.Second, time.Nanosecond, 50 * time.Microsecond, 1750 * time.Microsecond, 3 * time.Millisecond} {
				for range 5 {
					start := time.Now()
					if err := tm.Wait(context.Background(), d); err != nil {
						t.Fatalf("Wait(%v): %v", d, err)
					}
					if got := time.Since(start); got < d {
						t.Fatalf("Wait(%v) returned after %v", d, got)
					}
				}
			}
			at := time.Now().Add(time.Millisecond)
			if err := tm.Until(context.Background(), at); err != nil {
				t.Fatal(err)
			}
			if now := time.Now(); now.Before(at) {
				t.Fatalf("Until returned %v early", at.Sub(now))
			}
		})
	}
}

// A cancel ends a wait with ctx's error, and the next wait is whole: the
// cancel's deadline and the armed timer are both cleared.
func TestWaitCancelled(t *testing.T) {
	for name, tm := range timers(t) {
		t.Run(name, func(t *testing.T) {
			for range 3 {
				ctx, cancel := context.WithCancel(context.Background())
				errc := make(chan error, 1)
				go func() { errc <- tm.Wait(ctx, time.Hour) }()
				cancel()
				if err := <-errc; !errors.Is(err, context.Canceled) {
					t.Fatalf("cancelled Wait: %v, want context.Canceled", err)
				}
				d := 2 * time.Millisecond
				start := time.Now()
				if err := tm.Wait(context.Background(), d); err != nil {
					t.Fatalf("Wait after a cancel: %v", err)
				}
				if got := time.Since(start); got < d {
					t.Fatalf("Wait(%v) after a cancel returned after %v", d, got)
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			if err := tm.Wait(ctx, 0); !errors.Is(err, context.Canceled) {
				t.Fatalf("Wait on an ended ctx: %v", err)
			}
			ctx, cancel = context.WithTimeout(context.Background(), 5*time.Millisecond)
			defer cancel()
			if err := tm.Wait(ctx, time.Hour); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Wait past ctx's deadline: %v", err)
			}
		})
	}
}

// Close ends a wait in progress, from another goroutine, and every later
// wait fails with ErrClosed.
func TestCloseEndsWait(t *testing.T) {
	for name, tm := range timers(t) {
		t.Run(name, func(t *testing.T) {
			errc := make(chan error, 1)
			started := make(chan struct{})
			go func() {
				close(started)
				errc <- tm.Wait(context.Background(), time.Hour)
			}()
			<-started
			// The wait may not have begun yet: either way it ends.
			if err := tm.Close(); err != nil {
				t.Fatal(err)
			}
			if err := <-errc; !errors.Is(err, ErrClosed) {
				t.Fatalf("Wait ended by Close: %v, want ErrClosed", err)
			}
			if err := tm.Wait(context.Background(), time.Millisecond); !errors.Is(err, ErrClosed) {
				t.Fatalf("Wait after Close: %v", err)
			}
			if err := tm.Close(); err != nil {
				t.Fatalf("second Close: %v", err)
			}
		})
	}
}

// A precise Timer holds one descriptor, and Close gives it back.
func TestOneDescriptorPerTimer(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("timerfd is Linux's")
	}
	before := openFDs(t)
	var ts []*Timer
	for range 10 {
		ts = append(ts, New())
	}
	if got := openFDs(t) - before; got != 10 {
		t.Errorf("10 Timers hold %d descriptors", got)
	}
	for _, tm := range ts {
		if err := tm.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if got := openFDs(t) - before; got != 0 {
		t.Errorf("%d descriptors left after Close", got)
	}
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}
