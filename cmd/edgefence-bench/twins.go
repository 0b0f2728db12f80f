package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/agent/daemon"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/internal/cputime"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/shadow"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// twinsConfig configures the twin benchmark.
type twinsConfig struct {
	Sizes   []int // devices changing at once in the latency rounds
	Rounds  int   // latency rounds per size
	Devices int   // devices on the agent; all change at once in the throughput runs
	Changes int   // desired changes per device per throughput run (a stream)
	TPRuns  int   // throughput runs
	Fleets  int   // sim.Fleets the devices are split over (device i on fleet i mod Fleets)
	Dir     string
	Log     io.Writer
}

// reqCounts are etcd requests by kind, counted on the agent's client.
type reqCounts struct {
	Range, Txn, Put, Other uint64 // unary calls
	WatchMsgs              uint64 // messages sent on Watch streams (create, cancel, progress)
	KeepAlives             uint64 // messages sent on LeaseKeepAlive streams
	Streams                uint64 // streams opened
}

func (c reqCounts) sub(o reqCounts) reqCounts {
	return reqCounts{c.Range - o.Range, c.Txn - o.Txn, c.Put - o.Put, c.Other - o.Other, c.WatchMsgs - o.WatchMsgs,
		c.KeepAlives - o.KeepAlives, c.Streams - o.Streams}
}

// kv is every request but lease keepalives (the session's background
// traffic, independent of twin updates).
func (c reqCounts) kv() uint64 { return c.Range + c.Txn + c.Put + c.Other + c.WatchMsgs + c.Streams }

// reqCounter counts the gRPC requests of an etcd client by method: unary
// calls, and every message the client sends on a stream.
type reqCounter struct {
	range_, txn, put, other, watch, keepalive, streams atomic.Uint64
}

func (r *reqCounter) count(method string, stream bool) {
	switch {
	case method == "/etcdserverpb.KV/Range":
		r.range_.Add(1)
	case method == "/etcdserverpb.KV/Txn":
		r.txn.Add(1)
	case method == "/etcdserverpb.KV/Put":
		r.put.Add(1)
	case stream && method == "/etcdserverpb.Watch/Watch":
		r.watch.Add(1)
	case stream && method == "/etcdserverpb.Lease/LeaseKeepAlive":
		r.keepalive.Add(1)
	default:
		r.other.Add(1)
	}
}

func (r *reqCounter) snapshot() reqCounts {
	return reqCounts{Range: r.range_.Load(), Txn: r.txn.Load(), Put: r.put.Load(), Other: r.other.Load(),
		WatchMsgs: r.watch.Load(), KeepAlives: r.keepalive.Load(), Streams: r.streams.Load()}
}

func (r *reqCounter) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	r.count(method, false)
	return invoker(ctx, method, req, reply, cc, opts...)
}

func (r *reqCounter) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	r.streams.Add(1)
	s, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return nil, err
	}
	return &countedStream{ClientStream: s, r: r, method: method}, nil
}

type countedStream struct {
	grpc.ClientStream
	r      *reqCounter
	method string
}

func (s *countedStream) SendMsg(m any) error {
	s.r.count(s.method, true)
	return s.ClientStream.SendMsg(m)
}

// twinSender is the agent's Sender: the MQTT Commander, telling the
// observer when a twin.set command was accepted.
type twinSender struct {
	*mqtt.Commander
	obs *twinObserver
}

func (s *twinSender) Send(ctx context.Context, env *fence.Envelope) (*fence.Ack, error) {
	ack, err := s.Commander.Send(ctx, env)
	if err == nil && env.Kind == agent.KindTwinSet && (ack.Verdict == fence.Accepted || ack.Verdict == fence.Duplicate) {
		s.obs.accepted(env.Device, time.Now())
	}
	return ack, err
}

// twinObserver watches every key under the prefix (on its own etcd client)
// and matches puts to what a round waits for: a reported state with a given
// setpoint, or a bare key with a given value.
type twinObserver struct {
	reportedSuffix string

	mu      sync.Mutex
	pending map[string]*twinWait // key → what it waits for
	devKey  map[string]string    // device → its reported key, while pending
	desKey  map[string]*twinWait // desired key → its device's wait, while pending
	done    chan struct{}        // closed when pending empties
	lat     []time.Duration      // put → seen
	acc     []time.Duration      // put → twin.set accepted (twin waits only)
	des     []time.Duration      // put → desired seen by the observer's watch (twin waits only)
}

