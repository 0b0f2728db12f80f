package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// The fan-out benchmark (issue 17): one `edgefence run` subprocess holds n
// devices (sim fleets that fsync each command, in this process); one
// POST /v1/fanout commands them all. Measured: request → every device's
// verdict at the client, the agent's "stored" time and outbox commits,
// the agent's CPU (user + sys from /proc) during the request. The
// baseline, in the same run, to the same devices: a bare paho client
// publishing one envelope per device (QoS 1, 64 publishers) and waiting
// for every ack — the devices' fsync included, no agent, no outbox.

// fanoutCmdTimeout is the agent's command timeout in the fan-out
// benchmark: how long the fan-out waits for the last verdict.
const fanoutCmdTimeout = 120 * time.Second

// fanoutConfig configures the fan-out benchmark.
type fanoutConfig struct {
	Sizes    []int // device counts
	Runs     int   // fan-outs per size (the first warms up)
	Fleets   int   // sim fleets (bbolt files) serving the devices
	Lanes    int   // MQTT clients per fleet (sim.FleetConfig.Lanes)
	AgentBin string
	ProfDir  string   // non-empty: a profiling agent; a CPU profile of each size's last fan-out goes here
	Env      []string // extra environment for the agent (--agent-env)
	// TimerSlack, if set, is the agent's timer slack (--agent-timerslack).
	TimerSlack time.Duration
	// Sign runs it signed (--sign): the agent's devices `auth: required`,
	// the fleets provisioned with the root, the gateway's certificate and
	// their device keys; the bare client signs and verifies too.
	Sign bool
	Dir  string
	Log  io.Writer
}

type fanoutRun struct {
	Wall       time.Duration // request → summary, at the client
	Stored     time.Duration // the agent's IssuedMs
	Commits    uint64
	AllCommits uint64        // every outbox commit during the request (/metrics: appends, verdicts, expiry passes)
	Resent     uint64        // commands sent again during the request (/metrics)
	Unsigned   uint64        // sends of plain envelopes during the request (/metrics)
	CPU        time.Duration // agent user+sys during the request
	Accepted   int
	Duplicate  int   // applied, answered duplicate (a resend's ack came first)
	HWM        int64 // the agent's VmHWM after the request, KiB (its peak RSS so far)
}

type fanoutRow struct {
	Devices int
	Held    time.Duration
	Runs    []fanoutRun
	Bare    time.Duration // bare paho: first publish → last ack
	BareCPU time.Duration // its process's user+sys over Bare
	BareOK  int
	// BareSigned: the bare client signed every envelope and verified
	// every ack; BareRefused acks did not verify.
	BareSigned  bool
	BareRefused int
}

type fanoutResult struct {
	Bin           string
	Fleets, Lanes int
	Signed        bool
	Rows          []fanoutRow
}

func runFanout(ctx context.Context, etcd *sandbox.Etcd, cfg fanoutConfig) (*fanoutResult, error) {
	res := &fanoutResult{Bin: cfg.AgentBin, Fleets: cfg.Fleets, Lanes: cfg.Lanes, Signed: cfg.Sign}
	if res.Bin == "" {
		var extra []string // --agent-cpuprofile: a profiling build (metrics.pprof needs it)
		if cfg.ProfDir != "" {
			extra = append(extra, "edgefence_pprof")
		}
		var err error
		if res.Bin, err = buildBinary(ctx, cfg.Dir, "edgefence", cfg.Log, extra...); err != nil {
			return nil, err
		}
	}
	br, cli, done, err := startMochiAndClient(ctx, etcd, cfg.Dir)
	if err != nil {
		return nil, err
	}
	defer done()
	for _, n := range cfg.Sizes {
		fmt.Fprintf(cfg.Log, "fanout: %d devices\n", n)
		row, err := fanoutSize(ctx, etcd, cli, br, n, res.Bin, cfg)
		if err != nil {
			return res, fmt.Errorf("fanout with %d devices: %w", n, err)
		}
		res.Rows = append(res.Rows, row)
	}
	return res, nil
}

