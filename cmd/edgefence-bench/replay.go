package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/agent/daemon"
	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/offline"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// replayConfig configures the outbox replay benchmark.
type replayConfig struct {
	Devices int           // simulated devices
	Backlog int           // commands queued while the broker is down
	Runs    int           // repetitions, each on a fresh broker, fleet, outbox and agent
	Timeout time.Duration // the agent's command timeout
	Sign    bool          // signed commands and acks (invariant I7; --sign)
	Dir     string
	Log     io.Writer
}

// replayRun is one run's figures. The durations after Back are measured from
// the moment the broker listens again.
type replayRun struct {
	Enqueue       time.Duration // wall time of the Backlog Enqueues
	EnqueueRate   float64       // durable appends per second
	CmdrUp        time.Duration // the agent's Commander connected and subscribed again
	FleetUp       time.Duration // the devices' client connected and subscribed again
	FirstAck      time.Duration // the first replayed command's ack in the agent's Sender
	FirstAccepted time.Duration // the first accepted verdict recorded (Status counters)
	Done          time.Duration // every queued command has its terminal state
	ReplayRate    float64       // Backlog / (Done − FirstAccepted)
	Resent        uint64        // agent: commands sent again (no ack, or sent before the outage)
	NoAck         uint64        // agent: sends that ended without an ack
	Verdicts      map[fence.Verdict]int
	Check         string // empty if every command ended accepted, once, in order
}

type replayResult struct {
	Devices, Backlog int
	Timeout          time.Duration
	Runs             []replayRun
}

// ackLog is the agent's Sender in the replay benchmark: the MQTT Commander
// (whose Connected and AwaitConnection the agent's workers use to wait for
// the broker), recording every ack in the order the workers got them.
type ackLog struct {
	*mqtt.Commander
	first atomic.Int64 // UnixNano of the first ack, 0 until then

	mu   sync.Mutex
	acks []fence.Ack
}

func (l *ackLog) Send(ctx context.Context, env *fence.Envelope) (*fence.Ack, error) {
	ack, err := l.Commander.Send(ctx, env)
	if err == nil {
		l.first.CompareAndSwap(0, time.Now().UnixNano())
		l.mu.Lock()
		l.acks = append(l.acks, *ack)
		l.mu.Unlock()
	}
	return ack, err
}

func runReplay(ctx context.Context, etcd *sandbox.Etcd, cfg replayConfig) (*replayResult, error) {
	res := &replayResult{Devices: cfg.Devices, Backlog: cfg.Backlog, Timeout: cfg.Timeout}
	for i := range cfg.Runs {
		fmt.Fprintf(cfg.Log, "replay: run %d/%d: %d devices, backlog %d\n", i+1, cfg.Runs, cfg.Devices, cfg.Backlog)
		r, err := replayOnce(ctx, etcd, cfg, filepath.Join(cfg.Dir, fmt.Sprintf("replay-%d", i)))
		if err != nil {
			return res, fmt.Errorf("replay run %d: %w", i+1, err)
		}
		fmt.Fprintf(cfg.Log, "replay: run %d: enqueue %.0f/s, first accepted %s ms, all terminal %s ms, replay %.0f/s\n",
			i+1, r.EnqueueRate, ms(r.FirstAccepted), ms(r.Done), r.ReplayRate)
		res.Runs = append(res.Runs, r)
	}
	return res, nil
}

