package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/internal/backoff"
	"github.com/edgefence/edgefence/internal/procstat"
	"github.com/edgefence/edgefence/internal/sandbox"
)

// rssConfig configures the agent memory benchmark.
type rssConfig struct {
	Sizes    []int         // device counts
	AgentBin string        // the edgefence binary; empty: build it
	Duration time.Duration // measure this long after the agent process started
	Period   time.Duration // the load sends each device one command per Period...
	MinRate  float64       // ...but at least MinRate commands/s over all devices
	Workers  int           // API clients sending the load concurrently
	Env      []string      // extra environment of the agent, e.g. GODEBUG=gctrace=1
	Sign     bool          // signed commands and acks (invariant I7; --sign)
	Idle     time.Duration // measure the agent's CPU this long with all held and no commands, before the load
	ProfDir  string        // non-empty: the agent serves pprof; a CPU profile of its load window goes here
	// VerdictDelay is the agent's outbox.verdict_delay, as written in its
	// config; empty: the default.
	VerdictDelay string
	// MaxEnded is the agent's outbox.max_ended; 0: the default.
	MaxEnded int
	// TimerSlack, if set, is the agent's timer slack (what systemd's
	// TimerSlackNSec= of deploy/edgefence.service sets); 0: the bench's.
	TimerSlack time.Duration
	Dir        string
	Log        io.Writer
}

// procMem is a sample of /proc/PID/status, in KiB.
type procMem struct {
	VmRSS, RssAnon, RssFile, VmHWM int64
}

type rssRow struct {
	Devices       int
	Held          time.Duration // process start → all lock keys in etcd
	AtHeld, AtEnd procMem       // when all held; Duration after the start
	Threads       int
	PeakAt        time.Duration // when the sampled VmRSS was highest, after process start
	Peak          int64         // that VmRSS, KiB
	Rate          float64       // load, commands/s
	Sent          int           // load commands sent
	Accepted      int           // of them accepted
	Other         int           // other answers (verdict or error)
	SendP50       time.Duration // API send → accepted, median
	SendP99       time.Duration
	Go            goMem         // from the agent's /metrics, at the end
	LoadFor       time.Duration // the load ran this long (all held → the end)
	CPU           float64       // the agent's CPU time during the load, % of one core
	LoadCPU       time.Duration // the agent's user+sys CPU during the load
	IdleFor       time.Duration // the idle window (all held, no commands)
	IdleCPU       float64       // the agent's CPU in it, % of one core
	Profile       string        // the agent's CPU profile of the load window, if taken
	Commits       float64       // the outbox's commits during the load (edgefence_state_fsync_seconds_count); -1: not read
	IdleSw        switchWindow  // the agent's threads' context switches in the idle window (switches.go)
	LoadSw        switchWindow  // ... and in the load window
}

// perCommand is the agent's CPU per accepted command during the load, and
// the same less what it spends idle over as long (net of the background:
// keepalives, timers, state reports).
func (r rssRow) perCommand() (gross, net time.Duration) {
	if r.Accepted == 0 {
		return 0, 0
	}
	gross = r.LoadCPU / time.Duration(r.Accepted)
	idle := time.Duration(r.IdleCPU / 100 * float64(r.LoadFor))
	return gross, max(r.LoadCPU-idle, 0) / time.Duration(r.Accepted)
}

// goMem is what the agent's /metrics says about its Go runtime.
type goMem struct {
	HeapInuse, HeapAlloc, StackInuse, Sys, NextGC float64 // bytes
	Goroutines                                    float64
}

type rssResult struct {
	Bin      string
	BinSize  int64
	Built    string // how it was built
	Duration time.Duration
	Period   time.Duration
	MinRate  float64
	Rows     []rssRow
}

// rssTarget returns the RSS target for n devices, in MiB.
func rssTarget(n int) float64 {
	switch {
	case n <= 10:
		return 20
	case n <= 1000:
		return 30
	}
	return 80
}