// fanoutSize runs one size: the agent, cfg.Runs fan-outs, the baseline.
func fanoutSize(ctx context.Context, etcd *sandbox.Etcd, cli *clientv3.Client, br *broker, n int, bin string, cfg fanoutConfig) (fanoutRow, error) {
	row := fanoutRow{Devices: n}
	dir := filepath.Join(cfg.Dir, fmt.Sprintf("fanout-%d", n))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return row, err
	}
	devs := deviceIDs("fan-", n)
	prefix := fmt.Sprintf("fan%d", n)
	ac := rssAgentConfig{n: n, dir: dir, etcd: etcd.Endpoint(), broker: br.url, prefix: prefix, devs: devs,
		sock: filepath.Join(dir, "agent.sock"), etcdPrefix: fmt.Sprintf("/bench/fanout-%d-%d", n, time.Now().UnixNano()),
		cmdTimeout: fanoutCmdTimeout, pprof: cfg.ProfDir != "", timerSlack: cfg.TimerSlack}
	fa, err := ac.sign(ctx, cfg.Sign, etcd)
	if err != nil {
		return row, err
	}
	fleets, err := startFleetsLanes(ctx, dir, br.url, prefix, "bench-fan-fleet-"+prefix, devs, cfg.Fleets, cfg.Lanes, fa)
	defer closeFleets(fleets)
	if err != nil {
		return row, err
	}
	p, err := ac.start(bin, cfg.Env)
	if err != nil {
		return row, err
	}
	defer p.stop()
	if row.Held, err = p.awaitHeld(ctx, cli, ac.etcdPrefix, n, time.Now().Add(300*time.Second)); err != nil {
		return row, err
	}
	api := agent.NewAPIClient(ac.sock)
	if err := p.awaitHolding(ctx, api, n, time.Now().Add(300*time.Second)); err != nil {
		return row, err
	}
	var last map[string]agent.SendResult
	for i := range cfg.Runs {
		before, _ := scrapeMetrics(ctx, "http://"+ac.metrics+"/metrics", fanoutCounters...)
		prof := fanoutProfile(ctx, cfg, ac.metrics, n, i, row.Runs)
		r, results, err := fanoutOnce(ctx, api, p.pid, n)
		if err != nil {
			return row, err
		}
		if prof != nil {
			if err := prof.wait(); err != nil {
				fmt.Fprintln(cfg.Log, "fanout: agent CPU profile:", err)
			}
		}
		if after, err := scrapeMetrics(ctx, "http://"+ac.metrics+"/metrics", fanoutCounters...); err == nil && before != nil {
			r.AllCommits = uint64(after[fanoutCounters[0]] - before[fanoutCounters[0]])
			r.Resent = uint64(after[fanoutCounters[1]] - before[fanoutCounters[1]])
			r.Unsigned = uint64(after[fanoutCounters[2]] - before[fanoutCounters[2]])
		}
		fmt.Fprintf(cfg.Log, "fanout: %d devices, run %d: %v, %d accepted, %d duplicate, %d resent, %d unsigned, %d append commits, %d outbox commits, CPU %v, VmHWM %s MiB\n",
			n, i+1, r.Wall.Round(time.Millisecond), r.Accepted, r.Duplicate, r.Resent, r.Unsigned, r.Commits, r.AllCommits, r.CPU, mib(r.HWM))
		row.Runs = append(row.Runs, r)
		last = results
	}
	var sign *bareSign
	if ac.signed != nil {
		sign = ac.signed.requester()
	}
	bare, err := bareFanoutProc(ctx, br.url, fleets[0].Topics(), devs, last, sign)
	row.Bare, row.BareCPU, row.BareOK, row.BareSigned, row.BareRefused = bare.Wall, bare.CPU, bare.Accepted, bare.Signed, bare.Refused
	fmt.Fprintf(cfg.Log, "fanout: %d devices, bare paho: %v, %d accepted, signed %t (%d acks refused), CPU %v\n", n, row.Bare.Round(time.Millisecond), row.BareOK, row.BareSigned, row.BareRefused, row.BareCPU)
	return row, err
}

