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
	"time"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/agent/daemon"
	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// rtConfig configures the round-trip benchmark.
type rtConfig struct {
	Brokers []string
	N       int // sequential operations per path
	Rounds  int // the sequential paths are interleaved in this many rounds
	Warmup  int // unmeasured operations per path first
	Conc    int // devices (goroutines) of the concurrent variant
	ConcN   int // operations per concurrent path
	// Fleets lists splits of the simulated devices over this many
	// sim.Fleets (an MQTT client and a bbolt file each); the concurrent
	// variant runs once per entry, the sequential one with the first.
	Fleets []int
	// Sign runs the world signed (invariant I7): commands signed by the
	// agent and verified by the devices, acks signed by the devices and
	// verified by the agent (--sign).
	Sign bool
	Dir  string
	Log  io.Writer
}

// Path names, as printed.
const (
	pathOneHop    = "paho publish→receive (1 hop)"
	pathEcho      = "paho request→reply (2 hops)"
	pathEchoBolt  = "paho request→reply, responder fsyncs: bbolt commit of a mark"
	pathEchoSync  = "paho request→reply, responder fsyncs: pwrite + fdatasync"
	pathEchoBoth  = "paho request→reply, requester and responder each commit a mark in bbolt"
	pathAccepted  = "agent.Send → shim → ack, accepted (fsync)"
	pathDuplicate = "agent.Send → shim → ack, duplicate (no write)"
	pathHostAcc   = "device side alone: sim.Host.Handle, accepted (fsync)"
	pathHostDup   = "device side alone: sim.Host.Handle, duplicate"
)

type rtRow struct {
	Path   string
	Conc   int // 1 = sequential
	Fleets int
	S      summary
	Wall   time.Duration
	Rate   float64 // operations per second over Wall
}

type rtResult struct {
	Broker             string
	EnvBytes, AckBytes int
	Rows               []rtRow
}

// row returns the row for path at concurrency conc.
func (r *rtResult) row(path string, conc int) (rtRow, bool) {
	for _, x := range r.Rows {
		if x.Path == path && x.Conc == conc {
			return x, true
		}
	}
	return rtRow{}, false
}

// rtWorld is one broker with every component of the command path on it.
type rtWorld struct {
	cfg     rtConfig
	broker  *broker
	devices []string
	fleets  []*sim.Fleet
	sender  *dupSender
	ag      *benchAgent
	bare    *bareEcho
	host    *hostOnly
}

func runRoundTrip(ctx context.Context, etcd *sandbox.Etcd, cfg rtConfig) ([]*rtResult, error) {
	var out []*rtResult
	for _, name := range cfg.Brokers {
		res := &rtResult{Broker: name}
		out = append(out, res)
		for k, nf := range cfg.Fleets {
			if k > 0 && (cfg.Conc < 2 || cfg.ConcN < 1) {
				break // only the concurrent variant uses the other splits
			}
			fmt.Fprintf(cfg.Log, "roundtrip: %s: starting broker, %d fleet(s), agent, bare paho clients\n", name, nf)
			w, err := newRTWorld(ctx, etcd, name, filepath.Join(cfg.Dir, fmt.Sprintf("%s-%d", name, k)), nf, cfg)
			if err != nil {
				return out, fmt.Errorf("roundtrip on %s: %w", name, err)
			}
			err = w.run(ctx, res, k == 0)
			w.close()
			if err != nil {
				return out, fmt.Errorf("roundtrip on %s: %w", name, err)
			}
		}
	}
	return out, nil
}

