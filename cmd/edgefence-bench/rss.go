package main

import (
	"bufio"
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
	"github.com/edgefence/edgefence/devices/sandbox"
	"github.com/edgefence/edgefence/devices/sim"
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
	Dir      string
	Log      io.Writer
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
		res.Built = "CGO_ENABLED=0 go build -tags grpcnotrace -trimpath -ldflags='-s -w' ./cmd/edgefence"
		var err error
		if res.Bin, err = buildBinary(ctx, cfg.Dir, "edgefence", cfg.Log); err != nil {
			return nil, err
		}
	}
	cfg.AgentBin = res.Bin
	if fi, err := os.Stat(res.Bin); err == nil {
		res.BinSize = fi.Size()
	} else {
		return nil, err
	}
	br, err := startBroker(ctx, brokerMochi, cfg.Dir)
	if err != nil {
		return nil, err
	}
	defer br.stop()
	cli, err := etcd.Client()
	if err != nil {
		return nil, err
	}
	defer cli.Close()
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
	_, closeFleet, err := startFleet(ctx, dir, br.url, prefix, "bench-rss-fleet-"+prefix, devs, 120*time.Second)
	if err != nil {
		return row, err
	}
	defer closeFleet()
	mport, err := sandbox.FreePort()
	if err != nil {
		return row, err
	}
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", mport)

	sock := filepath.Join(dir, "agent.sock")
	etcdPrefix := fmt.Sprintf("/bench/rss-%d-%d", n, time.Now().UnixNano())
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
command:
  timeout: 10s
log:
  level: warn
  format: text