// fanoutProfile starts a CPU profile of the agent (serving metrics) for
// the last of cfg.Runs fan-outs, run i, if cfg.ProfDir is set and a run
// before it gave the window: the first run's time, rounded up, plus a
// second (at most 25 s: the metrics server's write timeout is 30 s). The
// profile covers the request from its start; nil if there is none.
func fanoutProfile(ctx context.Context, cfg fanoutConfig, metrics string, n, i int, done []fanoutRun) *agentProfile {
	if cfg.ProfDir == "" || i != cfg.Runs-1 || len(done) == 0 {
		return nil
	}
	secs := min(int(done[0].Wall.Seconds())+2, 25)
	p := &agentProfile{path: filepath.Join(cfg.ProfDir, fmt.Sprintf("agent-fanout-%d.pprof", n)), done: make(chan error, 1)}
	allocs := filepath.Join(cfg.ProfDir, fmt.Sprintf("agent-fanout-allocs-%d", n))
	if err := fetchTo(ctx, "http://"+metrics+"/debug/pprof/allocs", allocs+"-before.pprof"); err != nil {
		fmt.Fprintln(cfg.Log, "fanout: agent allocations:", err)
	}
	go func() {
		err := fetchTo(ctx, fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", metrics, secs), p.path)
		p.done <- errors.Join(err, fetchTo(ctx, "http://"+metrics+"/debug/pprof/allocs", allocs+"-after.pprof"))
	}()
	time.Sleep(50 * time.Millisecond) // let the profile start before the request
	return p
}

// fanoutCounters are the agent's counters read around each fan-out: its
// outbox commits (each one's fsync time is observed), its resends and its
// sends of plain envelopes.
var fanoutCounters = []string{"edgefence_state_fsync_seconds_count", "edgefence_commands_resent_total", "edgefence_commands_unsigned_total"}

// fanoutOnce sends one fan-out to every device and measures it.
func fanoutOnce(ctx context.Context, api *agent.APIClient, pid, n int) (fanoutRun, map[string]agent.SendResult, error) {
	var r fanoutRun
	results := make(map[string]agent.SendResult, n)
	cpu0, t0 := readProcCPU(pid), time.Now()
	sum, err := api.FanOut(ctx, agent.FanoutRequest{Selection: agent.Selection{Glob: "fan-*"}, Kind: "ping"}, func(ev agent.FanoutEvent) {
		if ev.Result != nil {
			results[ev.Result.Device] = *ev.Result
		}
	})
	r.Wall, r.CPU = time.Since(t0), readProcCPU(pid)-cpu0
	if m, merr := readProcMem(pid); merr == nil {
		r.HWM = m.VmHWM
	}
	if err != nil {
		return r, nil, err
	}
	r.Stored, r.Commits = time.Duration(sum.IssuedMs*float64(time.Millisecond)), sum.Commits
	r.Accepted, r.Duplicate = sum.ByOutcome["accepted"], sum.ByOutcome["duplicate"]
	if r.Accepted+r.Duplicate != n { // duplicate: applied once, the ack of a resend came first
		return r, nil, fmt.Errorf("%d of %d applied: %v", r.Accepted+r.Duplicate, n, sum.ByOutcome)
	}
	return r, results, nil
}

// bareFanout is the baseline: one autopaho client publishes envs[i] to
// devs[i] from 64 goroutines at QoS 1 and waits for every accepted ack
// (in the child process of bareFanoutProc); with sa, each envelope is
// signed as it is published and each ack verified as it is received, as
// the agent does. It returns the time from the first publish to the last
// ack and the process's CPU over it.
func bareFanout(ctx context.Context, brokerURL string, topics mqtt.Topics, devs []string, envs [][]byte, sa *bareAuth) (time.Duration, time.Duration, int, error) {
	var accepted atomic.Int64
	all := make(chan struct{})
	cm, err := bareConnect(ctx, brokerURL, func(pr paho.PublishReceived) (bool, error) {
		if a, err := sa.ack(pr.Packet.Payload); err == nil && a.Verdict == fence.Accepted {
			if accepted.Add(1) == int64(len(devs)) {
				close(all)
			}
		}
		return true, nil
	})
	if err != nil {
		return 0, 0, 0, err
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = cm.Disconnect(dctx)
	}()
	if _, err := cm.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: topics.AllAck(), QoS: 1}}}); err != nil {
		return 0, 0, 0, err
	}
	const publishers = 64
	start, cpu0 := time.Now(), selfCPU()
	var wg sync.WaitGroup
	var pubErr atomic.Value
	for w := range publishers {
		wg.Go(func() {
			for i := w; i < len(devs); i += publishers {
				payload, err := sa.payload(devs[i], envs[i])
				if err == nil {
					_, err = cm.Publish(ctx, &paho.Publish{QoS: 1, Topic: topics.Cmd(devs[i]), Payload: payload})
				}
				if err != nil {
					pubErr.CompareAndSwap(nil, err)
				}
			}
		})
	}
	wg.Wait()
	if err, _ := pubErr.Load().(error); err != nil {
		return 0, 0, int(accepted.Load()), err
	}
	select {
	case <-all:
		return time.Since(start), selfCPU() - cpu0, len(devs), nil
	case <-time.After(120 * time.Second):
		return 0, 0, int(accepted.Load()), errors.New("bare paho: not every device acked within 120 s")
	case <-ctx.Done():
		return 0, 0, int(accepted.Load()), ctx.Err()
	}
}

