package agent

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/offline"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// The end-to-end benchmarks of the command path and of lock acquisition, on
// real components in this process: the embedded etcd of TestMain, an
// MQTT broker (mochi in process, or Mosquitto if installed), a
// transport/mqtt Commander as the agent's Sender, and sim.Fleet devices
// behind the real shim (bbolt, fsync per accepted command).
// cmd/edgefence-bench measures the same paths with more detail (bare paho
// baselines in the same run, interleaved rounds, RSS of the real binary);
// docs/BENCHMARKS.md records both.
//
//	go test -run '^$' -bench . -benchtime 3000x ./agent/
//
// Nothing here asserts timings: a slow machine makes slow numbers, not
// failures.

// benchDupSender rewrites every envelope's seq to 1 while dup is set: the
// device has already accepted seq 1 under the current token and answers
// Duplicate without a write (no fsync, no state publish). The rest of the
// path is unchanged.
type benchDupSender struct {
	next Sender
	dup  atomic.Bool
}

func (s *benchDupSender) Send(ctx context.Context, env *fence.Envelope) (*fence.Ack, error) {
	if s.dup.Load() {
		e := *env
		e.Seq = 1
		env = &e
	}
	return s.next.Send(ctx, env)
}

// benchWorld is a broker, fleets of simulated devices and an agent holding
// them, torn down when the benchmark ends.
type benchWorld struct {
	url     string
	agent   *Agent
	sender  *benchDupSender
	devices []string
}

// benchBrokers returns the brokers to run on: mochi, and Mosquitto when it is
// installed.
func benchBrokers() []string {
	bs := []string{"mochi"}
	if _, err := os.Stat(sandbox.MosquittoPath); err == nil {
		bs = append(bs, "mosquitto")
	}
	return bs
}

func startBenchBroker(b testing.TB, name string) string {
	b.Helper()
	switch name {
	case "mochi":
		br, err := sandbox.StartBroker(sandbox.BrokerConfig{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { br.Close() })
		return br.URL()
	case "mosquitto":
		m, err := sandbox.StartMosquitto(context.Background(), b.TempDir())
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { m.Close() })
		return m.URL()
	}
	b.Fatalf("unknown broker %q", name)
	return ""
}

// newBenchWorld starts a broker, nDev devices split round-robin over nFleets
// sim.Fleets, and an agent holding all of them; each device has accepted
// one command. tweak, if given, adjusts the agent's config.
func newBenchWorld(b testing.TB, broker string, nDev, nFleets int, tweak ...func(*Config)) *benchWorld {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w := &benchWorld{url: startBenchBroker(b, broker)}
	for i := range nDev {
		w.devices = append(w.devices, fmt.Sprintf("dev-%03d", i))
	}
	topics := mqtt.Topics{Prefix: "bench"}
	fresh := mqtt.Config{CleanStart: true, SessionExpiry: -1}
	parts := make([][]string, min(nFleets, nDev))
	for i, d := range w.devices {
		parts[i%len(parts)] = append(parts[i%len(parts)], d)
	}
	for i, p := range parts {
		f, err := sim.NewFleet(ctx, sim.FleetConfig{Devices: p, DataDir: b.TempDir(), Broker: w.url, Prefix: topics.Prefix,
			ClientID: fmt.Sprintf("bench-fleet-%d", i), MQTT: fresh})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			f.Close(c)
		})
		if err := f.AwaitReady(ctx); err != nil {
			b.Fatal(err)
		}
	}
	mc := fresh
	mc.Brokers, mc.ClientID = []string{w.url}, "bench-agent"
	cmdr, err := mqtt.NewCommander(context.Background(), mc, topics, w.devices)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		cmdr.Close(c)
	})
	if err := cmdr.Client().AwaitSubscribed(ctx); err != nil {
		b.Fatal(err)
	}
	w.sender = &benchDupSender{next: cmdr}
	w.agent = startBenchAgent(b, w.devices, w.sender, w.url, nil, tweak...)
	waitHeld(b, w.agent, len(w.devices))
	for _, d := range w.devices {
		if ack, err := w.agent.Send(ctx, d, sim.KindPing, nil); err != nil || ack.Verdict != fence.Accepted {
			b.Fatalf("first command to %s: %+v %v", d, ack, err)
		}
	}
	return w
}

