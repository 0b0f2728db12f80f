package backoff

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"go.uber.org/goleak"
	"pgregory.net/rapid"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// low and high make every draw the lowest or the highest it can be.
func low(int64) int64    { return 0 }
func high(n int64) int64 { return n - 1 }

func TestDelay(t *testing.T) {
	const ms = time.Millisecond
	for _, tc := range []struct {
		name     string
		b        Backoff
		n        int
		min, max time.Duration // the draw with low, and with high
	}{
		// The MQTT reconnect (250 ms to 10 s, full jitter).
		{"mqtt 0", Backoff{Min: 250 * ms, Max: 10 * time.Second}, 0, 250 * ms, 500 * ms},
		{"mqtt 1", Backoff{Min: 250 * ms, Max: 10 * time.Second}, 1, 250 * ms, time.Second},
		{"mqtt 2", Backoff{Min: 250 * ms, Max: 10 * time.Second}, 2, 250 * ms, 2 * time.Second},
		{"mqtt 3", Backoff{Min: 250 * ms, Max: 10 * time.Second}, 3, 250 * ms, 4 * time.Second},
		{"mqtt 4", Backoff{Min: 250 * ms, Max: 10 * time.Second}, 4, 250 * ms, 8 * time.Second},
		{"mqtt 5", Backoff{Min: 250 * ms, Max: 10 * time.Second}, 5, 250 * ms, 10 * time.Second},
		{"mqtt 6", Backoff{Min: 250 * ms, Max: 10 * time.Second}, 6, 250 * ms, 10 * time.Second},
		{"mqtt huge n", Backoff{Min: 250 * ms, Max: 10 * time.Second}, 1 << 20, 250 * ms, 10 * time.Second},
		// The serial reopen (100 ms to 5 s, full jitter).
		{"serial 0", Backoff{Min: 100 * ms, Max: 5 * time.Second}, 0, 100 * ms, 200 * ms},
		{"serial 4", Backoff{Min: 100 * ms, Max: 5 * time.Second}, 4, 100 * ms, 3200 * ms},
		{"serial 5", Backoff{Min: 100 * ms, Max: 5 * time.Second}, 5, 100 * ms, 5 * time.Second},
		{"serial 1000", Backoff{Min: 100 * ms, Max: 5 * time.Second}, 1000, 100 * ms, 5 * time.Second},
		// The campaign after a refusal: 1 s doubling to 30 s, half of it random.
		{"refusal 0", Backoff{Min: 500 * ms, Max: 30 * time.Second, Jitter: Equal}, 0, 500 * ms, time.Second},
		{"refusal 1", Backoff{Min: 500 * ms, Max: 30 * time.Second, Jitter: Equal}, 1, time.Second, 2 * time.Second},
		{"refusal 4", Backoff{Min: 500 * ms, Max: 30 * time.Second, Jitter: Equal}, 4, 8 * time.Second, 16 * time.Second},
		{"refusal 5", Backoff{Min: 500 * ms, Max: 30 * time.Second, Jitter: Equal}, 5, 15 * time.Second, 30 * time.Second},
		{"refusal 40", Backoff{Min: 500 * ms, Max: 30 * time.Second, Jitter: Equal}, 40, 15 * time.Second, 30 * time.Second},
		// Edges.
		{"equal never below Min", Backoff{Min: time.Second, Max: 1500 * ms, Jitter: Equal}, 0, time.Second, 1500 * ms},
		{"Min == Max", Backoff{Min: time.Second, Max: time.Second}, 3, time.Second, time.Second},
		{"Max below Min", Backoff{Min: time.Second, Max: ms}, 3, time.Second, time.Second},
		{"Max zero", Backoff{Min: time.Second}, 3, time.Second, time.Second},
		{"zero value", Backoff{}, 0, 0, 0},
		{"Min zero", Backoff{Max: time.Second}, 0, 0, time.Second},
		{"Min negative", Backoff{Min: -time.Second, Max: time.Second}, 0, 0, time.Second},
		{"n negative", Backoff{Min: time.Second, Max: time.Minute}, -5, time.Second, 2 * time.Second},
		{"overflow", Backoff{Min: 1, Max: 1 << 62}, 200, 1, 1 << 62},
		{"overflow equal", Backoff{Min: 1, Max: 1<<63 - 1, Jitter: Equal}, 200, (1<<63 - 1) / 2, 1<<63 - 1},
	} {
		lo, hi := tc.b, tc.b
		lo.Rand, hi.Rand = low, high
		if got := lo.Delay(tc.n); got != tc.min {
			t.Errorf("%s: Delay(%d) drawn lowest = %v, want %v", tc.name, tc.n, got, tc.min)
		}
		if got := hi.Delay(tc.n); got != tc.max {
			t.Errorf("%s: Delay(%d) drawn highest = %v, want %v", tc.name, tc.n, got, tc.max)
		}
	}
}