// replayOnce runs one replay in a world of its own under dir.
func replayOnce(ctx context.Context, etcd *sandbox.Etcd, cfg replayConfig, dir string) (run replayRun, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return run, err
	}
	w := &replayWorld{cfg: cfg, devs: deviceIDs("rp-", cfg.Devices)}
	if w.br, err = sandbox.StartBroker(sandbox.BrokerConfig{}); err != nil {
		return run, err
	}
	defer w.br.Close()
	// The MQTT clients reconnect with the transport's default backoff, as
	// the agent and devices do in production; the devices with a fresh
	// session (the sandbox broker keeps none across a restart anyway).
	fresh := mqtt.Config{CleanStart: true, SessionExpiry: -1}
	w.configureAgent(etcd, dir)
	fa, err := signWorld(ctx, cfg.Sign, dir, w.acfg)
	if err != nil {
		return run, err
	}
	if w.fleet, err = sim.NewFleet(ctx, sim.FleetConfig{Devices: w.devs, DataDir: filepath.Join(dir, "devices"), Broker: w.br.URL(),
		Prefix: replayPrefix, ClientID: "bench-replay-fleet-" + filepath.Base(dir), MQTT: fresh, Keys: fa.keys, Signers: fa.signers}); err != nil {
		return run, err
	}
	defer closeCtx(w.fleet.Close)
	if err := awaitCtx(ctx, 10*time.Second, w.fleet.AwaitReady); err != nil {
		return run, fmt.Errorf("fleet: %w", err)
	}
	if err := w.startAgent(ctx); err != nil {
		return run, err
	}
	defer func() { _ = w.ag.stop() }()
	if err := awaitCtx(ctx, 10*time.Second, w.sender.Client().AwaitSubscribed); err != nil {
		return run, fmt.Errorf("commander: %w", err)
	}
	if err := waitHoldingAll(ctx, w.ag, len(w.devs), 30*time.Second); err != nil {
		return run, err
	}
	if err := w.outage(ctx); err != nil {
		return run, err
	}
	run.Enqueue, err = w.enqueueBacklog(ctx)
	if err != nil {
		return run, err
	}
	run.EnqueueRate = float64(cfg.Backlog) / run.Enqueue.Seconds()
	if st := w.ag.Status().Counters; st.Accepted != 0 || st.Queued != uint64(cfg.Backlog) {
		return run, fmt.Errorf("before the broker is back: %d accepted, %d queued of %d", st.Accepted, st.Queued, cfg.Backlog)
	}
	fmt.Fprintf(cfg.Log, "replay: queued %d in %s ms (%.0f/s); broker back\n", cfg.Backlog, ms(run.Enqueue), run.EnqueueRate)
	if err := w.timeReplay(ctx, &run); err != nil {
		return run, err
	}
	// The outbox's records, read once the agent has closed it.
	if err := w.ag.stop(); err != nil {
		return run, err
	}
	ob, err := offline.Open(filepath.Join(w.acfg.StateDir, offline.File), &offline.Options{ReadOnly: true})
	if err != nil {
		return run, err
	}
	defer ob.Close()
	if run.Verdicts, err = checkReplay(ob, w.fleet, w.sender, w.devs, cfg.Backlog); err != nil {
		run.Check = err.Error()
		fmt.Fprintln(cfg.Log, "replay:", err)
	}
	return run, nil
}

// replayPrefix is the replay benchmark's MQTT topic prefix.
const replayPrefix = "replay"

// replayWorld is one replay run's world: a broker, the devices on one
// sim.Fleet, the agent and the ack log that is its Sender.
type replayWorld struct {
	cfg    replayConfig
	devs   []string
	br     *sandbox.Broker
	fleet  *sim.Fleet
	acfg   *agent.Config
	ag     *benchAgent
	sender *ackLog
}

// configureAgent is the agent's config: its state under dir/agent and its
// outbox limits raised to hold the backlog whatever its spread.
func (w *replayWorld) configureAgent(etcd *sandbox.Etcd, dir string) {
	w.acfg = agentConfig("bench-replay-"+filepath.Base(dir), filepath.Join(dir, "agent"), etcd, w.br.URL(), w.devs)
	w.acfg.MQTT.Prefix, w.acfg.Command.Timeout = replayPrefix, w.cfg.Timeout
	w.acfg.Outbox = agent.OutboxConfig{MaxPerDevice: max(w.cfg.Backlog, offline.DefaultMaxPerDevice), MaxTotal: max(w.cfg.Backlog, offline.DefaultMaxTotal),
		MaxBytesPerDevice: 1 << 30, MaxTotalBytes: 1 << 30}
}

// startAgent starts the agent of w.acfg as `edgefence run` builds it
// (agent/daemon). Stop it with w.ag.stop.
func (w *replayWorld) startAgent(ctx context.Context) (err error) {
	w.ag, err = startAgent(ctx, w.acfg, daemon.Options{Sender: func(c *mqtt.Commander) agent.Sender {
		w.sender = &ackLog{Commander: c}
		return w.sender
	}})
	return err
}

// outage stops the broker and waits for the agent's MQTT client to see it.
func (w *replayWorld) outage(ctx context.Context) error {
	if err := w.br.Stop(); err != nil {
		return err
	}
	for down := time.Now(); w.sender.Connected(); time.Sleep(time.Millisecond) {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Since(down) > 10*time.Second {
			return errors.New("the agent's MQTT client still connected 10s after the broker stopped")
		}
	}
	return nil
}

