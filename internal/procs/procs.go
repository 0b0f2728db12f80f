// Package procs runs the agent's Go code on one processor (GOMAXPROCS 1)
// while its work fits in one, and on the runtime's default — every CPU the
// process may use, or its cgroup's CPU quota — while it does not.
//
// A command sent one at a time costs the agent mostly thread wakes
// (docs/BENCHMARKS.md §77: ≈ 27 context switches a command at 1,000
// devices). With one processor, a goroutine that hands work to another
// leaves it in its own run queue, and the thread that runs it is the one
// already awake; with two, the scheduler wakes the idle one for it, and
// its monitor polls while either runs. One processor measured 8–26 % less
// CPU a command, a lower latency and 0.2–0.3 MiB less memory (§81). A
// burst — the takeover of many devices, a large fan-out, twin writes at
// their peak — can need more than one core where the machine has them:
// the Governor looks once a second and gives the process every processor
// after a second in which it used most of one, and goes back to one after
// ten seconds in which it used little.
package procs

import (
	"context"
	"log/slog"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/edgefence/edgefence/internal/cputime"
)

const (
	// Every is how often the Governor looks at the process's CPU time.
	Every = time.Second
	// RaiseAt: at one processor, a look in which the process used at least
	// this many cores (CPU time over wall time) gives it every processor:
	// its one processor is busy most of the time, and work waits for it.
	RaiseAt = 0.7
	// LowerAt and QuietLooks: with every processor, QuietLooks looks in a
	// row below LowerAt cores take it back to one. The gap between the two
	// thresholds and the ten seconds keep a load near either from flapping.
	LowerAt    = 0.35
	QuietLooks = 10
)

// Decide is the Governor's rule: the processor count after a look that
// found the process using cores (CPU time over the look's wall time) at
// cur processors, with max the most it may have and quiet the quiet looks
// in a row before this one; and the quiet looks in a row after it.
func Decide(cur, max int, cores float64, quiet int) (next, quietAfter int) {
	switch {
	case max <= 1:
		return max, 0
	case cur <= 1:
		if cores >= RaiseAt {
			return max, 0
		}
		return 1, 0
	case cores < LowerAt:
		if quiet+1 >= QuietLooks {
			return 1, 0
		}
		return cur, quiet + 1
	default:
		return cur, 0
	}
}

// Governor sets GOMAXPROCS by Decide. It owns the setting while Run runs:
// nothing else in the process may set it then.
type Governor struct {
	log    *slog.Logger
	max    int                  // the runtime's default when New ran, or at the last raise (Run's goroutine)
	cpu    func() time.Duration // the process's CPU time so far
	set    func(n int) int      // applies n (1, or max: the runtime's default); returns what is in effect
	bursts chan struct{}        // Burst's requests to Run (one waits at most)

	quiet int          // quiet looks in a row; Run's goroutine only
	cur   atomic.Int64 // in effect
	ups   atomic.Uint64
}

// New returns a Governor for this process. Call it while GOMAXPROCS is
// the runtime's default (no GOMAXPROCS in the environment, no earlier
// runtime.GOMAXPROCS call): that default is the most it gives.
func New(log *slog.Logger) *Governor {
	g := &Governor{log: log, max: runtime.GOMAXPROCS(0), cpu: cputime.Process, set: setRuntime, bursts: make(chan struct{}, 1)}
	g.cur.Store(int64(g.max))
	return g
}

// setRuntime is Governor.set for the process: one, or the runtime's
// default (which also lets the runtime follow a changed CPU quota again).
// Either stops the world, after any garbage collection in progress.
func setRuntime(n int) int {
	if n <= 1 {
		runtime.GOMAXPROCS(1)
		return 1
	}
	runtime.SetDefaultGOMAXPROCS()
	return runtime.GOMAXPROCS(0)
}

// Max is the most processors the Governor gives: the runtime's default
// when it was made, or at its last raise. At 1 (one CPU, or a quota of
// one) Run does nothing. Not safe while Run runs.
func (g *Governor) Max() int { return g.max }

// Procs is the processor count in effect.
func (g *Governor) Procs() int { return int(g.cur.Load()) }

// Raises counts the changes to every processor, by looks and bursts.
func (g *Governor) Raises() uint64 { return g.ups.Load() }

// Run starts the process on one processor and looks every Every until
// ctx ends; then it gives the process the runtime's default again.
func (g *Governor) Run(ctx context.Context) {
	if g.max <= 1 {
		return
	}
	g.quiet = 0
	g.cur.Store(int64(g.set(1)))
	defer func() { g.cur.Store(int64(g.set(g.max))) }()
	t := time.NewTicker(Every)
	defer t.Stop()
	prevCPU, prevAt := g.cpu(), time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-g.bursts:
			g.burst()
		case now := <-t.C:
			used := g.cpu()
			g.look(used-prevCPU, now.Sub(prevAt))
			prevCPU, prevAt = used, now
		}
	}
}

// Burst asks Run to give the process every processor now, if it runs on
// one, and to start the quiet count again: a caller that knows a burst of
// work begins (the takeover of many devices, a large fan-out) need not
// wait for the next look to find the one processor busy. It does not
// wait: the change stops the world, and waits for a garbage collection in
// progress to end, on Run's goroutine, while the caller goes on with its
// burst.
func (g *Governor) Burst() {
	select {
	case g.bursts <- struct{}{}:
	default: // one is waiting already
	}
}

// burst is a Burst on Run's goroutine.
func (g *Governor) burst() {
	g.quiet = 0
	if cur := int(g.cur.Load()); cur <= 1 {
		g.apply(cur, g.max, "burst", 0)
	}
}

// look applies Decide to one look: cpu spent over wall.
func (g *Governor) look(cpu, wall time.Duration) {
	if wall <= 0 {
		return
	}
	cores := cpu.Seconds() / wall.Seconds()
	cur := int(g.cur.Load())
	var next int
	next, g.quiet = Decide(cur, g.max, cores, g.quiet)
	if next != cur {
		g.apply(cur, next, "look", cores)
	}
}

// apply sets next in place of cur, why ("look" or "burst").
func (g *Governor) apply(cur, next int, why string, cores float64) {
	in := g.set(next)
	g.cur.Store(int64(in))
	if next > 1 {
		g.ups.Add(1)
		g.max = in // the runtime's default now (a changed CPU quota); at 1 Decide keeps it
	}
	g.log.Debug("procs: GOMAXPROCS changed", "from", cur, "to", in, "by", why, "cores_used", cores)
}