type twinWait struct {
	sp       float64 // reported setpoint wanted
	val      string  // bare: the value wanted ("" for reported)
	start    time.Time
	desired  time.Time
	accepted time.Time
}

func newTwinObserver() *twinObserver {
	return &twinObserver{reportedSuffix: "/twin/reported", pending: map[string]*twinWait{}, devKey: map[string]string{},
		desKey: map[string]*twinWait{}}
}

// arm starts a new set of waits; want adds them before their puts.
func (o *twinObserver) arm() {
	o.mu.Lock()
	defer o.mu.Unlock()
	clear(o.pending)
	clear(o.devKey)
	clear(o.desKey)
	o.done = make(chan struct{})
	o.lat, o.acc, o.des = nil, nil, nil
}

// want adds a wait for key; for a twin, dev and its desired key desKey
// (empty for a bare key).
func (o *twinObserver) want(key, dev, desKey string, w *twinWait) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.pending[key] = w
	if dev != "" {
		o.devKey[dev] = key
		o.desKey[desKey] = w
	}
}

// restart moves the start of key's wait (a stream's later put).
func (o *twinObserver) restart(key string, sp float64, at time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if w := o.pending[key]; w != nil {
		w.sp, w.start = sp, at
	}
}

func (o *twinObserver) accepted(dev string, at time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if w := o.pending[o.devKey[dev]]; w != nil && w.accepted.IsZero() {
		w.accepted = at
	}
}

func (o *twinObserver) seen(key string, value []byte, at time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if w := o.desKey[key]; w != nil && w.desired.IsZero() && setpointIs(value, w.sp) {
		w.desired = at
	}
	w := o.pending[key]
	if w == nil {
		return
	}
	if w.val != "" {
		if string(value) != w.val {
			return
		}
	} else {
		if !setpointIs(value, w.sp) {
			return
		}
		if !w.accepted.IsZero() {
			o.acc = append(o.acc, w.accepted.Sub(w.start))
		}
		if !w.desired.IsZero() {
			o.des = append(o.des, w.desired.Sub(w.start))
		}
	}
	o.lat = append(o.lat, at.Sub(w.start))
	delete(o.pending, key)
	if len(o.pending) == 0 {
		close(o.done)
	}
}

// setpointIs reports whether value, a twin side as stored in etcd, has
// setpoint sp.
func setpointIs(value []byte, sp float64) bool {
	var r struct {
		State map[string]any `json:"state"`
	}
	if json.Unmarshal(value, &r) != nil {
		return false
	}
	v, _ := r.State["setpoint"].(float64)
	return v == sp
}

// wait waits until every wait is met and returns the latencies: put →
// seen, put → accepted and put → desired seen.
func (o *twinObserver) wait(ctx context.Context, limit time.Duration) (lat, acc, des []time.Duration, err error) {
	o.mu.Lock()
	done := o.done
	o.mu.Unlock()
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		err = errors.New("timed out")
	case <-ctx.Done():
		err = ctx.Err()
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%d still waiting after %v: %w", len(o.pending), limit, err)
	}
	return slices.Clone(o.lat), slices.Clone(o.acc), slices.Clone(o.des), nil
}

// twinLatRow is the latency of one size.
type twinLatRow struct {
	N, Rounds int
	Bare      summary // bare etcd put → watch event
	Desired   summary // desired put → desired seen by a watch
	Accepted  summary // desired put → twin.set accepted (ack in the agent)
	Reported  summary // desired put → reported with the new value (watch event)
	Reqs      reqCounts
	Updates   int // converged updates (N × Rounds)
	TwinSets  uint64
	Written   uint64
	Reports   uint64
}

// twinTPRun is one throughput run.
type twinTPRun struct {
	Devices, Changes int
	BarePuts         time.Duration // Devices bare etcd puts, 64 at a time, just before
	Puts             time.Duration // all desired puts done
	Converged        time.Duration // all reported match the last change
	CPU              time.Duration // this process's CPU time (user + system) from the first desired put to all converged: etcd, mochi, devices, agent, application
	Reqs             reqCounts
	TwinSets         uint64
	Written          uint64
	Reports          uint64
	Errors           uint64
}