// rssRate is the load's rate for n devices: one command per device per
// period, at least minRate.
func rssRate(n int, period time.Duration, minRate float64) float64 {
	return max(float64(n)/period.Seconds(), minRate)
}

func runRSS(ctx context.Context, etcd *sandbox.Etcd, cfg rssConfig) (*rssResult, error) {
	res := &rssResult{Bin: cfg.AgentBin, Built: "given with --agent-bin", Duration: cfg.Duration, Period: cfg.Period, MinRate: cfg.MinRate}
	if res.Bin == "" {
		// As the gateway binaries ship (make cross): static, no cgo.
		// --agent-cpuprofile: a profiling build (metrics.pprof needs it).
		var extra []string
		if cfg.ProfDir != "" {
			extra = append(extra, "edgefence_pprof")
		}
		res.Built = "CGO_ENABLED=0 go build -tags " + tagsWith(extra...) + " -trimpath -ldflags='-s -w' ./cmd/edgefence"
		var err error
		if res.Bin, err = buildBinary(ctx, cfg.Dir, "edgefence", cfg.Log, extra...); err != nil {
			return nil, err
		}
	}
	cfg.AgentBin = res.Bin
	if fi, err := os.Stat(res.Bin); err == nil {
		res.BinSize = fi.Size()
	} else {
		return nil, err
	}
	br, cli, done, err := startMochiAndClient(ctx, etcd, cfg.Dir)
	if err != nil {
		return nil, err
	}
	defer done()
	for _, n := range cfg.Sizes {
		fmt.Fprintf(cfg.Log, "rss: agent with %d devices, %v\n", n, cfg.Duration)
		row, err := measureAgentRSS(ctx, etcd, cli, br, n, cfg)
		if err != nil {
			return nil, fmt.Errorf("rss with %d devices: %w", n, err)
		}
		fmt.Fprintf(cfg.Log, "rss: %d devices: VmRSS %s MiB, VmHWM %s MiB, heap in use %.1f MiB, %d/%d accepted\n",
			n, mib(row.AtEnd.VmRSS), mib(row.AtEnd.VmHWM), row.Go.HeapInuse/(1<<20), row.Accepted, row.Sent)
		res.Rows = append(res.Rows, row)
	}
	return res, nil
}

// countLockKeys counts the lock keys under an agent's etcd prefix: how many
// devices it holds, read from etcd so that the agent does no extra work.
func countLockKeys(ctx context.Context, cli *clientv3.Client, prefix string) (int, error) {
	r, err := cli.Get(ctx, prefix+"/devices/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return 0, err
	}
	n := 0
	for _, kv := range r.Kvs {
		if strings.Contains(string(kv.Key), "/lock/") {
			n++
		}
	}
	return n, nil
}

