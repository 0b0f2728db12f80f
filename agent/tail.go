package agent

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgefence/edgefence/agent/hiccup"
	"github.com/edgefence/edgefence/internal/promtext"
)

// The lease-threat meters. A lease survives as long as a keep-alive reaches
// etcd within the TTL of the last one; the client sends one every TTL/3.
// What eats into that, measured on the running agent:
//
//   - stall: how late the agent's own goroutines run (a hiccup meter: a
//     timer every hiccupInterval(lease_ttl) records how late it wakes; GC
//     pauses, CPU starvation, a frozen process, swap);
//   - keep-alive round trip: a LeaseTimeToLive on the session's lease every
//     TTL/3, the keep-alive's cadence (the session's own keep-alive stream
//     is internal to the etcd client; TimeToLive goes to the same leader
//     over the same connection);
//   - fsync: the time bbolt spends writing and syncing each outbox commit
//     (offline.Outbox.ObserveCommits), the state dir's real writes.
//
// Each is a histogram in /metrics. Over a sliding window of about
// tailWindow the agent keeps the maximum and a bucketed p99 of each; the
// observed tail is the sum of the three maxima, the margin the lease TTL
// less that tail, and the agent warns (log, status, metric) while the tail
// is above a third of the TTL — one keep-alive interval.

// The hiccup meter's interval is a fortieth of lease_ttl, between
// hiccupMin and hiccupMax: 250 ms at the default 10 s, 100 ms at 4 s and
// below. A stall reads as at least stall − interval (the timer may have
// been set just before it began), so what the meter can miss of a stall
// is at most 7.5 % of the warning's threshold, lease_ttl/3 (more only
// below 4 s, where the interval stays 100 ms: 15 % at 2 s, as before).
// Each wake costs the process far more than the sample (the runtime
// wakes threads for it): going from 10 wakes a second to 4 took the
// agent's idle CPU at 1,000 devices from 0.32–0.40 to 0.20–0.22 % of a
// core (BENCHMARKS, "Idle and steady CPU, second pass").
const (
	hiccupMin  = 100 * time.Millisecond
	hiccupMax  = 250 * time.Millisecond
	tailSlot   = time.Minute // the window moves by one slot at a time
	tailSlots  = 5           // window = tailSlots × tailSlot
	tailWindow = tailSlots * tailSlot
	tailCheck  = time.Second // how often the warning is evaluated
)

// hiccupInterval is the hiccup meter's interval for a lease TTL.
func hiccupInterval(ttl time.Duration) time.Duration { return min(max(ttl/40, hiccupMin), hiccupMax) }

// tailBuckets are the histograms' bounds, in seconds, for all three.
var tailBuckets = [...]float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

// tailSeries is one measured quantity: a Prometheus histogram over the
// agent's life and per-minute slots for the window.
type tailSeries struct {
	desc *promtext.Desc
	hist *promtext.Histogram

	mu    sync.Mutex
	slots [tailSlots]tailSlotData
}

type tailSlotData struct {
	epoch  int64 // Unix time / tailSlot of the minute it holds
	n      uint64
	max    time.Duration
	counts [len(tailBuckets) + 1]uint32 // per bucket, the last one +Inf
}

func newTailSeries(name, help string) *tailSeries {
	return &tailSeries{desc: promtext.NewDesc("edgefence_"+name, help, promtext.TypeHistogram), hist: promtext.NewHistogram(tailBuckets[:])}
}

// observe records one sample taken at now.
func (s *tailSeries) observe(d time.Duration, now time.Time) {
	d = max(d, 0)
	s.hist.Observe(d.Seconds())
	i := 0
	for sec := d.Seconds(); i < len(tailBuckets) && sec > tailBuckets[i]; i++ {
	}
	epoch := now.UnixNano() / int64(tailSlot)
	s.mu.Lock()
	sl := &s.slots[epoch%tailSlots]
	if sl.epoch != epoch {
		*sl = tailSlotData{epoch: epoch}
	}
	sl.n++
	sl.max = max(sl.max, d)
	sl.counts[i]++
	s.mu.Unlock()
}