// TestDelayWithinBounds: whatever the bounds, the jitter, the retry and the
// random draws, every delay lies in [Min, Max] (Max below Min counting as
// Min), and below the retry's ceiling Min·2ⁿ⁺¹.
func TestDelayWithinBounds(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		b := Backoff{
			Min:    time.Duration(rapid.Int64Range(1, int64(time.Hour)).Draw(t, "min")),
			Max:    time.Duration(rapid.Int64Range(0, 1<<63-1).Draw(t, "max")),
			Jitter: Jitter(rapid.IntRange(0, 1).Draw(t, "jitter")),
		}
		seed := rapid.Uint64().Draw(t, "seed")
		r := rand.New(rand.NewPCG(seed, seed))
		b.Rand = func(n int64) int64 {
			if n <= 0 {
				t.Fatalf("Rand(%d): not positive", n)
			}
			return r.Int64N(n)
		}
		hi := max(b.Max, b.Min)
		for _, n := range rapid.SliceOfN(rapid.IntRange(-3, 200), 1, 20).Draw(t, "retries") {
			d := b.Delay(n)
			if d < b.Min || d > hi {
				t.Fatalf("Delay(%d) = %v outside [%v, %v]", n, d, b.Min, hi)
			}
			if n >= 0 && n < 62 && b.Min <= hi>>(n+1) && d > b.Min<<(n+1) {
				t.Fatalf("Delay(%d) = %v above the ceiling %v", n, d, b.Min<<(n+1))
			}
		}
	})
}

func TestNextReset(t *testing.T) {
	b := Backoff{Min: 100 * time.Millisecond, Max: 5 * time.Second, Rand: high}
	want := []time.Duration{200, 400, 800, 1600, 3200, 5000, 5000}
	for i, w := range want {
		if got := b.Next(); got != w*time.Millisecond {
			t.Errorf("Next #%d = %v, want %v", i, got, w*time.Millisecond)
		}
	}
	for range 1000 {
		b.Next()
	}
	if got := b.Next(); got != 5*time.Second {
		t.Errorf("after many retries: %v", got)
	}
	b.Reset()
	if got := b.Next(); got != 200*time.Millisecond {
		t.Errorf("Next after Reset = %v, want 200ms", got)
	}
}

// TestDefaultRand: without Rand the draws are random and within bounds.
func TestDefaultRand(t *testing.T) {
	b := Backoff{Min: time.Millisecond, Max: time.Hour}
	seen := map[time.Duration]bool{}
	for range 100 {
		d := b.Delay(30)
		if d < b.Min || d > b.Max {
			t.Fatalf("Delay = %v outside [%v, %v]", d, b.Min, b.Max)
		}
		seen[d] = true
	}
	if len(seen) < 50 {
		t.Errorf("100 draws from [1ms, 1h] gave %d distinct delays", len(seen))
	}
}

func TestSleep(t *testing.T) {
	if !Sleep(context.Background(), time.Millisecond) {
		t.Error("Sleep with a live context: false")
	}
	if !Sleep(context.Background(), 0) {
		t.Error("Sleep(0) with a live context: false")
	}
	done, cancel := context.WithCancel(context.Background())
	cancel()
	for _, d := range []time.Duration{0, -time.Second, time.Hour} {
		if Sleep(done, d) {
			t.Errorf("Sleep(%v) with an ended context: true", d)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	go cancel()
	if Sleep(ctx, time.Hour) {
		t.Error("Sleep through a cancel: true")
	}
}

// BenchmarkNext: one delay, with a Reset every resetEvery retries (0: never,
// so that every ceiling is Max).
func BenchmarkNext(b *testing.B) {
	for _, bc := range []struct {
		name       string
		bo         Backoff
		resetEvery int
	}{
		{"full", Backoff{Min: 100 * time.Millisecond, Max: 5 * time.Second}, 8},
		{"equal", Backoff{Min: 500 * time.Millisecond, Max: 30 * time.Second, Jitter: Equal}, 8},
		{"full-at-max", Backoff{Min: 100 * time.Millisecond, Max: 5 * time.Second}, 0},
	} {
		b.Run(bc.name, func(b *testing.B) {
			bo := bc.bo
			var sum time.Duration
			for i := 1; b.Loop(); i++ {
				if bc.resetEvery > 0 && i%bc.resetEvery == 0 {
					bo.Reset()
				}
				sum += bo.Next()
			}
			if sum < 0 {
				b.Fatal(sum)
			}
		})
	}
}

// Retries of an operation that fails three times, then succeeds and fails
// again: each retry's ceiling doubles from twice Min, and Reset starts over.
func ExampleBackoff() {
	b := Backoff{Min: 100 * time.Millisecond, Max: time.Second,
		Rand: func(n int64) int64 { return n - 1 }} // always the ceiling, to print
	for range 3 {
		fmt.Println(b.Next())
	}
	b.Reset()
	fmt.Println(b.Next())
	// Output:
	// 200ms
	// 400ms
	// 800ms
	// 200ms
}