// measureAgentRSS starts an agent subprocess with n devices, waits for it
// to hold them all, loads it until cfg.Duration after its start and
// measures its memory along the way.
func measureAgentRSS(ctx context.Context, etcd *sandbox.Etcd, cli *clientv3.Client, br *broker, n int, cfg rssConfig) (rssRow, error) {
	row := rssRow{Devices: n, Rate: rssRate(n, cfg.Period, cfg.MinRate)}
	dir := filepath.Join(cfg.Dir, fmt.Sprintf("rss-%d", n))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return row, err
	}
	devs := deviceIDs("rss-", n)
	prefix := fmt.Sprintf("rss%d", n)
	// The devices answer the commands; they run here, not in the agent:
	// one sim.Fleet (one MQTT client, one bbolt file) for all of them.
	ac := rssAgentConfig{n: n, dir: dir, etcd: etcd.Endpoint(), broker: br.url, prefix: prefix, devs: devs,
		sock: filepath.Join(dir, "agent.sock"), etcdPrefix: fmt.Sprintf("/bench/rss-%d-%d", n, time.Now().UnixNano()), pprof: cfg.ProfDir != "",
		verdictDelay: cfg.VerdictDelay, maxEnded: cfg.MaxEnded, timerSlack: cfg.TimerSlack}
	fa, err := ac.sign(ctx, cfg.Sign, etcd)
	if err != nil {
		return row, err
	}
	_, closeFleet, err := startFleet(ctx, dir, br.url, prefix, "bench-rss-fleet-"+prefix, devs, 120*time.Second, fa)
	if err != nil {
		return row, err
	}
	defer closeFleet()
	p, err := ac.start(cfg.AgentBin, cfg.Env)
	if err != nil {
		return row, err
	}
	defer p.stop()
	// Sample VmRSS every 5 ms to find when the peak happens.
	peak := samplePeak(p.pid, p.start)
	defer peak.stop()

	// All held: every lock key in etcd (polled there, not through the
	// agent's status, which would allocate in the agent).
	end := p.start.Add(cfg.Duration)
	if row.Held, err = p.awaitHeld(ctx, cli, ac.etcdPrefix, n, p.start.Add(max(cfg.Duration, 120*time.Second))); err != nil {
		return row, err
	}
	cpuHeld, heldAt, swHeld := readProcCPU(p.pid), time.Now(), readThreadSwitches(p.pid)
	if row.AtHeld, err = readProcMem(p.pid); err != nil {
		return row, err
	}
	if !time.Now().Before(end) {
		return row, fmt.Errorf("all %d devices held only after %v, beyond --rss-duration %v", n, row.Held, cfg.Duration)
	}
	if cfg.Idle > 0 {
		// Idle: all held, no commands; the load's window starts after it.
		if cpuHeld, heldAt, err = p.idle(ctx, cfg, ac.metrics, &row, cpuHeld, heldAt); err != nil {
			return row, err
		}
		sw := readThreadSwitches(p.pid)
		row.IdleSw, swHeld = sw.since(swHeld, row.IdleFor), sw
		end = end.Add(row.IdleFor)
	}
	var prof *agentProfile
	if cfg.ProfDir != "" {
		prof = startAgentProfile(ctx, "http://"+ac.metrics, filepath.Join(cfg.ProfDir, fmt.Sprintf("agent-cpu-%d.pprof", n)), time.Until(end))
	}
	// The load until the end: one command per device per Period (at least
	// MinRate/s), round robin over the devices, sent through the agent's
	// API socket by Workers clients as the tick comes.
	commits := outboxCommitsSince(ctx, ac.metrics)
	load := startRSSLoad(agent.NewAPIClient(ac.sock), cfg.Workers, cfg.Log)
	row.LoadFor = time.Until(end)
	row.Sent = load.run(ctx, end, devs, row.Rate)
	if since := time.Since(heldAt); since > 0 {
		row.LoadCPU = readProcCPU(p.pid) - cpuHeld
		row.CPU = 100 * row.LoadCPU.Seconds() / since.Seconds()
		row.LoadSw = readThreadSwitches(p.pid).since(swHeld, since)
	}
	if err := row.endLoad(p.pid, peak, load, commits); err != nil {
		return row, err
	}
	row.afterLoad(ctx, prof, ac.metrics, cfg.Log)
	return row, nil
}

// endLoad reads the agent's memory, threads and peak at the load's end,
// and the load's verdicts, latencies and outbox commits.
func (row *rssRow) endLoad(pid int, peak *peakSampler, load *rssLoad, commits func() float64) error {
	var err error
	if row.AtEnd, err = readProcMem(pid); err != nil {
		return err
	}
	row.Threads = readThreads(pid)
	row.Peak, row.PeakAt = peak.stop()
	var lat []time.Duration
	row.Accepted, row.Other, lat = load.finish()
	row.Commits = commits()
	s := summarize(lat)
	row.SendP50, row.SendP99 = s.P50, s.P99
	return nil
}

