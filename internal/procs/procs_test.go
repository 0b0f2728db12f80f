package procs

import (
	"context"
	"io"
	"log/slog"
	"runtime"
	"sync"
	"testing"
	"time"
)

// TestDecide holds the rule: one processor until a look finds most of one
// core used, then every one until ten looks in a row find little used.
func TestDecide(t *testing.T) {
	for _, c := range []struct {
		name             string
		cur, max         int
		cores            float64
		quiet            int
		next, quietAfter int
	}{
		{"one, idle", 1, 4, 0.01, 0, 1, 0},
		{"one, busy below the bar", 1, 4, 0.69, 0, 1, 0},
		{"one, at the bar", 1, 4, RaiseAt, 0, 4, 0},
		{"one, saturated", 1, 4, 1.3, 0, 4, 0},
		{"all, busy", 4, 4, 2.5, 0, 4, 0},
		{"all, between the bars", 4, 4, 0.5, 7, 4, 0},
		{"all, first quiet look", 4, 4, 0.1, 0, 4, 1},
		{"all, ninth quiet look", 4, 4, 0.1, QuietLooks - 2, 4, QuietLooks - 1},
		{"all, tenth quiet look", 4, 4, 0.1, QuietLooks - 1, 1, 0},
		{"all, just under the low bar", 2, 2, LowerAt - 0.01, QuietLooks - 1, 1, 0},
		{"all, at the low bar", 2, 2, LowerAt, QuietLooks - 1, 2, 0},
		{"one CPU", 1, 1, 5, 0, 1, 0},
		{"quota below one", 1, 0, 5, 0, 0, 0},
	} {
		next, q := Decide(c.cur, c.max, c.cores, c.quiet)
		if next != c.next || q != c.quietAfter {
			t.Errorf("%s: Decide(%d, %d, %v, %d) = %d, %d; want %d, %d", c.name, c.cur, c.max, c.cores, c.quiet, next, q, c.next, c.quietAfter)
		}
	}
}

// scripted is a Governor over a scripted CPU meter whose settings are
// recorded in *applied, governing (as under Run) at one processor of max.
func scripted(max int, applied *[]int) *Governor {
	g := &Governor{log: slog.New(slog.NewTextHandler(io.Discard, nil)), max: max,
		set: func(n int) int { *applied = append(*applied, n); return n }, bursts: make(chan struct{}, 1)}
	g.cur.Store(1)
	return g
}

// TestLooks: a Governor over a scripted CPU meter raises on the first busy
// second, stays through nine quiet ones and a busy one that restarts the
// count, and lowers on the tenth quiet look in a row.
func TestLooks(t *testing.T) {
	var applied []int
	g := scripted(2, &applied)
	look := func(cpu time.Duration) { g.look(cpu, time.Second) }
	look(100 * time.Millisecond)
	look(800 * time.Millisecond) // raise
	for range QuietLooks - 1 {
		look(50 * time.Millisecond)
	}
	look(time.Second) // busy: the quiet count starts again
	for range QuietLooks - 1 {
		look(50 * time.Millisecond)
	}
	if g.Procs() != 2 {
		t.Fatalf("after %d quiet looks following a busy one: %d processors, want 2", QuietLooks-1, g.Procs())
	}
	look(50 * time.Millisecond) // the tenth: lower
	if g.Procs() != 1 || len(applied) != 2 || applied[0] != 2 || applied[1] != 1 {
		t.Fatalf("processors %d, applied %v; want 1 and [2 1]", g.Procs(), applied)
	}
	if g.Raises() != 1 {
		t.Fatalf("Raises() = %d, want 1", g.Raises())
	}
	g.look(time.Second, 0)
	if g.Procs() != 1 || len(applied) != 2 {
		t.Fatalf("a look of no wall time changed the setting: processors %d, applied %v", g.Procs(), applied)
	}
}