type twinsResult struct {
	Devices int
	Fleets  int
	Held    time.Duration
	Lat     []twinLatRow
	TP      []twinTPRun
}

func runTwins(ctx context.Context, etcd *sandbox.Etcd, cfg twinsConfig) (*twinsResult, error) {
	res := &twinsResult{Devices: cfg.Devices}
	nf := min(max(cfg.Fleets, 1), cfg.Devices)
	res.Fleets = nf
	dir := filepath.Join(cfg.Dir, "twins")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return res, err
	}
	br, err := sandbox.StartBroker(sandbox.BrokerConfig{})
	if err != nil {
		return res, err
	}
	defer br.Close()
	w := &twinsWorld{cfg: cfg, devs: deviceIDs("tw-", cfg.Devices), obs: newTwinObserver(), counter: &reqCounter{}}
	fleets, err := startFleets(ctx, dir, br.URL(), "twins", "bench-twins-fleet", w.devs, nf, fleetAuth{})
	defer closeFleets(fleets)
	if err != nil {
		return res, err
	}
	w.prefix = fmt.Sprintf("/bench/twins-%d", time.Now().UnixNano())
	// The agent's etcd client counts its requests; the application's and
	// the observer's (cli) are not counted.
	if w.cli, err = etcd.Client(); err != nil {
		return res, err
	}
	defer w.cli.Close()
	if err := w.startAgent(ctx, etcd, filepath.Join(dir, "agent"), br.URL()); err != nil {
		return res, err
	}
	defer func() { _ = w.a.stop() }()
	if res.Held, err = w.awaitHeld(ctx); err != nil {
		return res, err
	}
	defer w.watch(ctx)()
	w.app = shadow.NewStore(w.cli, shadow.StoreConfig{Prefix: w.prefix, Writer: "bench-app"})
	if err := w.settle(ctx); err != nil {
		return res, err
	}
	for _, n := range cfg.Sizes {
		row, err := w.latency(ctx, min(n, len(w.devs)))
		if err != nil {
			return res, err
		}
		res.Lat = append(res.Lat, row)
	}
	for r := range cfg.TPRuns {
		run, err := w.throughput(ctx, r)
		if err != nil {
			return res, fmt.Errorf("throughput run %d: %w", r+1, err)
		}
		res.TP = append(res.TP, run)
	}
	for i, f := range fleets {
		if s := f.Stats(); s.AckErrors+s.StateErrors > 0 {
			fmt.Fprintf(cfg.Log, "twins: fleet %d: %d acks and %d state reports not published\n", i, s.AckErrors, s.StateErrors)
		}
	}
	return res, nil
}

// twinsWorld is what the twins benchmark measures on: the agent (its etcd
// requests counted), the application's twin store and the observer, both
// on their own etcd client (cli), everything under prefix.
type twinsWorld struct {
	cfg     twinsConfig
	devs    []string
	prefix  string
	cli     *clientv3.Client
	app     *shadow.Store
	obs     *twinObserver
	counter *reqCounter
	a       *benchAgent
	cmdr    *mqtt.Commander // the agent's
	gen     int             // setpoints handed out
}

// nextSP returns a setpoint different from the one before.
func (w *twinsWorld) nextSP() float64 { w.gen++; return 10 + float64(w.gen%40)*0.5 }

// startAgent starts the agent as `edgefence run` builds it (agent/daemon):
// outbox, twin cache, the devices' state reports wired to the reconciler;
// its state in dir. Stop it with w.a.stop.
func (w *twinsWorld) startAgent(ctx context.Context, etcd *sandbox.Etcd, dir, brokerURL string) error {
	acfg := agentConfig("bench-twins", dir, etcd, brokerURL, w.devs)
	acfg.Etcd.Prefix, acfg.MQTT.Prefix, acfg.Command.Timeout = w.prefix, "twins", 20*time.Second
	acfg.Twins.Enabled = true
	var err error
	w.a, err = startAgent(ctx, acfg, daemon.Options{
		EtcdClient: func(c *clientv3.Config) {
			c.DialOptions = append(c.DialOptions, grpc.WithChainUnaryInterceptor(w.counter.unary), grpc.WithChainStreamInterceptor(w.counter.stream))
		},
		Sender: func(c *mqtt.Commander) agent.Sender {
			w.cmdr = c
			return &twinSender{Commander: c, obs: w.obs}
		}})
	return err
}