// afterLoad waits for the agent's CPU profile (if taken), takes its
// allocation profile next to it, and scrapes the
// Go runtime's view from its metrics once the other figures are read.
func (row *rssRow) afterLoad(ctx context.Context, prof *agentProfile, metrics string, log io.Writer) {
	if prof != nil {
		if err := prof.wait(); err != nil {
			fmt.Fprintln(log, "rss: agent CPU profile:", err)
		} else {
			row.Profile = prof.path
		}
		// The allocations since the agent started (acquisition included).
		allocs := strings.Replace(prof.path, "agent-cpu-", "agent-allocs-", 1)
		if err := fetchTo(ctx, "http://"+metrics+"/debug/pprof/allocs", allocs); err != nil {
			fmt.Fprintln(log, "rss: agent allocation profile:", err)
		}
	}
	if g, err := scrapeGoMem(ctx, "http://"+metrics+"/metrics"); err == nil {
		row.Go = g
	} else {
		fmt.Fprintln(log, "rss: /metrics:", err)
	}
}

// idle measures the agent's CPU over cfg.Idle with no commands into row, from
// cpu0 at t0, and returns the CPU and time at its end.
// With cfg.ProfDir it profiles the agent (serving metrics) meanwhile.
func (p *rssProc) idle(ctx context.Context, cfg rssConfig, metrics string, row *rssRow, cpu0 time.Duration, t0 time.Time) (time.Duration, time.Time, error) {
	var prof *agentProfile
	if cfg.ProfDir != "" {
		prof = startAgentProfile(ctx, "http://"+metrics, filepath.Join(cfg.ProfDir, fmt.Sprintf("agent-idle-%d.pprof", row.Devices)), cfg.Idle)
	}
	if !backoff.Sleep(ctx, cfg.Idle) {
		return 0, time.Time{}, ctx.Err()
	}
	cpu, at := readProcCPU(p.pid), time.Now()
	row.IdleFor = at.Sub(t0)
	row.IdleCPU = 100 * (cpu - cpu0).Seconds() / row.IdleFor.Seconds()
	if prof != nil {
		if err := prof.wait(); err != nil {
			fmt.Fprintln(cfg.Log, "rss: agent idle CPU profile:", err)
		}
	}
	return cpu, at, nil
}

// agentProfile is a CPU profile of the agent subprocess, taken through
// its /debug/pprof/profile (metrics.pprof) while the load runs.
type agentProfile struct {
	path string
	done chan error
}

// startAgentProfile profiles the agent serving base for window (less a
// second, at most 25 s: the metrics server's WriteTimeout is 30 s) into
// path, in the background.
func startAgentProfile(ctx context.Context, base, path string, window time.Duration) *agentProfile {
	p := &agentProfile{path: path, done: make(chan error, 1)}
	secs := int(min(window-time.Second, 25*time.Second).Seconds())
	go func() {
		if secs < 1 {
			p.done <- fmt.Errorf("load window %v too short to profile", window)
			return
		}
		p.done <- fetchTo(ctx, fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", base, secs), path)
	}()
	return p
}

func (p *agentProfile) wait() error { return <-p.done }

// httpGet GETs url; an answer other than 200 is an error. The caller
// closes the body.
func httpGet(ctx context.Context, url string) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		return nil, fmt.Errorf("%s: %s: %s", url, resp.Status, strings.TrimSpace(string(b)))
	}
	return resp.Body, nil
}