// startBenchAgent runs an agent for devs under a fresh prefix until the
// benchmark ends; the returned stop is idempotent.
func startBenchAgent(b testing.TB, devs []string, s Sender, brokerURL string, log *slog.Logger, tweak ...func(*Config)) *Agent {
	a, _, stop := newBenchAgent(b, devs, s, brokerURL, Options{Logger: log}, tweak...)
	b.Cleanup(stop)
	return a
}

var benchPrefixes atomic.Uint64

// newBenchAgent starts an agent and returns it, when its Run started, and a
// function that stops it.
func newBenchAgent(b testing.TB, devs []string, s Sender, brokerURL string, o Options, tweak ...func(*Config)) (*Agent, time.Time, func()) {
	b.Helper()
	cfg := &Config{Gateway: "bench-gw",
		Etcd:    EtcdConfig{Endpoints: testEtcd.Endpoints(), Prefix: fmt.Sprintf("/bench/%d", benchPrefixes.Add(1)), LeaseTTL: 10 * time.Second},
		MQTT:    MQTTConfig{Brokers: []string{brokerURL}, Prefix: "bench"},
		Command: CommandConfig{Timeout: 10 * time.Second}}
	for _, d := range devs {
		cfg.Devices = append(cfg.Devices, DeviceConfig{ID: d, Auth: AuthOff})
	}
	for _, f := range tweak {
		f(cfg)
	}
	cli, err := testEtcd.Client()
	if err != nil {
		b.Fatal(err)
	}
	a, err := newAgent(b, cfg, cli, s, o)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	started := time.Now()
	go func() {
		defer close(done)
		_ = a.Run(ctx)
	}()
	var once sync.Once
	return a, started, func() { once.Do(func() { cancel(); <-done; cli.Close() }) }
}

func waitHeld(b testing.TB, a *Agent, n int) {
	b.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for a.leases.stats.acquired.Load() < uint64(n) {
		if time.Now().After(deadline) {
			b.Fatalf("agent holds %d of %d devices after 60s", a.leases.stats.acquired.Load(), n)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// reportLatency reports the median and 99th percentile of lat.
func reportLatency(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	pct := func(p float64) float64 {
		return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))]) / float64(time.Microsecond)
	}
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
}

// BenchmarkSendRoundTrip is one command at a time to one device: agent.Send
// → Commander → broker → sim.Fleet (shim) → ack → Send returns. Beside it,
// on the same broker, the bare publish→receive of transport/mqtt's
// BenchmarkRoundTrip (one hop, the same Client type).
func BenchmarkSendRoundTrip(b *testing.B) {
	for _, br := range benchBrokers() {
		b.Run("broker="+br, func(b *testing.B) {
			w := newBenchWorld(b, br, 1, 1)
			b.Run("bare-1hop", func(b *testing.B) { benchBareOneHop(b, w.url) })
			for _, dup := range []bool{false, true} {
				name := "accepted-fsync"
				if dup {
					name = "duplicate-nowrite"
				}
				b.Run(name, func(b *testing.B) {
					w.sender.dup.Store(dup)
					defer w.sender.dup.Store(false)
					want := fence.Accepted
					if dup {
						want = fence.Duplicate
					}
					ctx := context.Background()
					lat := make([]time.Duration, 0, b.N)
					b.ReportAllocs()
					b.ResetTimer()
					for range b.N {
						start := time.Now()
						ack, err := w.agent.Send(ctx, w.devices[0], sim.KindPing, nil)
						lat = append(lat, time.Since(start))
						if ack == nil || ack.Verdict != want {
							b.Fatalf("verdict %+v, want %v: %v", ack, want, err)
						}
					}
					b.StopTimer()
					reportLatency(b, lat)
				})
			}
		})
	}
}