// TestBurst: a burst raises at once and starts the quiet count again, so
// the ten quiet seconds count from the burst; at every processor it
// changes nothing else.
func TestBurst(t *testing.T) {
	var applied []int
	g := scripted(4, &applied)
	g.burst()
	if g.Procs() != 4 || len(applied) != 1 || g.Raises() != 1 {
		t.Fatalf("after a burst at one processor: %d processors, applied %v, raises %d; want 4, [4], 1", g.Procs(), applied, g.Raises())
	}
	for range QuietLooks - 1 {
		g.look(10*time.Millisecond, time.Second)
	}
	g.burst() // a second burst at every processor: no change, the count restarts
	for range QuietLooks - 1 {
		g.look(10*time.Millisecond, time.Second)
	}
	if g.Procs() != 4 || len(applied) != 1 {
		t.Fatalf("nine quiet looks after the second burst: %d processors, applied %v; want 4, [4]", g.Procs(), applied)
	}
	g.look(10*time.Millisecond, time.Second)
	if g.Procs() != 1 || len(applied) != 2 {
		t.Fatalf("the tenth quiet look: %d processors, applied %v; want 1, [4 1]", g.Procs(), applied)
	}
}

// TestBurstDoesNotWait: Burst returns while Run is busy applying a change
// (a stop-the-world waits for a collection in progress), many Bursts
// queue one request, and Run applies it.
func TestBurstDoesNotWait(t *testing.T) {
	var applied []int
	g := scripted(2, &applied)
	g.cpu = func() time.Duration { return 0 }
	hold, held := make(chan struct{}), make(chan struct{})
	first := sync.OnceFunc(func() {
		close(held)
		<-hold // a change that waits for a collection to end
	})
	g.set = func(n int) int {
		if n == 2 {
			first()
		}
		applied = append(applied, n)
		return n
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); g.Run(ctx) }()
	g.Burst()
	<-held // Run is applying it
	for range 5 {
		g.Burst() // none waits for Run
	}
	close(hold)
	for g.Procs() != 2 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done
	if g.Raises() > 2 || len(applied) < 3 || applied[0] != 1 || applied[1] != 2 || applied[len(applied)-1] != 2 {
		t.Fatalf("applied %v, raises %d: want one processor at the start, 2 on the burst, the default at the end", applied, g.Raises())
	}
}

// TestDefaultOfOne: a raise that finds the runtime's default down to one
// (a CPU quota lowered meanwhile) leaves the process on one and stops
// raising: no stop-the-world a second for nothing.
func TestDefaultOfOne(t *testing.T) {
	var applied []int
	g := scripted(2, &applied)
	g.set = func(n int) int { applied = append(applied, n); return 1 }
	for range 3 {
		g.look(time.Second, time.Second)
	}
	if g.Procs() != 1 || len(applied) != 1 || g.Max() != 1 {
		t.Fatalf("processors %d, applied %v, max %d; want 1, one try, max 1", g.Procs(), applied, g.Max())
	}
}

// TestRunSetsTheRuntime: Run puts the process on one processor, a busy
// look gives it the runtime's default, and the end of Run leaves the
// default in effect.
func TestRunSetsTheRuntime(t *testing.T) {
	before := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(before) })
	g := New(slog.New(slog.NewTextHandler(io.Discard, nil)))
	g.max = 2 // on a one-CPU machine too: the default is what a raise restores
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); g.Run(ctx) }()
	for runtime.GOMAXPROCS(0) != 1 || g.Procs() != 1 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done
	if n := runtime.GOMAXPROCS(0); n != before || g.Procs() != before {
		t.Fatalf("after Run: GOMAXPROCS %d, Procs %d; want the default %d", n, g.Procs(), before)
	}

	g = New(slog.New(slog.NewTextHandler(io.Discard, nil)))
	g.max = 2
	g.cur.Store(int64(g.set(1)))
	g.look(900*time.Millisecond, time.Second)
	if n := runtime.GOMAXPROCS(0); n != before || g.Procs() != before {
		t.Fatalf("after a busy look: GOMAXPROCS %d, Procs %d; want the default %d", n, g.Procs(), before)
	}
}