// awaitHeld waits for the agent's Commander to subscribe and for the agent
// to hold every device, and returns the time from its start.
func (w *twinsWorld) awaitHeld(ctx context.Context) (time.Duration, error) {
	if err := awaitCtx(ctx, 10*time.Second, w.cmdr.Client().AwaitSubscribed); err != nil {
		return 0, fmt.Errorf("commander: %w", err)
	}
	if err := waitHoldingAll(ctx, w.a, len(w.devs), 60*time.Second); err != nil {
		return 0, err
	}
	held := time.Since(w.a.started)
	fmt.Fprintf(w.cfg.Log, "twins: agent holds %d devices after %s ms\n", len(w.devs), ms(held))
	return held, nil
}

// watch starts the observer's watch of everything under the prefix and
// returns the function that ends it.
func (w *twinsWorld) watch(ctx context.Context) (stop func()) {
	wctx, wcancel := context.WithCancel(ctx)
	wch := w.cli.Watch(wctx, w.prefix+"/", clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	wdone := make(chan struct{})
	<-wch // created
	go func() {
		defer close(wdone)
		for resp := range wch {
			now := time.Now()
			for _, e := range resp.Events {
				if e.Type == clientv3.EventTypePut {
					w.obs.seen(string(e.Kv.Key), e.Kv.Value, now)
				}
			}
		}
	}()
	return func() { wcancel(); <-wdone }
}

// settle writes the first desired state of every device (the initial
// reported state has no setpoint), so that every measured change is a
// change, and waits for it to converge.
func (w *twinsWorld) settle(ctx context.Context) error {
	fmt.Fprintf(w.cfg.Log, "twins: initial desired state for %d devices\n", len(w.devs))
	if _, err := twinWave(ctx, w.app, w.obs, w.devs, w.nextSP(), 64); err != nil {
		return fmt.Errorf("initial wave: %w", err)
	}
	if _, _, _, err := w.obs.wait(ctx, 5*time.Minute); err != nil {
		return fmt.Errorf("initial wave: %w", err)
	}
	quiesce(ctx, w.a.Agent, w.counter)
	return nil
}

// latency runs the latency rounds of n devices changing at once: in each,
// n bare etcd puts, then n desired changes.
func (w *twinsWorld) latency(ctx context.Context, n int) (twinLatRow, error) {
	row := twinLatRow{N: n, Rounds: w.cfg.Rounds}
	var bare, des, acc, rep []time.Duration
	st0 := w.a.TwinStats()
	var reqs reqCounts
	for r := range w.cfg.Rounds {
		l, err := w.bareRound(ctx, n, fmt.Sprint(r))
		if err != nil {
			return row, fmt.Errorf("%d devices, round %d, bare: %w", n, r+1, err)
		}
		bare = append(bare, l...)

		// Desired put → twin.set accepted → reported written.
		c0 := w.counter.snapshot()
		if _, err := twinWave(ctx, w.app, w.obs, w.devs[:n], w.nextSP(), n); err != nil {
			return row, fmt.Errorf("%d devices, round %d: %w", n, r+1, err)
		}
		l, ac, de, err := w.obs.wait(ctx, 2*time.Minute)
		if err != nil {
			return row, fmt.Errorf("%d devices, round %d: %w", n, r+1, err)
		}
		rep, acc, des = append(rep, l...), append(acc, ac...), append(des, de...)
		// Count until the agent is quiet again (device state reports
		// land after the reported write the round waits for), but
		// not the bare puts of the next round.
		quiesce(ctx, w.a.Agent, w.counter)
		reqs = addCounts(reqs, w.counter.snapshot().sub(c0))
	}
	st1 := w.a.TwinStats()
	row.Bare, row.Desired, row.Accepted, row.Reported = summarize(bare), summarize(des), summarize(acc), summarize(rep)
	row.Reqs, row.Updates = reqs, n*w.cfg.Rounds
	row.TwinSets, row.Written, row.Reports = st1.Sent-st0.Sent, st1.Written-st0.Written, st1.Reports-st0.Reports
	fmt.Fprintf(w.cfg.Log, "twins: %d at once, %d rounds: reported p50 %s ms p99 %s ms (bare p50 %s ms); %.2f etcd req/update\n",
		n, w.cfg.Rounds, ms(row.Reported.P50), ms(row.Reported.P99), ms(row.Bare.P50), float64(reqs.kv())/float64(row.Updates))
	return row, nil
}

// bareRound puts val to a bare key of each of the first n devices at once
// and returns the latencies put → watch event.
func (w *twinsWorld) bareRound(ctx context.Context, n int, val string) ([]time.Duration, error) {
	w.obs.arm()
	var wg sync.WaitGroup
	for _, d := range w.devs[:n] {
		key := w.prefix + "/bare/" + d
		wg.Go(func() {
			w.obs.want(key, "", "", &twinWait{val: val, start: time.Now()})
			if _, err := w.cli.Put(ctx, key, val); err != nil {
				fmt.Fprintln(w.cfg.Log, "twins: bare put:", err)
			}
		})
	}
	wg.Wait()
	l, _, _, err := w.obs.wait(ctx, time.Minute)
	return l, err
}

// throughput is throughput run r: every device's desired changed at once,
// cfg.Changes times, after as many bare etcd puts for a baseline.
func (w *twinsWorld) throughput(ctx context.Context, r int) (twinTPRun, error) {
	run := twinTPRun{Devices: len(w.devs), Changes: w.cfg.Changes}
	// Baseline: the same number of bare etcd puts, as many at a time
	// as the application writes desired states.
	b0 := time.Now()
	if err := barePuts(ctx, w.cli, w.prefix+"/bare-tp/", w.devs, 64); err != nil {
		return run, fmt.Errorf("bare puts: %w", err)
	}
	run.BarePuts = time.Since(b0)
	c0, st0 := w.counter.snapshot(), w.a.TwinStats()
	cpu0 := cputime.Process()
	t0 := time.Now()
	for k := range w.cfg.Changes {
		sp := w.nextSP()
		if k == 0 {
			if _, err := twinWave(ctx, w.app, w.obs, w.devs, sp, 64); err != nil {
				return run, err
			}
			continue
		}
		if err := twinStream(ctx, w.app, w.obs, w.devs, sp, 64); err != nil {
			return run, err
		}
	}
	run.Puts = time.Since(t0)
	if _, _, _, err := w.obs.wait(ctx, 5*time.Minute); err != nil {
		return run, err
	}
	run.Converged = time.Since(t0)
	run.CPU = cputime.Process() - cpu0
	quiesce(ctx, w.a.Agent, w.counter)
	st1 := w.a.TwinStats()
	run.Reqs = w.counter.snapshot().sub(c0)
	run.TwinSets, run.Written, run.Reports, run.Errors = st1.Sent-st0.Sent, st1.Written-st0.Written, st1.Reports-st0.Reports, st1.Errors-st0.Errors
	fmt.Fprintf(w.cfg.Log, "twins: throughput run %d: %d devices × %d changes: puts done %s ms, all converged %s ms (%.0f devices/s), %.2f etcd req/device\n",
		r+1, run.Devices, run.Changes, ms(run.Puts), ms(run.Converged), float64(run.Devices)/run.Converged.Seconds(), float64(run.Reqs.kv())/float64(run.Devices))
	return run, nil
}

// barePuts puts one key per device under prefix, conc at a time.
func barePuts(ctx context.Context, cli *clientv3.Client, prefix string, devs []string, conc int) error {
	sem := make(chan struct{}, conc)
	var wg sync.WaitGroup
	var errs atomic.Pointer[error]
	for _, d := range devs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if _, err := cli.Put(ctx, prefix+d, "x"); err != nil {
				errs.CompareAndSwap(nil, &err)
			}
		})
	}
	wg.Wait()
	if e := errs.Load(); e != nil {
		return *e
	}
	return nil
}