devices:
`, n, filepath.Join(dir, "state"), etcd.Endpoint(), etcdPrefix, br.url, prefix, n, sock, metricsAddr)
	for _, d := range devs {
		fmt.Fprintf(&conf, "  - id: %s\n", d)
	}
	cpath := filepath.Join(dir, "edgefence.yaml")
	if err := os.WriteFile(cpath, []byte(conf.String()), 0o600); err != nil {
		return row, err
	}
	logf, err := os.Create(filepath.Join(dir, "agent.log"))
	if err != nil {
		return row, err
	}
	defer logf.Close()
	cmd := exec.Command(cfg.AgentBin, "run", "--config", cpath)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), cfg.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return row, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}()
	pid := cmd.Process.Pid
	// Sample VmRSS every 5 ms to find when the peak happens.
	stopSampler := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			if m, err := readProcMem(pid); err == nil && m.VmRSS > row.Peak {
				row.Peak, row.PeakAt = m.VmRSS, time.Since(start)
			}
			select {
			case <-stopSampler:
				return
			case <-t.C:
			}
		}
	}()
	defer func() {
		select {
		case <-stopSampler:
		default:
			close(stopSampler)
			<-sampled
		}
	}()

	// All held: every lock key in etcd (polled there, not through the
	// agent's status, which would allocate in the agent).
	end := start.Add(cfg.Duration)
	deadline := start.Add(max(cfg.Duration, 120*time.Second))
	for {
		if k, err := countLockKeys(ctx, cli, etcdPrefix); err == nil && k >= n {
			row.Held = time.Since(start)
			break
		}
		select {
		case err := <-exited:
			exited <- err
			return row, fmt.Errorf("agent exited: %v (log %s)", err, logf.Name())
		case <-ctx.Done():
			return row, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return row, fmt.Errorf("agent does not hold all %d devices after %v (log %s)", n, deadline.Sub(start), logf.Name())
		}
	}
	cpuHeld, heldAt := readProcCPU(pid), time.Now()
	if row.AtHeld, err = readProcMem(pid); err != nil {
		return row, err
	}
	if !time.Now().Before(end) {
		return row, fmt.Errorf("all %d devices held only after %v, beyond --rss-duration %v", n, row.Held, cfg.Duration)
	}
	// The load until the end: one command per device per Period (at least
	// MinRate/s), round robin over the devices, sent through the agent's
	// API socket by Workers clients as the tick comes.
	api := agent.NewAPIClient(sock)
	lctx, lcancel := context.WithDeadline(ctx, end)
	defer lcancel()
	type answer struct {
		ok  bool
		lat time.Duration
	}
	jobs := make(chan string, cfg.Workers)
	answers := make(chan answer, 1024)
	var wg sync.WaitGroup
	for range cfg.Workers {
		wg.Go(func() {
			for d := range jobs {
				t0 := time.Now()
				r, err := api.Send(context.Background(), d, sim.KindSet, json.RawMessage(`{"setpoint": 21}`))
				a := answer{ok: err == nil && r != nil && r.Verdict == "accepted", lat: time.Since(t0)}
				if !a.ok {
					fmt.Fprintf(cfg.Log, "rss: send to %s: %+v %v\n", d, r, err)
				}
				answers <- a
			}
		})
	}
	var lat []time.Duration
	collected := make(chan struct{})
	go func() {
		defer close(collected)
		for a := range answers {
			if a.ok {
				row.Accepted++
				lat = append(lat, a.lat)
			} else {
				row.Other++
			}
		}
	}()
	row.LoadFor = time.Until(end)
	every := time.Duration(float64(time.Second) / row.Rate)
	tick := time.NewTicker(every)
	next := 0
load:
	for {
		select {
		case <-lctx.Done():
			break load
		case <-tick.C:
		}
		select {
		case jobs <- devs[next%n]:
			row.Sent++
			next++
		case <-lctx.Done():
			break load
		}
	}
	tick.Stop()
	if since := time.Since(heldAt); since > 0 {
		row.CPU = 100 * (readProcCPU(pid) - cpuHeld).Seconds() / since.Seconds()
	}
	if row.AtEnd, err = readProcMem(pid); err != nil {
		return row, err
	}
	row.Threads = readThreads(pid)
	close(stopSampler)
	<-sampled
	close(jobs)
	wg.Wait()
	close(answers)
	<-collected
	s := summarize(lat)
	row.SendP50, row.SendP99 = s.P50, s.P99
	// The Go runtime's view, scraped once the figures above are read.
	if g, err := scrapeGoMem(ctx, "http://"+metricsAddr+"/metrics"); err == nil {
		row.Go = g
	} else {
		fmt.Fprintln(cfg.Log, "rss: /metrics:", err)
	}
	return row, nil
}

// scrapeGoMem reads the go_memstats and go_goroutines lines of a
// Prometheus text exposition.
func scrapeGoMem(ctx context.Context, url string) (goMem, error) {
	var g goMem
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return g, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return g, err
	}
	defer resp.Body.Close()
	fields := map[string]*float64{"go_memstats_heap_inuse_bytes": &g.HeapInuse, "go_memstats_heap_alloc_bytes": &g.HeapAlloc,
		"go_memstats_stack_inuse_bytes": &g.StackInuse, "go_memstats_sys_bytes": &g.Sys, "go_memstats_next_gc_bytes": &g.NextGC,
		"go_goroutines": &g.Goroutines}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 {
			if p, ok := fields[f[0]]; ok {
				*p, _ = strconv.ParseFloat(f[1], 64)
			}
		}
	}
	return g, sc.Err()
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
// /proc/PID/stat (clock ticks of 1/100 s, Linux's USER_HZ); 0 if unreadable.
func readProcCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name (field 2) may hold spaces: fields count from the
	// last ')'. utime and stime are fields 14 and 15.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0
	}
	fs := strings.Fields(string(b[i+1:]))
	if len(fs) < 13 {
		return 0
	}
	u, err1 := strconv.ParseInt(fs[11], 10, 64)
	st, err2 := strconv.ParseInt(fs[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0
	}
	return time.Duration(u+st) * 10 * time.Millisecond
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