// fetchTo GETs url into the file path.
func fetchTo(ctx context.Context, url, path string) error {
	body, err := httpGet(ctx, url)
	if err != nil {
		return err
	}
	defer body.Close()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// rssAgentConfig is the config of the rss benchmark's agent with n
// devices: its state under dir, API socket sock, metrics on metrics, MQTT
// and etcd prefixes of its own.
type rssAgentConfig struct {
	n                         int
	dir, etcd, broker, prefix string
	sock, metrics, etcdPrefix string
	devs                      []string
	pprof                     bool              // metrics.pprof: serve /debug/pprof/
	verdictDelay              string            // outbox.verdict_delay; empty: the default
	maxEnded                  int               // outbox.max_ended; 0: the default
	auth                      *agent.AuthConfig // --sign: the gateway's key, certificate and trust root
	signed                    *signing          // --sign: the chain auth comes from
	cmdTimeout                time.Duration     // command.timeout; 0: 10s
	timerSlack                time.Duration     // the process's timer slack; 0: the bench's (startRSSProc)
}

// sign, with sign, makes the chain for c's agent and devices (--sign):
// c's auth section, and what the devices run with.
func (c *rssAgentConfig) sign(ctx context.Context, sign bool, etcd *sandbox.Etcd) (fleetAuth, error) {
	if !sign {
		return fleetAuth{}, nil
	}
	s, err := newSigning(c.dir, fmt.Sprintf("bench-rss-%d", c.n))
	if err != nil {
		return fleetAuth{}, err
	}
	a := s.authConfig()
	c.auth, c.signed = &a, s
	return s.enrol(ctx, etcd.Endpoints(), c.etcdPrefix, c.devs)
}

// write writes the config file to path.
func (c rssAgentConfig) write(path string) error {
	var conf strings.Builder
	fmt.Fprintf(&conf, `gateway: bench-rss-%d
state_dir: %s
etcd:
  endpoints: [%s]
  prefix: %s
  lease_ttl: 10s
mqtt:
  brokers: [%s]
  prefix: %s
  client_id: bench-rss-agent-%d
api:
  socket: %s
metrics:
  listen: %s
  pprof: %t
command:
  timeout: %s
log:
  level: warn
  format: text
`, c.n, filepath.Join(c.dir, "state"), c.etcd, c.etcdPrefix, c.broker, c.prefix, c.n, c.sock, c.metrics, c.pprof, cmp.Or(c.cmdTimeout, 10*time.Second))
	if c.verdictDelay != "" || c.maxEnded > 0 {
		conf.WriteString("outbox:\n")
	}
	if c.verdictDelay != "" {
		fmt.Fprintf(&conf, "  verdict_delay: %s\n", c.verdictDelay)
	}
	if c.maxEnded > 0 {
		fmt.Fprintf(&conf, "  max_ended: %d\n", c.maxEnded)
	}
	if c.auth != nil {
		conf.WriteString(authYAML(*c.auth))
	}
	conf.WriteString("devices:\n")
	for _, d := range c.devs {
		fmt.Fprintf(&conf, "  - id: %s\n", d)
		if c.auth == nil {
			conf.WriteString("    auth: off\n")
		}
	}
	return os.WriteFile(path, []byte(conf.String()), 0o600)
}

// start writes the config (edgefence.yaml in c.dir, metrics on a free
// port) and runs bin with env added on it, its output in agent.log.
func (c *rssAgentConfig) start(bin string, env []string) (*rssProc, error) {
	mport, err := sandbox.FreePort()
	if err != nil {
		return nil, err
	}
	c.metrics = fmt.Sprintf("127.0.0.1:%d", mport)
	cpath := filepath.Join(c.dir, "edgefence.yaml")
	if err := c.write(cpath); err != nil {
		return nil, err
	}
	return startRSSProc(bin, cpath, env, filepath.Join(c.dir, "agent.log"), c.timerSlack)
}

// rssProc is the rss benchmark's agent subprocess.
type rssProc struct {
	pid    int
	start  time.Time // exec
	logf   *os.File
	cmd    *exec.Cmd
	exited chan error // receives Wait's error; put back by whoever takes it
}

// startRSSProc runs `bin run --config cpath` with env added, its output in
// logPath, and with its timer slack set to slack if not 0 (startWithSlack).
func startRSSProc(bin, cpath string, env []string, logPath string, slack time.Duration) (*rssProc, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "run", "--config", cpath)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	start := time.Now()
	if err := startWithSlack(cmd, slack); err != nil {
		logf.Close()
		return nil, err
	}
	p := &rssProc{pid: cmd.Process.Pid, start: start, logf: logf, cmd: cmd, exited: make(chan error, 1)}
	go func() { p.exited <- cmd.Wait() }()
	return p, nil
}

// stop sends SIGTERM, kills the agent if it has not exited 30 s later,
// and closes its log.
func (p *rssProc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
	p.logf.Close()
}