func addCounts(a, b reqCounts) reqCounts {
	return reqCounts{a.Range + b.Range, a.Txn + b.Txn, a.Put + b.Put, a.Other + b.Other, a.WatchMsgs + b.WatchMsgs,
		a.KeepAlives + b.KeepAlives, a.Streams + b.Streams}
}

// twinWave arms the observer and writes desired setpoint sp to every device
// of devs, conc at a time, each wait added before its put; it returns when
// the puts are done.
func twinWave(ctx context.Context, app *shadow.Store, obs *twinObserver, devs []string, sp float64, conc int) (time.Duration, error) {
	obs.arm()
	start := time.Now()
	sem := make(chan struct{}, max(conc, 1))
	var wg sync.WaitGroup
	var errs atomic.Pointer[error]
	for _, d := range devs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			obs.want(app.ReportedKey(d), d, app.DesiredKey(d), &twinWait{sp: sp, start: time.Now()})
			if _, err := app.UpdateDesiredAny(ctx, d, map[string]any{"setpoint": sp}); err != nil {
				errs.CompareAndSwap(nil, &err)
			}
		})
	}
	wg.Wait()
	if e := errs.Load(); e != nil {
		return 0, *e
	}
	return time.Since(start), nil
}

// twinStream writes a later change of a stream: the waits now want sp
// (those already met are met again by the new value: they are re-armed).
func twinStream(ctx context.Context, app *shadow.Store, obs *twinObserver, devs []string, sp float64, conc int) error {
	sem := make(chan struct{}, max(conc, 1))
	var wg sync.WaitGroup
	var errs atomic.Pointer[error]
	for _, d := range devs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			key := app.ReportedKey(d)
			obs.mu.Lock()
			w := obs.pending[key]
			if w == nil {
				// Met already: wait again, for the new value.
				if len(obs.pending) == 0 {
					obs.done = make(chan struct{})
				}
				obs.pending[key] = &twinWait{sp: sp, start: time.Now()}
				obs.devKey[d] = key
			}
			obs.mu.Unlock()
			if w != nil {
				obs.restart(key, sp, time.Now())
			}
			if _, err := app.UpdateDesiredAny(ctx, d, map[string]any{"setpoint": sp}); err != nil {
				errs.CompareAndSwap(nil, &err)
			}
		})
	}
	wg.Wait()
	if e := errs.Load(); e != nil {
		return *e
	}
	return nil
}