// bareConnect connects one autopaho client with onMsg as its handler.
func bareConnect(ctx context.Context, brokerURL string, onMsg func(paho.PublishReceived) (bool, error)) (*autopaho.ConnectionManager, error) {
	u, err := url.Parse(brokerURL)
	if err != nil {
		return nil, err
	}
	cm, err := autopaho.NewConnection(ctx, autopaho.ClientConfig{
		ServerUrls: []*url.URL{u}, KeepAlive: 30, CleanStartOnInitialConnection: true, ConnectTimeout: 5 * time.Second,
		ClientConfig: paho.ClientConfig{ClientID: fmt.Sprintf("bench-fan-bare-%d", time.Now().UnixNano()),
			OnPublishReceived: []func(paho.PublishReceived) (bool, error){onMsg}},
	})
	if err != nil {
		return nil, err
	}
	if err := awaitCtx(ctx, 10*time.Second, cm.AwaitConnection); err != nil {
		return nil, err
	}
	return cm, nil
}

func printFanout(w io.Writer, r *fanoutResult) {
	signed := "unsigned (auth: off)"
	if r.Signed {
		signed = "signed (auth: required)"
	}
	fmt.Fprintf(w, "\n### Fan-out: one POST /v1/fanout to every device, %s (agent %s, %d device fleets of %d lanes)\n\n", signed, r.Bin, r.Fleets, r.Lanes)
	fmt.Fprintln(w, "| devices | run | request → all applied | stored (agent) | append commits | all outbox commits | commits / device | resent | duplicate | agent CPU | CPU / device | bare paho, same devices | ratio | bare paho CPU / device | CPU ratio |")
	fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, row := range r.Rows {
		bareCPU := float64(row.BareCPU.Microseconds()) / float64(row.Devices)
		for i, run := range row.Runs {
			cpu := float64(run.CPU.Microseconds()) / float64(row.Devices)
			fmt.Fprintf(w, "| %d | %d | %.0f ms | %.0f ms | %d | %d | %.3f | %d | %d | %.0f ms | %.1f µs | %.0f ms | %.2f× | %.1f µs | %.2f× |\n", row.Devices, i+1,
				msf(run.Wall), msf(run.Stored), run.Commits, run.AllCommits, float64(run.AllCommits)/float64(row.Devices), run.Resent,
				run.Duplicate, msf(run.CPU), cpu, msf(row.Bare), run.Wall.Seconds()/row.Bare.Seconds(), bareCPU, cpu/bareCPU)
		}
	}
	fmt.Fprintln(w, "\nTargets (issue 17): 10,000 devices ≤ 2 s and ≤ 1.5× the bare paho figure; agent CPU ≤ 50 µs a device.")
	fmt.Fprintln(w, "Bare paho CPU: its own process (user+sys) from its first publish to its last ack: one QoS 1 publish and one ack received a device, envelopes encoded before.")
	if r.Signed {
		printFanoutSigned(w, r)
	}
}

// printFanoutSigned says what the signed runs signed and verified.
func printFanoutSigned(w io.Writer, r *fanoutResult) {
	fmt.Fprintln(w, "Signed (I7): the agent signs every command with its gateway key (COSE_Sign1 ES256) and verifies every ack with the device's certificate; the devices verify every command and sign every ack. The bare client signs each envelope as it publishes it and verifies each ack (its device's certificate, bound to the envelope sent) as it receives it.")
	for _, row := range r.Rows {
		var unsigned uint64
		for _, run := range row.Runs {
			unsigned += run.Unsigned
		}
		fmt.Fprintf(w, "- %d devices: agent, %d unsigned sends over %d fan-outs; bare client, signed %t, %d of %d acks verified accepted, %d refused\n",
			row.Devices, unsigned, len(row.Runs), row.BareSigned, row.BareOK, row.Devices, row.BareRefused)
	}
}

func msf(d time.Duration) float64 { return d.Seconds() * 1000 }
