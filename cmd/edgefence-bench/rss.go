package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/devices/sandbox"
	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// rssConfig configures the agent memory benchmark.
type rssConfig struct {
	Sizes    []int  // device counts
	AgentBin string // the edgefence binary; empty: build it
	Commands int    // commands sent through the agent's API before measuring
	Settle   time.Duration
	Env      []string // extra environment of the agent, e.g. GODEBUG=gctrace=1
	Dir      string
	Log      io.Writer
}

// procMem is a sample of /proc/PID/status, in KiB.
type procMem struct {
	VmRSS, RssAnon, RssFile, VmHWM int64
}

type rssRow struct {
	Devices                int
	Held                   time.Duration // process start → all devices held
	AtHeld, AtCmds, AtIdle procMem       // when all held; after the commands; after Settle
	Threads                int
	PeakAt                 time.Duration // when the sampled VmRSS was highest, after process start
	Peak                   int64         // that VmRSS, KiB
}

type rssResult struct {
	Bin     string
	BinSize int64
	Built   string // how it was built
	Rows    []rssRow
}

// rssTarget returns the RSS target for n devices, in MiB.
func rssTarget(n int) float64 {
	if n <= 10 {
		return 20
	}
	return 30
}

func runRSS(ctx context.Context, etcd *sandbox.Etcd, cfg rssConfig) (*rssResult, error) {
	res := &rssResult{Bin: cfg.AgentBin, Built: "given with --agent-bin"}
	if res.Bin == "" {
		// As the gateway binaries ship (make cross): static, no cgo.
		res.Built = "CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' ./cmd/edgefence"
		var err error
		if res.Bin, err = buildBinary(ctx, cfg.Dir, "edgefence", cfg.Log); err != nil {
			return nil, err
		}
	}
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
	for _, n := range cfg.Sizes {
		fmt.Fprintf(cfg.Log, "rss: agent with %d devices\n", n)
		row, err := measureAgentRSS(ctx, etcd, br, n, cfg)
		if err != nil {
			return nil, fmt.Errorf("rss with %d devices: %w", n, err)
		}
		res.Rows = append(res.Rows, row)
	}
	return res, nil
}

func measureAgentRSS(ctx context.Context, etcd *sandbox.Etcd, br *broker, n int, cfg rssConfig) (rssRow, error) {
	row := rssRow{Devices: n}
	dir := filepath.Join(cfg.Dir, fmt.Sprintf("rss-%d", n))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return row, err
	}
	devs := deviceIDs("rss-", n)
	prefix := fmt.Sprintf("rss%d", n)
	// The devices answer the commands; they run here, not in the agent.
	fleet, err := sim.NewFleet(ctx, sim.FleetConfig{Devices: devs, DataDir: filepath.Join(dir, "devices"), Broker: br.url,
		Prefix: prefix, ClientID: "bench-rss-fleet-" + prefix, MQTT: mqtt.Config{CleanStart: true, SessionExpiry: -1}})
	if err != nil {
		return row, err
	}
	defer func() {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = fleet.Close(c)
	}()
	if err := awaitCtx(ctx, 30*time.Second, fleet.AwaitReady); err != nil {
		return row, err
	}

	sock := filepath.Join(dir, "agent.sock")
	var conf strings.Builder
	fmt.Fprintf(&conf, `gateway: bench-rss-%d
state_dir: %s
etcd:
  endpoints: [%s]
  prefix: /bench/rss-%d-%d
  lease_ttl: 10s
mqtt:
  brokers: [%s]
  prefix: %s
  client_id: bench-rss-agent-%d
api:
  socket: %s
command:
  timeout: 10s
log:
  level: warn
  format: text
devices:
`, n, filepath.Join(dir, "state"), etcd.Endpoint(), n, time.Now().UnixNano(), br.url, prefix, n, sock)
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
	cmd := exec.Command(cfg.AgentBinOr(), "run", "--config", cpath)
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
		case <-time.After(10 * time.Second):
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

	api := agent.NewAPIClient(sock)
	deadline := time.Now().Add(60 * time.Second)
	for {
		if st, err := api.Status(ctx); err == nil && st.Counters.Acquired >= uint64(n) {
			row.Held = time.Since(start)
			break
		}
		select {
		case err := <-exited:
			exited <- err
			return row, fmt.Errorf("agent exited: %v (log %s)", err, logf.Name())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return row, fmt.Errorf("agent does not hold all %d devices after 60s (log %s)", n, logf.Name())
		}
	}
	if row.AtHeld, err = readProcMem(pid); err != nil {
		return row, err
	}
	for i := range cfg.Commands {
		d := devs[i%len(devs)]
		res, err := api.Send(ctx, d, sim.KindSet, []byte(fmt.Sprintf(`{"setpoint": %d}`, 18+i%5)))
		if err != nil {
			return row, fmt.Errorf("send to %s: %w", d, err)
		}
		if res.Verdict != "accepted" {
			return row, fmt.Errorf("send to %s: verdict %q %s", d, res.Verdict, res.Error)
		}
	}
	if row.AtCmds, err = readProcMem(pid); err != nil {
		return row, err
	}
	time.Sleep(cfg.Settle)
	if row.AtIdle, err = readProcMem(pid); err != nil {
		return row, err
	}
	row.Threads = readThreads(pid)
	close(stopSampler)
	<-sampled
	return row, nil
}

// AgentBinOr returns the binary to run.
func (c rssConfig) AgentBinOr() string {
	if c.AgentBin != "" {
		return c.AgentBin
	}
	return filepath.Join(c.Dir, "edgefence")
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