// newRTWorld starts a broker, the devices split over fleets sim.Fleets, the
// agent and the bare clients, keeping its files under dir.
func newRTWorld(ctx context.Context, etcd *sandbox.Etcd, name, dir string, fleets int, cfg rtConfig) (_ *rtWorld, err error) {
	w := &rtWorld{cfg: cfg, devices: deviceIDs("dev-", max(cfg.Conc, 1))}
	defer func() {
		if err != nil {
			w.close()
		}
	}()
	if w.broker, err = startBroker(ctx, name, dir); err != nil {
		return nil, err
	}
	topics := mqtt.Topics{Prefix: "bench"}

	// The simulated devices: the real shim (bbolt, fsync per accepted
	// command) behind sim.Fleet, devices split round-robin over Fleets,
	// each with a fresh MQTT session (nothing queued from earlier runs).
	// The agent, built and run as `edgefence run` runs it (agent/daemon):
	// every command goes through the outbox (fsync) to the MQTT Commander.
	// With Sign, commands and acks are signed and verified (I7).
	acfg := agentConfig("bench-agent-"+name, filepath.Join(dir, "agent"), etcd, w.broker.url, w.devices)
	acfg.MQTT.Prefix = topics.Prefix
	fa, err := signWorld(ctx, cfg.Sign, dir, acfg)
	if err != nil {
		return nil, err
	}
	nf := min(max(fleets, 1), len(w.devices))
	if w.fleets, err = startFleets(ctx, dir, w.broker.url, topics.Prefix, "bench-fleet-"+name, w.devices, nf, fa); err != nil {
		return nil, err
	}
	if w.ag, err = startAgent(ctx, acfg, daemon.Options{Sender: func(c *mqtt.Commander) agent.Sender {
		w.sender = &dupSender{Commander: c}
		return w.sender
	}}); err != nil {
		return nil, err
	}
	if err := awaitCtx(ctx, 10*time.Second, w.sender.Client().AwaitSubscribed); err != nil {
		return nil, fmt.Errorf("commander: %w", err)
	}
	if err := waitHoldingAll(ctx, w.ag, len(w.devices), 30*time.Second); err != nil {
		return nil, err
	}
	// Seq 1 of every device's token is accepted here, so that the duplicate
	// path has something to duplicate.
	for _, d := range w.devices {
		if ack, err := w.ag.Send(ctx, d, sim.KindPing, nil); err != nil || ack.Verdict != fence.Accepted {
			return nil, fmt.Errorf("first command to %s: %v %v", d, ack, err)
		}
	}

	// The bare paho baseline on the same broker, with payloads the size of
	// a real envelope and ack.
	env, ack, err := sampleSizes(w.devices[0])
	if err != nil {
		return nil, err
	}
	if w.bare, err = newBareEcho(ctx, w.broker.url, name, filepath.Join(dir, "bare"), len(w.devices), nf, env, ack); err != nil {
		return nil, fmt.Errorf("bare paho: %w", err)
	}
	if w.host, err = newHostOnly(filepath.Join(dir, "host-only", sim.DBFile)); err != nil {
		return nil, err
	}
	return w, nil
}