// awaitHeld polls etcd until all n lock keys under etcdPrefix exist and
// returns the time from the start; it fails at deadline or if the agent
// exits.
func (p *rssProc) awaitHeld(ctx context.Context, cli *clientv3.Client, etcdPrefix string, n int, deadline time.Time) (time.Duration, error) {
	for {
		if k, err := countLockKeys(ctx, cli, etcdPrefix); err == nil && k >= n {
			return time.Since(p.start), nil
		}
		select {
		case err := <-p.exited:
			p.exited <- err
			return 0, fmt.Errorf("agent exited: %v (log %s)", err, p.logf.Name())
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("agent does not hold all %d devices after %v (log %s)", n, deadline.Sub(p.start), p.logf.Name())
		}
	}
}

// awaitHolding polls the agent's status (api) until it holds n devices:
// a lock key is in etcd before its holder records the token, and a
// command to a device not yet held is refused. It fails at deadline or if
// the agent exits.
func (p *rssProc) awaitHolding(ctx context.Context, api *agent.APIClient, n int, deadline time.Time) error {
	for {
		held := 0
		st, err := api.Status(ctx)
		if err == nil {
			for _, d := range st.Devices {
				if d.State == agent.StateHolding {
					held++
				}
			}
			if held >= n {
				return nil
			}
		}
		select {
		case err := <-p.exited:
			p.exited <- err
			return fmt.Errorf("agent exited: %v (log %s)", err, p.logf.Name())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("agent holds %d of %d devices after %v (status: %v; log %s)", held, n, deadline.Sub(p.start), err, p.logf.Name())
		}
	}
}

// peakSampler samples a process's VmRSS every 5 ms and keeps the highest.
type peakSampler struct {
	halt    chan struct{}
	sampled chan struct{}
	peak    int64         // KiB
	at      time.Duration // after start
}