// TailFigures are one quantity's figures over the window.
type TailFigures struct {
	Samples uint64  `json:"samples"`
	P99     float64 `json:"p99_s"` // seconds; the bound of the bucket holding the 99th percentile, at most Max
	Max     float64 `json:"max_s"` // seconds
}

// figures merges the slots of the window ending at now.
func (s *tailSeries) figures(now time.Time) TailFigures {
	epoch := now.UnixNano() / int64(tailSlot)
	var counts [len(tailBuckets) + 1]uint64
	var f TailFigures
	var maxD time.Duration
	s.mu.Lock()
	for i := range s.slots {
		sl := &s.slots[i]
		if sl.n == 0 || sl.epoch <= epoch-tailSlots || sl.epoch > epoch {
			continue
		}
		f.Samples += sl.n
		maxD = max(maxD, sl.max)
		for j, c := range sl.counts {
			counts[j] += uint64(c)
		}
	}
	s.mu.Unlock()
	f.Max = maxD.Seconds()
	if f.Samples == 0 {
		return f
	}
	want := (f.Samples*99 + 99) / 100 // ceil(0.99 n)
	var cum uint64
	for j, c := range counts {
		if cum += c; cum >= want {
			f.P99 = f.Max
			if j < len(tailBuckets) {
				f.P99 = min(tailBuckets[j], f.Max)
			}
			break
		}
	}
	return f
}

// tails are the agent's three meters and the warning state.
type tails struct {
	stall, keepAlive, fsync *tailSeries
	fsyncOn                 bool // an outbox reports its commits

	warning                atomic.Bool
	tailGauge, warnGauge   *promtext.Desc
	keepAliveErrors        atomic.Uint64
	keepAliveErrorsCounter *promtext.Desc
}

func newTails() *tails {
	return &tails{
		stall: newTailSeries("scheduling_stall_seconds",
			"How late the agent's hiccup meter woke (a timer every lease_ttl/40, 100-250ms): scheduling stalls, GC pauses, a frozen process."),
		keepAlive: newTailSeries("etcd_keepalive_rtt_seconds",
			"Round trip of a LeaseTimeToLive on the session's lease, sent every lease_ttl/3 (the keep-alive's cadence)."),
		fsync: newTailSeries("state_fsync_seconds",
			"Time bbolt spent writing and syncing each outbox commit (with an outbox)."),
		tailGauge: promtext.NewDesc("edgefence_lease_tail_seconds",
			"Observed tail over the last 5 minutes: max stall + max keep-alive round trip + max outbox fsync.", promtext.TypeGauge),
		warnGauge: promtext.NewDesc("edgefence_lease_tail_warning",
			"1 while the observed tail is above a third of lease_ttl (one keep-alive interval): raise etcd.lease_ttl or find the stall.", promtext.TypeGauge),
		keepAliveErrorsCounter: promtext.NewDesc("edgefence_etcd_keepalive_probe_errors_total",
			"LeaseTimeToLive probes that failed without a round trip to measure (session down, lease gone, connection refused).", promtext.TypeCounter),
	}
}

// TailStatus is the lease-threat summary in Status.
type TailStatus struct {
	Window    string       `json:"window"` // how far back the figures reach
	Stall     TailFigures  `json:"stall"`
	KeepAlive TailFigures  `json:"keepalive_rtt"`
	Fsync     *TailFigures `json:"fsync,omitempty"` // nil without an outbox
	TTL       float64      `json:"lease_ttl_s"`
	Tail      float64      `json:"tail_s"`   // max stall + max keep-alive round trip + max fsync
	Margin    float64      `json:"margin_s"` // lease_ttl − tail
	// Warning is set while the tail is above lease_ttl/3.
	Warning string `json:"warning,omitempty"`
}

// status summarises the window ending at now against ttl.
func (t *tails) status(ttl time.Duration, now time.Time) TailStatus {
	s := TailStatus{Window: tailWindow.String(), Stall: t.stall.figures(now), KeepAlive: t.keepAlive.figures(now), TTL: ttl.Seconds()}
	s.Tail = s.Stall.Max + s.KeepAlive.Max
	if t.fsyncOn {
		f := t.fsync.figures(now)
		s.Fsync = &f
		s.Tail += f.Max
	}
	s.Margin = s.TTL - s.Tail
	if s.Tail > s.TTL/3 {
		s.Warning = fmt.Sprintf("observed tail %.2fs is above lease_ttl/3 (%.2fs): a stall this long eats a keep-alive interval; raise etcd.lease_ttl or find the stall (README, choosing lease_ttl)",
			s.Tail, s.TTL/3)
	}
	return s
}

