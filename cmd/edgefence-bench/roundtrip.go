package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"

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
	if w.bare, err = newBareEcho(ctx, w.broker.url, name, len(w.devices), nf, env, ack); err != nil {
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
		{pathOneHop, false, w.bare.oneHop},
		{pathEcho, false, w.bare.echo},
		{pathAccepted, false, send(fence.Accepted)},
		{pathDuplicate, true, send(fence.Duplicate)},
		{pathHostAcc, false, w.host.accepted},
		{pathHostDup, false, w.host.duplicate},
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
			if o.path == pathOneHop || o.path == pathHostAcc || o.path == pathHostDup {
				continue // sequential only
			}
			w.sender.dup.Store(o.dup)
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
	w.sender.dup.Store(false)
	st := w.ag.Status().Counters
	fmt.Fprintf(cfg.Log, "roundtrip: %s: agent counters: sent %d accepted %d duplicate %d no-ack %d errors %d\n",
		w.broker.name, st.Sent, st.Accepted, st.Duplicate, st.NoAck, st.SendErrors)
	return nil
}

type namedOp = struct {
	path string
	dup  bool
	f    op
}

func (w *rtWorld) runSeq(ctx context.Context, res *rtResult, ops []namedOp) error {
	cfg := w.cfg

	// Sequential, one device: the paths take turns in rounds so that load
	// changes during the run hit all of them alike.
	fmt.Fprintf(cfg.Log, "roundtrip: %s: sequential, %d per path in %d rounds (+%d warm-up)\n", w.broker.name, cfg.N, cfg.Rounds, cfg.Warmup)
	lat := make([][]time.Duration, len(ops))
	wall := make([]time.Duration, len(ops))
	for j, o := range ops {
		w.sender.dup.Store(o.dup)
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
			w.sender.dup.Store(o.dup)
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

// bareEcho is the bare paho baseline: autopaho clients (no edgefence
// code) on the same broker. The requester publishes at QoS 1 and waits for
// the PUBACK; a responder's handler receives it (1 hop) and, for the
// request→reply path, publishes the reply at QoS 1 from inside the handler,
// as the device simulator publishes its ack; the requester's handler
// receives the reply (2 hops). Worker i's requests go to responder i mod
// len(rsp), as device i's commands go to fleet i mod fleets.
type bareEcho struct {
	env, ack []byte
	req      *autopaho.ConnectionManager
	rsp      []*autopaho.ConnectionManager
	hop      chan time.Time  // 1-hop receptions
	replies  []chan struct{} // per worker
	cancel   context.CancelFunc
}

const (
	bareOneTopic = "bare/one"
	bareReq      = "bare/req/" // + responder + "/" + worker
	bareRep      = "bare/rep/" // + worker
)

func newBareEcho(ctx context.Context, brokerURL, name string, workers, responders int, env, ack []byte) (b *bareEcho, err error) {
	u, err := url.Parse(brokerURL)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithCancel(context.Background())
	b = &bareEcho{env: env, ack: ack, hop: make(chan time.Time, 1), cancel: cancel}
	defer func() {
		if err != nil {
			b.close()
		}
	}()
	for range workers {
		b.replies = append(b.replies, make(chan struct{}, 1))
	}
	connect := func(id string, onMsg func(paho.PublishReceived) (bool, error)) (*autopaho.ConnectionManager, error) {
		cfg := autopaho.ClientConfig{
			ServerUrls:                    []*url.URL{u},
			KeepAlive:                     30,
			CleanStartOnInitialConnection: true,
			ConnectTimeout:                5 * time.Second,
			ClientConfig: paho.ClientConfig{
				ClientID:          id,
				OnPublishReceived: []func(paho.PublishReceived) (bool, error){onMsg},
			},
		}
		cm, err := autopaho.NewConnection(cctx, cfg)
		if err != nil {
			return nil, err
		}
		if err := awaitCtx(ctx, 10*time.Second, cm.AwaitConnection); err != nil {
			return nil, err
		}
		return cm, nil
	}
	sub := func(cm *autopaho.ConnectionManager, filters ...string) error {
		s := &paho.Subscribe{}
		for _, f := range filters {
			s.Subscriptions = append(s.Subscriptions, paho.SubscribeOptions{Topic: f, QoS: 1})
		}
		_, err := cm.Subscribe(ctx, s)
		return err
	}
	for r := range max(responders, 1) {
		var cm *autopaho.ConnectionManager
		cm, err = connect(fmt.Sprintf("bench-bare-rsp-%s-%d", name, r), func(pr paho.PublishReceived) (bool, error) {
			return b.onRequest(cm, pr)
		})
		if err != nil {
			return nil, err
		}
		b.rsp = append(b.rsp, cm)
		filters := []string{fmt.Sprintf("%s%d/+", bareReq, r)}
		if r == 0 {
			filters = append(filters, bareOneTopic)
		}
		if err = sub(cm, filters...); err != nil {
			return nil, err
		}
	}
	if b.req, err = connect("bench-bare-req-"+name, b.onReply); err != nil {
		return nil, err
	}
	if err = sub(b.req, bareRep+"+"); err != nil {
		return nil, err
	}
	return b, nil
}

func (b *bareEcho) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, cm := range append([]*autopaho.ConnectionManager{b.req}, b.rsp...) {
		if cm != nil {
			_ = cm.Disconnect(ctx)
		}
	}
	b.cancel()
}

func (b *bareEcho) onRequest(cm *autopaho.ConnectionManager, pr paho.PublishReceived) (bool, error) {
	p := pr.Packet
	if p.Topic == bareOneTopic {
		b.hop <- time.Now()
		return true, nil
	}
	worker := p.Topic[strings.LastIndexByte(p.Topic, '/')+1:]
	var corr []byte
	if p.Properties != nil {
		corr = p.Properties.CorrelationData
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _ = cm.Publish(ctx, &paho.Publish{QoS: 1, Topic: bareRep + worker, Payload: b.ack,
		Properties: &paho.PublishProperties{CorrelationData: corr}})
	return true, nil
}

func (b *bareEcho) onReply(pr paho.PublishReceived) (bool, error) {
	i, err := strconv.Atoi(strings.TrimPrefix(pr.Packet.Topic, bareRep))
	if err == nil && i >= 0 && i < len(b.replies) {
		select {
		case b.replies[i] <- struct{}{}:
		default:
		}
	}
	return true, nil
}

var corrData = []byte(strings.Repeat("0123456789abcdef", 2))

// oneHop is transport/mqtt's BenchmarkRoundTrip: from the start of Publish
// to the subscriber's handler, each publish also waiting for its PUBACK.
func (b *bareEcho) oneHop(ctx context.Context, _ int) (time.Duration, error) {
	start := time.Now()
	if _, err := b.req.Publish(ctx, &paho.Publish{QoS: 1, Topic: bareOneTopic, Payload: b.env,
		Properties: &paho.PublishProperties{CorrelationData: corrData, ResponseTopic: bareRep + "0"}}); err != nil {
		return 0, err
	}
	select {
	case t := <-b.hop:
		return t.Sub(start), nil
	case <-time.After(10 * time.Second):
		return 0, errors.New("no delivery within 10s")
	}
}

// echo is request→reply: from the start of Publish until the requester has
// the reply in hand (as agent.Send has the ack).
func (b *bareEcho) echo(ctx context.Context, i int) (time.Duration, error) {
	is := strconv.Itoa(i)
	topic := fmt.Sprintf("%s%d/%d", bareReq, i%len(b.rsp), i)
	start := time.Now()
	if _, err := b.req.Publish(ctx, &paho.Publish{QoS: 1, Topic: topic, Payload: b.env,
		Properties: &paho.PublishProperties{CorrelationData: corrData, ResponseTopic: bareRep + is}}); err != nil {
		return 0, err
	}
	select {
	case <-b.replies[i]:
		return time.Since(start), nil
	case <-time.After(10 * time.Second):
		return 0, errors.New("no reply within 10s")
	}
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