// quiesce waits until the agent's twin counters and its etcd requests
// (keepalives aside) have not moved for 100 ms, at most 10 s.
func quiesce(ctx context.Context, a *agent.Agent, c *reqCounter) {
	type snap struct {
		st agent.TwinStats
		kv uint64
	}
	take := func() snap { return snap{a.TwinStats(), c.snapshot().kv()} }
	last, since := take(), time.Now()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && ctx.Err() == nil; {
		time.Sleep(10 * time.Millisecond)
		if s := take(); s != last {
			last, since = s, time.Now()
			continue
		}
		if time.Since(since) >= 100*time.Millisecond {
			return
		}
	}
}

// perUpdate formats n per update.
func perUpdate(n uint64, updates int) string {
	if updates == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", float64(n)/float64(updates))
}

func printTwins(w io.Writer, r *twinsResult) {
	fmt.Fprintf(w, "### Twin convergence: one agent holding %d devices on %d sim.Fleet(s) (built by agent/daemon as `edgefence run` builds it: outbox, twin cache, device state reports; all held after %s ms)\n\n",
		r.Devices, r.Fleets, ms(r.Held))
	if len(r.Lat) > 0 {
		fmt.Fprintln(w, "Latency from the desired put (an application's `UpdateDesiredAny` on its own etcd client) to the twin.set")
		fmt.Fprintln(w, "ack in the agent, and to the reported state with the new setpoint seen by a watch; beside it, in the same")
		fmt.Fprintln(w, "rounds, a bare etcd put → watch event of the same number of keys at once.")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| devices at once | rounds | path | n | p50 ms | p90 ms | p99 ms | max ms |")
		fmt.Fprintln(w, "|---:|---:|---|---:|---:|---:|---:|---:|")
		for _, x := range r.Lat {
			for _, p := range []struct {
				name string
				s    summary
			}{{"bare etcd put → watch event", x.Bare}, {"desired put → desired watch event", x.Desired},
				{"desired put → twin.set accepted (ack)", x.Accepted},
				{"desired put → reported written (watch)", x.Reported}} {
				fmt.Fprintf(w, "| %d | %d | %s | %d | %s | %s | %s | %s |\n", x.N, x.Rounds, p.name, p.s.N,
					ms(p.s.P50), ms(p.s.P90), ms(p.s.P99), ms(p.s.Max))
			}
		}
		fmt.Fprintln(w)
		for _, x := range r.Lat {
			if x.Bare.P50 > 0 {
				fmt.Fprintf(w, "- %d at once: reported p50 = %.1f× the bare put → watch p50, p99 = %.1f× the bare p99\n", x.N,
					float64(x.Reported.P50)/float64(x.Bare.P50), float64(x.Reported.P99)/float64(max(x.Bare.P99, 1)))
			}
		}
		fmt.Fprintln(w)
	}
	if len(r.TP) > 0 {
		fmt.Fprintf(w, "### Twin sync throughput: %d devices on one agent, every device's desired changed at once\n\n", r.Devices)
		fmt.Fprintln(w, "The bare column is the same number of plain etcd puts, 64 at a time, just before each run (etcd's own")
		fmt.Fprintln(w, "write rate at that moment); the desired puts are 64 `UpdateDesiredAny` at a time (a Range and a Txn each).")
		fmt.Fprintln(w, "CPU is this whole process's (etcd, mochi, devices, agent, application, observer) per converged device.")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| run | changes/device | bare etcd puts ms (puts/s) | desired puts done ms | all reported match ms | converged devices/s | CPU ms / update | desired writes/s | twin.set sent | reported writes | device reports written | errors |")
		fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
		var rates []float64
		for i, x := range r.TP {
			rate := float64(x.Devices) / x.Converged.Seconds()
			rates = append(rates, rate)
			fmt.Fprintf(w, "| %d | %d | %s (%.0f) | %s | %s | %.0f | %.2f | %.0f | %d | %d | %d | %d |\n", i+1, x.Changes, ms(x.BarePuts),
				float64(x.Devices)/x.BarePuts.Seconds(), ms(x.Puts), ms(x.Converged),
				rate, float64(x.CPU)/float64(time.Millisecond)/float64(x.Devices), float64(x.Devices*x.Changes)/x.Converged.Seconds(), x.TwinSets, x.Written, x.Reports, x.Errors)
		}
		fmt.Fprintf(w, "| **median** | | | | | **%.0f** | | | | | | |\n\n", medianFloat(rates))
	}
	fmt.Fprintln(w, "### etcd requests per converged twin update (agent's etcd client, gRPC interceptors)")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Counted from the desired put until the agent is quiet again (device state reports included). Lease")
	fmt.Fprintln(w, "keepalives are the session's background traffic, shown apart and not in the total.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| phase | updates | Range | Txn | Put | watch msgs | streams opened | other | **total / update** | keepalives |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	row := func(name string, c reqCounts, updates int) {
		fmt.Fprintf(w, "| %s | %d | %s | %s | %s | %s | %s | %s | **%s** | %d |\n", name, updates, perUpdate(c.Range, updates),
			perUpdate(c.Txn, updates), perUpdate(c.Put, updates), perUpdate(c.WatchMsgs, updates), perUpdate(c.Streams, updates),
			perUpdate(c.Other, updates), perUpdate(c.kv(), updates), c.KeepAlives)
	}
	for _, x := range r.Lat {
		row(fmt.Sprintf("latency, %d at once", x.N), x.Reqs, x.Updates)
	}
	for i, x := range r.TP {
		row(fmt.Sprintf("throughput run %d (%d × %d changes)", i+1, x.Devices, x.Changes), x.Reqs, x.Devices)
	}
	fmt.Fprintln(w)
	var sets, writes, reps uint64
	var ups int
	for _, x := range r.Lat {
		sets, writes, reps, ups = sets+x.TwinSets, writes+x.Written, reps+x.Reports, ups+x.Updates
	}
	if ups > 0 {
		fmt.Fprintf(w, "- latency rounds: per converged update %s twin.set sent, %s reconciler reported writes, %s device reports written\n\n",
			perUpdate(sets, ups), perUpdate(writes, ups), perUpdate(reps, ups))
	}
}