// collect writes the meters through the agent's collector.
func (t *tails) collect(w *promtext.Writer, s TailStatus) {
	w.Histogram(t.stall.desc, t.stall.hist)
	w.Histogram(t.keepAlive.desc, t.keepAlive.hist)
	if t.fsyncOn {
		w.Histogram(t.fsync.desc, t.fsync.hist)
	}
	w.Sample(t.tailGauge, s.Tail)
	w.Sample(t.warnGauge, b2f(s.Warning != ""))
	w.Sample(t.keepAliveErrorsCounter, float64(t.keepAliveErrors.Load()))
}

// startTails runs the meters until the returned stop is called; stop
// waits for them. Agent.Run owns them: `defer a.leases.startTails(ctx)()`.
func (l *leases) startTails(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		l.hiccups(ctx)
	}()
	go func() {
		defer wg.Done()
		l.probeKeepAlive(ctx)
	}()
	return func() { cancel(); wg.Wait() }
}

// hiccups runs the hiccup meter (agent/hiccup) at hiccupInterval and
// evaluates the warning every tailCheck on the same goroutine.
func (l *leases) hiccups(ctx context.Context) {
	var nextCheck time.Time
	hiccup.Run(ctx, hiccupInterval(l.etcd.LeaseTTL), func(late time.Duration, now time.Time) {
		l.tails.stall.observe(late, now)
		if now.After(nextCheck) {
			l.checkTail(now)
			nextCheck = now.Add(tailCheck)
		}
	})
}

// checkTail logs when the observed tail rises above lease_ttl/3 and when it
// falls back (one line each way: the window keeps a stall for about five
// minutes, so a line per check would repeat the same news).
func (l *leases) checkTail(now time.Time) {
	s := l.tails.status(l.etcd.LeaseTTL, now)
	warn := s.Warning != ""
	if l.tails.warning.Swap(warn) == warn {
		return
	}
	attrs := []any{"tail_s", round3(s.Tail), "max_stall_s", round3(s.Stall.Max), "keepalive_rtt_max_s", round3(s.KeepAlive.Max),
		"lease_ttl_s", s.TTL, "margin_s", round3(s.Margin), "window", s.Window}
	if s.Fsync != nil {
		attrs = append(attrs, "fsync_max_s", round3(s.Fsync.Max))
	}
	if warn {
		l.log.Warn("lease tail above lease_ttl/3: raise etcd.lease_ttl or find the stall (README, choosing lease_ttl)", attrs...)
		return
	}
	l.log.Info("lease tail back under lease_ttl/3", attrs...)
}

func round3(f float64) float64 { return float64(int64(f*1000+0.5)) / 1000 }

// probeKeepAlive times a LeaseTimeToLive on the session's lease every
// lease_ttl/3 while a session is open. A probe that times out (after the
// TTL) counts as a round trip that long: etcd did not answer for that long.
// One that fails at once (no lease, connection refused) measures nothing
// and is counted as a probe error.
func (l *leases) probeKeepAlive(ctx context.Context) {
	ttl := l.etcd.LeaseTTL
	every := max(ttl/3, 100*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		l.mu.Lock()
		lease, up := l.lease, l.sessionUp
		l.mu.Unlock()
		if !up || lease == 0 {
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, ttl)
		start := time.Now()
		_, err := l.cli.TimeToLive(pctx, lease)
		rtt := time.Since(start)
		cancel()
		switch {
		case err == nil, pctx.Err() != nil && ctx.Err() == nil: // answered, or not within the TTL
			l.tails.keepAlive.observe(rtt, time.Now())
		case ctx.Err() != nil:
			return
		default:
			l.tails.keepAliveErrors.Add(1)
			l.log.Debug("keep-alive probe", "lease", fmt.Sprintf("%x", int64(lease)), "err", err)
		}
	}
}

// observeFsync is the outbox's commit observer.
func (t *tails) observeFsync(d time.Duration) { t.fsync.observe(d, time.Now()) }
