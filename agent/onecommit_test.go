package agent

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/internal/cputime"
	"github.com/edgefence/edgefence/offline"
)

// verdictDelay sets outbox.verdict_delay.
func verdictDelay(d time.Duration) func(*Config) {
	return func(c *Config) { c.Outbox.VerdictDelay = &d }
}

// TestOneCommitPerCommand: commands sent one at a time to a real device
// (mochi, a sim.Fleet, the embedded etcd) that nobody waits for (Enqueue)
// cost one outbox commit each with outbox.verdict_delay — each verdict
// rides on the next command's append —, and two in strict mode (0: the
// append's, the verdict's own). A command someone waits for (Send) is
// told its verdict only once it is durable (invariant I9): its verdict is
// committed at once, not an hour later, so it costs two commits in both
// modes (before, Send returned with the verdict still waiting, and a kill
// -9 then could leave the command pending, resent, ended duplicate or
// stale). The delay is an hour here so that only the appends, the
// waiters' commits and the shutdown's flush commit.
func TestOneCommitPerCommand(t *testing.T) {
	const n = 20
	for _, c := range []struct {
		name   string
		delay  time.Duration
		waited bool
		ok     func(commits int64) bool
		want   string
	}{
		{"deferred", time.Hour, false, func(c int64) bool { return c <= n+2 }, "≤ n+2"},
		{"deferred-waited", time.Hour, true, func(c int64) bool { return c >= 2*n && c <= 2*n+2 }, "2n"},
		{"strict", 0, true, func(c int64) bool { return c >= 2*n }, "≥ 2n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newBenchWorld(t, "mochi", 1, 1, verdictDelay(c.delay))
			var commits atomic.Int64
			w.agent.outbox.ObserveCommits(func(time.Duration) { commits.Add(1) }) // in place of the lease-tail meter
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			for i := range n {
				if c.waited {
					sendDurable(ctx, t, w, i)
				} else {
					enqueueEnded(ctx, t, w, i)
				}
			}
			got := commits.Load()
			t.Logf("%s: %d commands one at a time, %d outbox commits", c.name, n, got)
			if !c.ok(got) {
				t.Errorf("%d commits for %d commands, want %s", got, n, c.want)
			}
			w.agent.outbox.Flush()
			recs, err := w.agent.outbox.List(offline.Filter{Device: w.devices[0]})
			if err != nil || len(recs) != n+1 { // and newBenchWorld's first
				t.Fatalf("%d records, %v", len(recs), err)
			}
			for _, r := range recs {
				if r.State != fence.Accepted {
					t.Fatalf("%s: %v", r.ID, r.State)
				}
			}
			if w.agent.outbox.Waiting() != 0 {
				t.Errorf("%d verdicts still waiting after Flush", w.agent.outbox.Waiting())
			}
		})
	}
}

// sendDurable sends command i and checks that its verdict was durable
// when Send returned it: not waiting for a commit in the outbox.
func sendDurable(ctx context.Context, t *testing.T, w *benchWorld, i int) {
	t.Helper()
	ack, err := w.agent.Send(ctx, w.devices[0], sim.KindPing, nil)
	if err != nil || ack.Verdict != fence.Accepted {
		t.Fatalf("command %d: %+v %v", i, ack, err)
	}
	if n := w.agent.outbox.Waiting(); n != 0 {
		t.Fatalf("command %d: Send returned %v with %d verdicts still waiting for their commit", i, ack.Verdict, n)
	}
}

// enqueueEnded queues command i without waiting for it and waits until
// the outbox shows it ended.
func enqueueEnded(ctx context.Context, t *testing.T, w *benchWorld, i int) {
	t.Helper()
	env, err := w.agent.Enqueue(ctx, w.devices[0], sim.KindPing, nil)
	if err != nil {
		t.Fatalf("command %d: %v", i, err)
	}
	for {
		if r, err := w.agent.outbox.Get(env.ID); err == nil && !r.Pending() {
			if r.State != fence.Accepted {
				t.Fatalf("command %d: %v", i, r.State)
			}
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("command %d not ended: %v", i, ctx.Err())
		}
		time.Sleep(time.Millisecond)
	}
}

// BenchmarkSendSequential is one command at a time to one device (as
// BenchmarkSendRoundTrip) with outbox.verdict_delay 100ms (deferred) and
// 0 (strict): commits/op counts the outbox's commits, cpu-µs/op this
// process's CPU per command — the agent's, the broker's (mochi) and the
// device's (sim.Fleet) together: compare the two, not against issue 17's
// target (edgefence-bench rss measures the agent alone).
func BenchmarkSendSequential(b *testing.B) {
	for _, c := range []struct {
		name  string
		delay time.Duration
	}{{"deferred", 100 * time.Millisecond}, {"strict", 0}} {
		b.Run(c.name, func(b *testing.B) {
			w := newBenchWorld(b, "mochi", 1, 1, verdictDelay(c.delay))
			var commits atomic.Int64
			w.agent.outbox.ObserveCommits(func(time.Duration) { commits.Add(1) }) // a benchmark only
			ctx := context.Background()
			cpu0 := cputime.Process()
			b.ResetTimer()
			for b.Loop() {
				if ack, err := w.agent.Send(ctx, w.devices[0], sim.KindPing, nil); err != nil || ack.Verdict != fence.Accepted {
					b.Fatalf("%+v %v", ack, err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(commits.Load())/float64(b.N), "commits/op")
			b.ReportMetric(float64((cputime.Process()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}

// TestDeferredVerdictKeptFromExpiryUntilDurable: with verdict_delay a
// verdict's entry stays in the device's recording set (never expired
// locally) until its record has been committed, and stays there, counted
// as an outbox error, if the record fails (here: the outbox is closed),
// so that it is resent, not expired.
func TestDeferredVerdictKeptFromExpiryUntilDurable(t *testing.T) {
	ob := openOutbox(t, filepath.Join(t.TempDir(), offline.File), &offline.Options{VerdictDelay: time.Hour})
	q, d, es := verdictRig(t, ob, 2)
	q.later = true
	recording := func(id string) bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		_, ok := d.recording[id]
		return ok
	}
	q.resolveLater(d, es[0], ack(es[0]))
	if !recording("c0") {
		t.Fatal("c0 not kept from expiry while its record waits")
	}
	ob.Flush()
	if recording("c0") {
		t.Error("c0 still in the recording set once durable")
	}
	if err := ob.Close(); err != nil {
		t.Fatal(err)
	}
	q.resolveLater(d, es[1], ack(es[1])) // refused: the outbox is closed
	if !recording("c1") {
		t.Error("c1: answered, not recorded, and no longer kept from expiry")
	}
	if n := q.stats.outboxErr.Load(); n != 1 {
		t.Errorf("outbox errors %d, want 1", n)
	}
}