func benchBareOneHop(b *testing.B, url string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	recv := make(chan time.Time, 1)
	dial := func(id string) *mqtt.Client {
		c, err := mqtt.Dial(context.Background(), mqtt.Config{Brokers: []string{url}, ClientID: id, CleanStart: true, SessionExpiry: -1})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			c2, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			c.Close(c2)
		})
		return c
	}
	sub := dial("bench-bare-sub")
	sub.Subscribe("bare/rt", func(mqtt.Message) { recv <- time.Now() })
	pub := dial("bench-bare-pub")
	if err := sub.AwaitSubscribed(ctx); err != nil {
		b.Fatal(err)
	}
	if err := pub.AwaitConnection(ctx); err != nil {
		b.Fatal(err)
	}
	payload, err := fence.MarshalEnvelope(&fence.Envelope{V: fence.Version, Device: "dev-000", Token: 1 << 10, Seq: 1 << 12,
		ID: offline.NewCommandID(time.Now()), Kind: sim.KindPing, IssuedAt: time.Now().UnixMilli(), Holder: "bench-gw"})
	if err != nil {
		b.Fatal(err)
	}
	m := mqtt.Message{Topic: "bare/rt", Payload: payload}
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		if err := pub.Publish(context.Background(), m); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, (<-recv).Sub(start))
	}
	b.StopTimer()
	reportLatency(b, lat)
}