// enqueueBacklog queues cfg.Backlog commands, spread over the devices, and
// returns how long the appends took. One producer per device, each
// queueing its share in order: the appends themselves are serialized by
// the outbox (one fsynced bbolt commit each).
func (w *replayWorld) enqueueBacklog(ctx context.Context) (time.Duration, error) {
	bodies := make([][]byte, 5)
	for i := range bodies {
		var err error
		if bodies[i], err = fence.EncodeBody(map[string]any{"setpoint": 18 + i}); err != nil {
			return 0, err
		}
	}
	errs := make([]error, len(w.devs))
	var wg sync.WaitGroup
	start := time.Now()
	for j, d := range w.devs {
		n := w.cfg.Backlog/len(w.devs) + btoi(j < w.cfg.Backlog%len(w.devs))
		wg.Go(func() {
			for k := range n {
				if _, err := w.ag.Enqueue(ctx, d, sim.KindSet, bodies[k%len(bodies)]); err != nil {
					errs[j] = fmt.Errorf("enqueue %d to %s: %w", k, d, err)
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start), errors.Join(errs...)
}

// timeReplay starts the broker again and times the reconnections and the
// replay, until every queued command is terminal.
func (w *replayWorld) timeReplay(ctx context.Context, run *replayRun) error {
	if err := w.br.Start(ctx); err != nil {
		return err
	}
	back := time.Now()
	var cmdrUp, fleetUp atomic.Int64
	var wg sync.WaitGroup
	wctx, wcancel := context.WithCancel(ctx)
	defer func() { wcancel(); wg.Wait() }()
	for _, up := range []struct {
		f  func(context.Context) error
		at *atomic.Int64
	}{{w.sender.Client().AwaitSubscribed, &cmdrUp}, {w.fleet.AwaitReady, &fleetUp}} {
		wg.Go(func() {
			if up.f(wctx) == nil {
				up.at.Store(int64(time.Since(back)))
			}
		})
	}
	limit := 2*time.Minute + time.Duration(w.cfg.Backlog)*10*time.Millisecond
	for {
		c := w.ag.Status().Counters
		if run.FirstAccepted == 0 && c.Accepted > 0 {
			run.FirstAccepted = time.Since(back)
		}
		if c.Accepted+c.Duplicate+c.Stale+c.Invalid+c.Expired >= uint64(w.cfg.Backlog) {
			run.Done = time.Since(back)
			run.Resent, run.NoAck = c.Resent, c.NoAck
			break
		}
		if time.Since(back) > limit {
			return fmt.Errorf("after %v: %d of %d terminal (%+v)", limit, c.Accepted+c.Duplicate+c.Stale+c.Invalid+c.Expired, w.cfg.Backlog, c)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		time.Sleep(time.Millisecond)
	}
	wcancel()
	wg.Wait()
	run.CmdrUp, run.FleetUp = time.Duration(cmdrUp.Load()), time.Duration(fleetUp.Load())
	if f := w.sender.first.Load(); f != 0 {
		run.FirstAck = time.Unix(0, f).Sub(back)
	}
	if d := run.Done - run.FirstAccepted; d > 0 {
		run.ReplayRate = float64(w.cfg.Backlog) / d.Seconds()
	}
	return nil
}

// checkReplay checks that every queued command ended accepted, exactly once,
// and in queue order per device: in the outbox's records, in the order the
// acks reached the agent, and in the devices' own state.
func checkReplay(ob *offline.Outbox, fleet *sim.Fleet, sender *ackLog, devs []string, backlog int) (map[fence.Verdict]int, error) {
	recs, err := ob.List(offline.Filter{})
	if err != nil {
		return nil, err
	}
	verdicts := map[fence.Verdict]int{}
	var bad []error
	byDev := map[string][]offline.Record{}
	for _, r := range recs {
		verdicts[r.State]++
		if r.State != fence.Accepted && len(bad) < 5 {
			bad = append(bad, fmt.Errorf("%s seq %d ended %s", r.Device, r.Seq, r.StateString()))
		}
		byDev[r.Device] = append(byDev[r.Device], r)
	}
	if len(recs) != backlog {
		bad = append(bad, fmt.Errorf("outbox holds %d records, want %d", len(recs), backlog))
	}
	// The acks in the order the workers received them: per device, the
	// accepted seqs strictly increasing (in order, none twice).
	sender.mu.Lock()
	acks := sender.acks
	sender.mu.Unlock()
	lastSeq := map[string]uint64{}
	accepted := map[string]int{}
	for _, a := range acks {
		if a.Verdict != fence.Accepted {
			continue
		}
		if a.Seq <= lastSeq[a.Device] && len(bad) < 10 {
			bad = append(bad, fmt.Errorf("%s: seq %d accepted after seq %d", a.Device, a.Seq, lastSeq[a.Device]))
		}
		lastSeq[a.Device] = a.Seq
		accepted[a.Device]++
	}
	for _, d := range devs {
		rs := byDev[d] // List orders by device, then queue position
		for i := 1; i < len(rs); i++ {
			if rs[i].Seq <= rs[i-1].Seq || rs[i].Resolved.Before(rs[i-1].Resolved) {
				bad = append(bad, fmt.Errorf("%s: queue position %d (seq %d) resolved out of order", d, rs[i].Pos, rs[i].Seq))
				break
			}
		}
		st, err := fleet.State(d)
		if err != nil {
			return verdicts, err
		}
		switch {
		case accepted[d] != len(rs):
			bad = append(bad, fmt.Errorf("%s: %d accepted acks for %d queued commands", d, accepted[d], len(rs)))
		case st.Applied != uint64(len(rs)):
			bad = append(bad, fmt.Errorf("%s: the device applied %d commands, %d were queued", d, st.Applied, len(rs)))
		case len(rs) > 0 && st.LastSeq != rs[len(rs)-1].Seq:
			bad = append(bad, fmt.Errorf("%s: the device's last seq is %d, the queue's %d", d, st.LastSeq, rs[len(rs)-1].Seq))
		}
	}
	if len(bad) > 0 {
		return verdicts, fmt.Errorf("replay check: %w", errors.Join(bad...))
	}
	return verdicts, nil
}

// closeCtx calls a Close(ctx) with a 10 s bound.
func closeCtx(f func(context.Context) error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = f(ctx)
}

func printReplay(w io.Writer, r *replayResult) {
	fmt.Fprintf(w, "### Outbox replay: %d commands queued over %d devices while the broker is down (command timeout %v, %d runs)\n\n",
		r.Backlog, r.Devices, r.Timeout, len(r.Runs))
	fmt.Fprintln(w, "Times after \"broker back\" are from the moment the broker listens again.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| run | enqueue appends/s | agent MQTT up ms | devices MQTT up ms | first ack ms | first accepted recorded ms | all terminal ms | replay cmds/s | resent | no ack | check |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
	for i, x := range r.Runs {
		fmt.Fprintf(w, "| %d | %.0f | %s | %s | %s | %s | %s | %.0f | %d | %d | %s |\n", i+1, x.EnqueueRate, ms(x.CmdrUp), ms(x.FleetUp),
			ms(x.FirstAck), ms(x.FirstAccepted), ms(x.Done), x.ReplayRate, x.Resent, x.NoAck, verdictSummary(x, r.Backlog))
	}
	if len(r.Runs) > 0 {
		pick := func(f func(replayRun) time.Duration) time.Duration {
			var ds []time.Duration
			for _, x := range r.Runs {
				ds = append(ds, f(x))
			}
			return median(ds)
		}
		rate := func(f func(replayRun) float64) float64 {
			var xs []float64
			for _, x := range r.Runs {
				xs = append(xs, f(x))
			}
			return medianFloat(xs)
		}
		fmt.Fprintf(w, "| **median** | **%.0f** | **%s** | **%s** | **%s** | **%s** | **%s** | **%.0f** | | | |\n",
			rate(func(x replayRun) float64 { return x.EnqueueRate }),
			ms(pick(func(x replayRun) time.Duration { return x.CmdrUp })), ms(pick(func(x replayRun) time.Duration { return x.FleetUp })),
			ms(pick(func(x replayRun) time.Duration { return x.FirstAck })), ms(pick(func(x replayRun) time.Duration { return x.FirstAccepted })),
			ms(pick(func(x replayRun) time.Duration { return x.Done })), rate(func(x replayRun) float64 { return x.ReplayRate }))
	}
	fmt.Fprintln(w)
}

// verdictSummary says whether the run's check passed.
func verdictSummary(x replayRun, backlog int) string {
	if x.Check == "" {
		return fmt.Sprintf("all %d accepted, in order, once", backlog)
	}
	return fmt.Sprintf("**FAILED** (verdicts %v): %s", x.Verdicts, strings.ReplaceAll(x.Check, "\n", "; "))
}