func samplePeak(pid int, start time.Time) *peakSampler {
	s := &peakSampler{halt: make(chan struct{}), sampled: make(chan struct{})}
	go func() {
		defer close(s.sampled)
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			if m, err := readProcMem(pid); err == nil && m.VmRSS > s.peak {
				s.peak, s.at = m.VmRSS, time.Since(start)
			}
			select {
			case <-s.halt:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// stop ends the sampling (once; later calls only read) and returns the
// peak VmRSS and when it was sampled.
func (s *peakSampler) stop() (kib int64, at time.Duration) {
	select {
	case <-s.halt:
	default:
		close(s.halt)
	}
	<-s.sampled
	return s.peak, s.at
}

// rssLoad sends set commands through the agent's API, one per device
// name on jobs, with a fixed number of workers, and collects the answers.
type rssLoad struct {
	jobs      chan string
	answers   chan rssAnswer
	workers   sync.WaitGroup
	collected chan struct{}
	accepted  int
	other     int
	lat       []time.Duration // send → accepted
}

type rssAnswer struct {
	ok  bool
	lat time.Duration
}

func startRSSLoad(api *agent.APIClient, workers int, log io.Writer) *rssLoad {
	l := &rssLoad{jobs: make(chan string, workers), answers: make(chan rssAnswer, 1024), collected: make(chan struct{})}
	for range workers {
		l.workers.Go(func() {
			for d := range l.jobs {
				t0 := time.Now()
				r, err := api.Send(context.Background(), d, sim.KindSet, json.RawMessage(`{"setpoint": 21}`))
				a := rssAnswer{ok: err == nil && r != nil && r.Verdict == "accepted", lat: time.Since(t0)}
				if !a.ok {
					fmt.Fprintf(log, "rss: send to %s: %+v %v\n", d, r, err)
				}
				l.answers <- a
			}
		})
	}
	go func() {
		defer close(l.collected)
		for a := range l.answers {
			if a.ok {
				l.accepted++
				l.lat = append(l.lat, a.lat)
			} else {
				l.other++
			}
		}
	}()
	return l
}

// run hands the workers one command per tick at rate per second, round
// robin over devs, until end, and returns how many it handed out.
func (l *rssLoad) run(ctx context.Context, end time.Time, devs []string, rate float64) (sent int) {
	lctx, lcancel := context.WithDeadline(ctx, end)
	defer lcancel()
	tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer tick.Stop()
	for {
		select {
		case <-lctx.Done():
			return sent
		case <-tick.C:
		}
		select {
		case l.jobs <- devs[sent%len(devs)]:
			sent++
		case <-lctx.Done():
			return sent
		}
	}
}

// finish waits for the commands handed out and returns the answers:
// accepted, other, and the latencies of the accepted ones.
func (l *rssLoad) finish() (accepted, other int, lat []time.Duration) {
	close(l.jobs)
	l.workers.Wait()
	close(l.answers)
	<-l.collected
	return l.accepted, l.other, l.lat
}

// outboxCommitsSince returns a function that tells the agent's outbox
// commits since this call (each one's fsync time is observed:
// edgefence_state_fsync_seconds_count), -1 if the metrics cannot be read.
func outboxCommitsSince(ctx context.Context, metrics string) func() float64 {
	read := func() float64 {
		v, err := scrapeMetrics(ctx, "http://"+metrics+"/metrics", "edgefence_state_fsync_seconds_count")
		if err != nil {
			return -1
		}
		return v["edgefence_state_fsync_seconds_count"]
	}
	c0 := read()
	return func() float64 {
		if c1 := read(); c0 >= 0 && c1 >= 0 {
			return c1 - c0
		}
		return -1
	}
}

// scrapeGoMem reads the go_memstats and go_goroutines lines of a
// Prometheus text exposition.
func scrapeGoMem(ctx context.Context, url string) (goMem, error) {
	var g goMem
	fields := map[string]*float64{"go_memstats_heap_inuse_bytes": &g.HeapInuse, "go_memstats_heap_alloc_bytes": &g.HeapAlloc,
		"go_memstats_stack_inuse_bytes": &g.StackInuse, "go_memstats_sys_bytes": &g.Sys, "go_memstats_next_gc_bytes": &g.NextGC,
		"go_goroutines": &g.Goroutines}
	names := make([]string, 0, len(fields))
	for n := range fields {
		names = append(names, n)
	}
	v, err := scrapeMetrics(ctx, url, names...)
	for n, p := range fields {
		*p = v[n]
	}
	return g, err
}

// scrapeMetrics reads the unlabelled samples named names from a
// Prometheus text endpoint.
func scrapeMetrics(ctx context.Context, url string, names ...string) (map[string]float64, error) {
	all, err := fetchMetrics(ctx, url)
	if err != nil {
		return nil, err
	}
	v := make(map[string]float64, len(names))
	for _, n := range names {
		if x, ok := all[n]; ok {
			v[n] = x
		}
	}
	return v, nil
}

// readProcMem reads the memory lines of /proc/PID/status.
func readProcMem(pid int) (procMem, error) {
	var m procMem
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return m, err
	}
	defer f.Close()
	fields := map[string]*int64{"VmRSS:": &m.VmRSS, "RssAnon:": &m.RssAnon, "RssFile:": &m.RssFile, "VmHWM:": &m.VmHWM}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) >= 2 {
			if p, ok := fields[fs[0]]; ok {
				if *p, err = strconv.ParseInt(fs[1], 10, 64); err != nil {
					return m, err
				}
			}
		}
	}
	if m.VmRSS == 0 {
		return m, errors.New("no VmRSS in /proc/PID/status")
	}
	return m, sc.Err()
}

// readProcCPU returns the user+system CPU time of process pid, from
// /proc/PID/stat; 0 if unreadable.
func readProcCPU(pid int) time.Duration {
	s, err := procstat.Read(pid)
	if err != nil {
		return 0
	}
	return s.CPU()
}

func readThreads(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Threads:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}

func mib(kib int64) string { return fmt.Sprintf("%.1f", float64(kib)/1024) }