func (w *rtWorld) close() {
	if w.bare != nil {
		w.bare.close()
	}
	if w.ag != nil {
		_ = w.ag.stop()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, f := range w.fleets {
		_ = f.Close(ctx)
	}
	if w.broker != nil {
		w.broker.stop()
	}
	if w.host != nil {
		_ = w.host.h.Close()
	}
}

// op is one operation by worker i (i selects the device or topic); it
// returns its own latency.
type op func(ctx context.Context, i int) (time.Duration, error)

func (w *rtWorld) ops() []namedOp {
	send := func(want fence.Verdict) op {
		return func(ctx context.Context, i int) (time.Duration, error) {
			start := time.Now()
			ack, err := w.ag.Send(ctx, w.devices[i], sim.KindPing, nil)
			d := time.Since(start)
			if ack == nil {
				return d, err
			}
			if ack.Verdict != want {
				return d, fmt.Errorf("verdict %v, want %v: %v", ack.Verdict, want, err)
			}
			return d, nil
		}
	}
	return []namedOp{
		{path: pathOneHop, f: w.bare.oneHop},
		{path: pathEcho, f: w.bare.echo, write: bareNoWrite},
		{path: pathEchoBolt, f: w.bare.echo, write: bareBolt},
		{path: pathEchoSync, f: w.bare.echo, write: bareDatasync},
		{path: pathEchoBoth, f: w.bare.echo, write: bareBoltBoth},
		{path: pathAccepted, f: send(fence.Accepted)},
		{path: pathDuplicate, f: send(fence.Duplicate), dup: true},
		{path: pathHostAcc, f: w.host.accepted},
		{path: pathHostDup, f: w.host.duplicate},
	}
}

// run measures w into res: the sequential paths if seq, then the concurrent
// ones.
func (w *rtWorld) run(ctx context.Context, res *rtResult, seq bool) error {
	cfg := w.cfg
	res.EnvBytes, res.AckBytes = len(w.bare.env), len(w.bare.ack)
	ops := w.ops()
	nf := len(w.fleets)
	if seq {
		if err := w.runSeq(ctx, res, ops); err != nil {
			return err
		}
	}

	// Concurrent: Conc workers, each on its own device (or topic).
	if cfg.Conc > 1 && cfg.ConcN > 0 {
		fmt.Fprintf(cfg.Log, "roundtrip: %s: concurrent, %d workers, %d fleet(s), %d per path\n", w.broker.name, cfg.Conc, nf, cfg.ConcN)
		for _, o := range ops {
			if o.path == pathOneHop || o.path == pathEchoSync || o.path == pathEchoBoth || o.path == pathHostAcc || o.path == pathHostDup {
				continue // sequential only
			}
			w.prepare(o)
			if _, _, err := runConcurrent(ctx, cfg.Conc, cfg.Conc*max(1, cfg.Warmup/10), o.f); err != nil {
				return fmt.Errorf("%s warm-up: %w", o.path, err)
			}
			l, wl, err := runConcurrent(ctx, cfg.Conc, cfg.ConcN, o.f)
			if err != nil {
				return fmt.Errorf("%s ×%d: %w", o.path, cfg.Conc, err)
			}
			s := summarize(l)
			res.Rows = append(res.Rows, rtRow{Path: o.path, Conc: cfg.Conc, Fleets: nf, S: s, Wall: wl, Rate: float64(s.N) / wl.Seconds()})
		}
	}
	w.prepare(namedOp{})
	st := w.ag.Status().Counters
	fmt.Fprintf(cfg.Log, "roundtrip: %s: agent counters: sent %d accepted %d duplicate %d no-ack %d errors %d\n",
		w.broker.name, st.Sent, st.Accepted, st.Duplicate, st.NoAck, st.SendErrors)
	return nil
}

// namedOp is one path: its operation, and how the world is set for it
// (the duplicate-making Sender, the bare responders' write).
type namedOp struct {
	path  string
	f     op
	dup   bool
	write bareWrite
}

// prepare sets w for o's turn.
func (w *rtWorld) prepare(o namedOp) {
	w.sender.dup.Store(o.dup)
	w.bare.write.Store(int32(o.write))
}

func (w *rtWorld) runSeq(ctx context.Context, res *rtResult, ops []namedOp) error {
	cfg := w.cfg

	// Sequential, one device: the paths take turns in rounds so that load
	// changes during the run hit all of them alike.
	fmt.Fprintf(cfg.Log, "roundtrip: %s: sequential, %d per path in %d rounds (+%d warm-up)\n", w.broker.name, cfg.N, cfg.Rounds, cfg.Warmup)
	lat := make([][]time.Duration, len(ops))
	wall := make([]time.Duration, len(ops))
	for j, o := range ops {
		w.prepare(o)
		for range cfg.Warmup {
			if _, err := o.f(ctx, 0); err != nil {
				return fmt.Errorf("%s warm-up: %w", o.path, err)
			}
		}
		lat[j] = make([]time.Duration, 0, cfg.N)
	}
	rounds := max(1, min(cfg.Rounds, cfg.N))
	for r := range rounds {
		per := cfg.N/rounds + btoi(r < cfg.N%rounds)
		for j, o := range ops {
			w.prepare(o)
			t0 := time.Now()
			for range per {
				d, err := o.f(ctx, 0)
				if err != nil {
					return fmt.Errorf("%s: %w", o.path, err)
				}
				lat[j] = append(lat[j], d)
			}
			wall[j] += time.Since(t0)
		}
	}
	for j, o := range ops {
		s := summarize(lat[j])
		res.Rows = append(res.Rows, rtRow{Path: o.path, Conc: 1, Fleets: len(w.fleets), S: s, Wall: wall[j], Rate: float64(s.N) / wall[j].Seconds()})
	}

	return nil
}

// runConcurrent runs total operations on conc workers (worker i passes i)
// and returns every operation's latency and the wall time.
func runConcurrent(ctx context.Context, conc, total int, f op) ([]time.Duration, time.Duration, error) {
	lats := make([][]time.Duration, conc)
	errs := make([]error, conc)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range conc {
		n := total/conc + btoi(i < total%conc)
		lats[i] = make([]time.Duration, 0, n)
		wg.Go(func() {
			for range n {
				d, err := f(ctx, i)
				if err != nil {
					errs[i] = err
					return
				}
				lats[i] = append(lats[i], d)
			}
		})
	}
	wg.Wait()
	wall := time.Since(start)
	var all []time.Duration
	for _, l := range lats {
		all = append(all, l...)
	}
	return all, wall, errors.Join(errs...)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// sampleSizes returns a real envelope and ack of the benchmark's commands,
// so that the bare baseline moves the same number of bytes.
func sampleSizes(dev string) (env, ack []byte, err error) {
	e := &fence.Envelope{V: fence.Version, Device: dev, Token: 1 << 10, Seq: 1 << 12,
		ID: strings.Repeat("0123456789abcdef", 2), Kind: sim.KindPing, IssuedAt: time.Now().UnixMilli(), Holder: "bench-gw"}
	if env, err = fence.MarshalEnvelope(e); err != nil {
		return nil, nil, err
	}
	a := fence.NewAck(e, fence.Accepted, fence.Mark{Token: e.Token, Seq: e.Seq}, "")
	if ack, err = fence.MarshalAck(&a); err != nil {
		return nil, nil, err
	}
	return env, ack, nil
}

// waitHoldingAll waits until ag holds n devices.
func waitHoldingAll(ctx context.Context, ag *benchAgent, n int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for ag.Status().Counters.Acquired < uint64(n) {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("agent holds %d of %d devices after %v", ag.Status().Counters.Acquired, n, limit)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

func awaitCtx(ctx context.Context, d time.Duration, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return f(ctx)
}

// hostOnly is the device side without the network: sim.Host.Handle (decode,
// check, admit, bbolt commit with fsync, apply, read the state back), as the
// fleet's MQTT handler calls it, on a bbolt file of its own.
type hostOnly struct {
	h   *sim.Host
	seq uint64
}

func newHostOnly(path string) (*hostOnly, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	h, err := sim.OpenHost(path, sim.HostConfig{})
	if err != nil {
		return nil, err
	}
	o := &hostOnly{h: h}
	if _, err := o.accepted(context.Background(), 0); err != nil { // seq 1, for duplicate
		h.Close()
		return nil, err
	}
	return o, nil
}

func (o *hostOnly) handle(seq uint64, want fence.Verdict) (time.Duration, error) {
	raw, err := fence.MarshalEnvelope(&fence.Envelope{V: fence.Version, Device: "dev-000", Token: 1 << 10, Seq: seq,
		ID: strings.Repeat("0123456789abcdef", 2), Kind: sim.KindPing, IssuedAt: time.Now().UnixMilli(), Holder: "bench-gw"})
	if err != nil {
		return 0, err
	}
	start := time.Now()
	out := o.h.Handle("dev-000", raw)
	d := time.Since(start)
	if out.Ack.Verdict != want {
		return d, fmt.Errorf("verdict %v, want %v: %s", out.Ack.Verdict, want, out.Ack.Reason)
	}
	return d, nil
}

func (o *hostOnly) accepted(context.Context, int) (time.Duration, error) {
	o.seq++
	return o.handle(o.seq, fence.Accepted)
}

func (o *hostOnly) duplicate(context.Context, int) (time.Duration, error) {
	return o.handle(1, fence.Duplicate)
}