// BenchmarkSendConcurrent is 32 devices commanded in parallel, one
// goroutine each, accepted commands (fsync): ns/op is the inverse of the
// throughput, also reported as cmds/s. fleets=1 puts every device behind one
// sim.Fleet (one MQTT client, one bbolt file: the handler is sequential);
// fleets=32 gives each device its own, as real devices have.
func BenchmarkSendConcurrent(b *testing.B) {
	const conc = 32
	for _, br := range benchBrokers() {
		for _, nf := range []int{1, conc} {
			for _, dup := range []bool{false, true} {
				name := fmt.Sprintf("broker=%s/fleets=%d/accepted-fsync", br, nf)
				if dup {
					name = fmt.Sprintf("broker=%s/fleets=%d/duplicate-nowrite", br, nf)
				}
				b.Run(name, func(b *testing.B) {
					w := newBenchWorld(b, br, conc, nf)
					w.sender.dup.Store(dup)
					want := fence.Accepted
					if dup {
						want = fence.Duplicate
					}
					ctx := context.Background()
					lats := make([][]time.Duration, conc)
					var failed atomic.Value
					var wg sync.WaitGroup
					b.ReportAllocs()
					b.ResetTimer()
					start := time.Now()
					for i := range conc {
						n := b.N/conc + btoi(i < b.N%conc)
						wg.Go(func() {
							for range n {
								t0 := time.Now()
								ack, err := w.agent.Send(ctx, w.devices[i], sim.KindPing, nil)
								lats[i] = append(lats[i], time.Since(t0))
								if ack == nil || ack.Verdict != want {
									failed.Store(fmt.Errorf("verdict %+v, want %v: %v", ack, want, err))
									return
								}
							}
						})
					}
					wg.Wait()
					elapsed := time.Since(start)
					b.StopTimer()
					if err, ok := failed.Load().(error); ok {
						b.Fatal(err)
					}
					b.ReportMetric(float64(b.N)/elapsed.Seconds(), "cmds/s")
					reportLatency(b, slices.Concat(lats...))
				})
			}
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// heldSignal closes all once n acquisitions were seen (OnHolding), and
// notes when.
type heldSignal struct {
	n    int64
	seen atomic.Int64
	all  chan struct{}
	at   atomic.Int64
}

func (h *heldSignal) onHolding(string, fence.Token) {
	if h.seen.Add(1) == h.n {
		h.at.Store(time.Now().UnixNano())
		close(h.all)
	}
}

// BenchmarkAcquire is the time from Run's start until the agent holds every
// device, on one session: ms/all-held is exactly that (the moment of the
// last acquisition, Options.OnHolding); ns/op also counts creating the etcd
// client. The clean shutdown that releases the locks is not timed.
func BenchmarkAcquire(b *testing.B) {
	for _, n := range []int{10, 1000} {
		b.Run(fmt.Sprintf("devices=%d", n), func(b *testing.B) {
			devs := make([]string, n)
			for i := range devs {
				devs[i] = fmt.Sprintf("dev-%04d", i)
			}
			var total time.Duration
			b.ResetTimer()
			for range b.N {
				h := &heldSignal{n: int64(n), all: make(chan struct{})}
				a, start, stop := newBenchAgent(b, devs, benchNopSender{}, "mqtt://127.0.0.1:1", Options{OnHolding: h.onHolding})
				select {
				case <-h.all:
				case <-time.After(60 * time.Second):
					b.Fatalf("holds %d of %d after 60s", a.leases.stats.acquired.Load(), n)
				}
				b.StopTimer()
				total += time.Unix(0, h.at.Load()).Sub(start)
				if got := a.leases.stats.acquired.Load(); got != uint64(n) {
					b.Fatalf("acquired %d, want %d", got, n)
				}
				stop()
				b.StartTimer()
			}
			b.ReportMetric(float64(total)/float64(b.N)/float64(time.Millisecond), "ms/all-held")
		})
	}
}

type benchNopSender struct{}

func (benchNopSender) Send(context.Context, *fence.Envelope) (*fence.Ack, error) {
	return nil, fmt.Errorf("not part of this benchmark")
}

// BenchmarkFanOut: one fan-out (Agent.FanOut, waiting for every verdict)
// to all of -fanout.devices devices behind 4 fleets, in this process: its
// CPU profile (-cpuprofile) shows where a fan-out's time goes, the agent's
// share beside the broker's and the devices'. cmd/edgefence-bench fanout
// measures the real binary with the bare paho baseline.
//
//	go test -run '^$' -bench FanOut -benchtime 5x -cpuprofile /tmp/fan.prof ./agent/
func BenchmarkFanOut(b *testing.B) {
	w := newBenchWorld(b, "mochi", *benchFanoutDevices, 4)
	ctx := context.Background()
	b.ResetTimer()
	for b.Loop() {
		sum := w.agent.FanOut(ctx, w.devices, sim.KindPing, nil, true, func(SendResult) {})
		if n := sum.ByOutcome["accepted"] + sum.ByOutcome["duplicate"]; n != len(w.devices) {
			b.Fatalf("%d of %d applied: %v", n, len(w.devices), sum.ByOutcome)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*len(w.devices)), "µs/device")
}

var benchFanoutDevices = flag.Int("fanout.devices", 1000, "BenchmarkFanOut: devices")

// awaySender is a link to devices that never answer: a worker's Send
// waits until its context ends. With it the outbox sees the appends
// alone (no verdict is recorded).
type awaySender struct{}

func (awaySender) Send(ctx context.Context, _ *fence.Envelope) (*fence.Ack, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// BenchmarkFanOutIssue: storing one command for each of
// -fanout.devices devices (no wait), the fan-out's way (a chunk's entries
// in one AppendAll) beside 64 concurrent Enqueues sharing commits through
// the outbox's group committer. commits/op counts the outbox's write
// transactions (each one fsync).
func BenchmarkFanOutIssue(b *testing.B) {
	n := *benchFanoutDevices
	var devs []string
	for i := range n {
		devs = append(devs, fmt.Sprintf("dev-%05d", i))
	}
	a := startBenchAgent(b, devs, awaySender{}, "mqtt://127.0.0.1:1", nil)
	waitHeld(b, a, n)
	var commits atomic.Int64
	a.outbox.ObserveCommits(func(time.Duration) { commits.Add(1) }) // replaces the lease-tail meter: a benchmark only
	ctx := context.Background()
	for _, v := range []struct {
		name  string
		issue func()
	}{
		{"fanout-chunks", func() {
			if sum := a.FanOut(ctx, devs, sim.KindPing, nil, false, func(SendResult) {}); sum.ByOutcome["queued"] != n {
				b.Fatalf("%v", sum.ByOutcome)
			}
		}},
		{"groupcommit-64", func() {
			var wg sync.WaitGroup
			for w := range 64 {
				wg.Go(func() {
					for i := w; i < n; i += 64 {
						if _, err := a.Enqueue(ctx, devs[i], sim.KindPing, nil); err != nil {
							b.Error(err)
						}
					}
				})
			}
			wg.Wait()
		}},
	} {
		b.Run(v.name, func(b *testing.B) {
			commits.Store(0)
			for b.Loop() {
				v.issue()
			}
			b.ReportMetric(float64(commits.Load())/float64(b.N), "commits/op")
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*n), "µs/device")
		})
	}
}
