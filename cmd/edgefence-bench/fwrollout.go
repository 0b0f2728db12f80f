package main

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgefence/edgefence/agent/jobs"
	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/internal/sandbox"
)

// fwRolloutConfig configures the firmware rollout benchmark: one
// `edgefence run` holding Devices firmware devices (one
// `edgefence-devsim --firmware --in-process`), one job over all of them.
type fwRolloutConfig struct {
	Devices    int
	Concurrent int // the job's max_concurrent
	ImageSize  int // bytes
	Chunk      int // bytes per fw.chunk
	Runs       int
	Timeout    time.Duration // one rollout, from create to completed
	AgentBin   string        // empty: build ./cmd/edgefence
	DevsimBin  string        // empty: build ./cmd/edgefence-devsim
	Dir        string
	Log        io.Writer
}

// fwRolloutRun is one rollout; times are from the job's creation.
type fwRolloutRun struct {
	Held        time.Duration // agent start → all lock keys in etcd
	Done        time.Duration // create → rollout completed
	FirstStart  time.Duration // the first execution started
	FirstFinish time.Duration // the first execution ended
	LastStart   time.Duration
	LastFinish  time.Duration
	Exec        summary // per execution: started → finished
	Succeeded   int
	Other       map[jobs.Status]int // ended otherwise
	CPU         time.Duration       // the agent's user+sys CPU, create → completed
	AtEnd       procMem             // the agent's memory at completion
	Peak        int64               // the sampled VmRSS peak during the rollout, KiB
	AtHeld      procMem
	Outbox      int64     // the agent's outbox file at completion, bytes (bbolt: its mmap is in RssFile)
	Reqs        reqCounts // the embedded etcd's requests during the rollout, the bench's own polls taken out
}

type fwRolloutResult struct {
	Cfg   fwRolloutConfig
	Built string
	Runs  []fwRolloutRun
}

func runFWRollout(ctx context.Context, etcd *sandbox.Etcd, cfg fwRolloutConfig) (*fwRolloutResult, error) {
	built, err := buildMissing(ctx, cfg.Dir, cfg.Log, benchBin{"edgefence", &cfg.AgentBin}, benchBin{"edgefence-devsim", &cfg.DevsimBin})
	if err != nil {
		return nil, err
	}
	res := &fwRolloutResult{Cfg: cfg, Built: cmp.Or(built, "binaries given with --agent-bin/--devsim-bin")}
	br, cli, done, err := startMochiAndClient(ctx, etcd, cfg.Dir)
	if err != nil {
		return nil, err
	}
	defer done()
	img, err := writeFWImage(filepath.Join(cfg.Dir, "fw-image.bin"), cfg.ImageSize)
	if err != nil {
		return nil, err
	}
	for k := range cfg.Runs {
		fmt.Fprintf(cfg.Log, "fwrollout: %d devices, max_concurrent %d, run %d/%d\n", cfg.Devices, cfg.Concurrent, k+1, cfg.Runs)
		w := &fwWorld{cfg: cfg, etcd: etcd, cli: cli, brokerURL: br.url, img: img, dir: filepath.Join(cfg.Dir, fmt.Sprintf("fwrollout-%d", k+1)), run: k + 1}
		r, err := w.rollout(ctx)
		if err != nil {
			return res, fmt.Errorf("fwrollout run %d: %w (logs in %s)", k+1, err, w.dir)
		}
		fmt.Fprintf(cfg.Log, "fwrollout: done after %s ms (%.1f executions/s), agent CPU %s ms, VmRSS end %s MiB, peak %s MiB, etcd %d requests\n",
			ms(r.Done), float64(r.Succeeded)/r.Done.Seconds(), ms(r.CPU), mib(r.AtEnd.VmRSS), mib(r.Peak), r.Reqs.unary())
		res.Runs = append(res.Runs, r)
	}
	return res, nil
}

// fwImage is the rollout's image file.
type fwImage struct {
	path   string
	sha256 string
	size   uint64
}

// writeFWImage writes a test image of size bytes (no health markers: its
// trial boots pass) to path.
func writeFWImage(path string, size int) (fwImage, error) {
	b, err := sim.FirmwareImage(size)
	if err != nil {
		return fwImage{}, err
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return fwImage{}, err
	}
	sum := sha256.Sum256(b)
	return fwImage{path: path, sha256: hex.EncodeToString(sum[:]), size: uint64(size)}, nil
}

// fwWorld is one run: its devsim, its agent, its prefixes.
type fwWorld struct {
	cfg        fwRolloutConfig
	etcd       *sandbox.Etcd
	cli        *clientv3.Client
	brokerURL  string
	img        fwImage
	dir        string
	run        int
	etcdPrefix string
	devs       []string
	polls      int // the bench's own etcd reads during the rollout
}

// rollout starts the devices and the agent, waits for it to hold them
// all, creates the job and measures it until the rollout completed.
func (w *fwWorld) rollout(ctx context.Context) (fwRolloutRun, error) {
	var r fwRolloutRun
	if err := os.MkdirAll(w.dir, 0o700); err != nil {
		return r, err
	}
	mqttPrefix := fmt.Sprintf("fwr%d-%d", w.run, time.Now().UnixNano())
	w.etcdPrefix = "/bench/" + mqttPrefix
	for i := range w.cfg.Devices {
		w.devs = append(w.devs, fmt.Sprintf("fw-%d", i+1))
	}
	devsim, err := sandbox.StartProc("devsim", filepath.Join(w.dir, "devsim.log"), nil, w.cfg.DevsimBin,
		"--firmware", "--in-process", "--mqtt", w.brokerURL, "--prefix", mqttPrefix, "--count", strconv.Itoa(w.cfg.Devices),
		"--id-prefix", "fw-", "--dir", filepath.Join(w.dir, "devices"))
	if err != nil {
		return r, err
	}
	defer func() { _ = devsim.Stop(30 * time.Second) }()
	if err := awaitCtx(ctx, 5*time.Minute, func(ctx context.Context) error { return devsim.WaitLine(ctx, "msg=ready") }); err != nil {
		return r, fmt.Errorf("devsim: %w", err)
	}
	c := sandbox.AgentConfig{Gateway: "bench-fw", Etcd: w.etcd.Endpoint(), MQTT: w.brokerURL, Devices: w.devs,
		Socket: filepath.Join(w.dir, "agent.sock"), StateDir: filepath.Join(w.dir, "agent-state"), EtcdPrefix: w.etcdPrefix,
		MQTTPrefix: mqttPrefix, ClientID: "bench-fw-agent-" + mqttPrefix, LogLevel: "info", LogFormat: "text"}
	cpath := filepath.Join(w.dir, "edgefence.yaml")
	if err := c.Write(cpath); err != nil {
		return r, err
	}
	start := time.Now()
	ag, err := sandbox.StartProc("agent", filepath.Join(w.dir, "agent.log"), nil, w.cfg.AgentBin, "run", "--config", cpath)
	if err != nil {
		return r, err
	}
	defer func() { _ = ag.Stop(30 * time.Second) }()
	if r.Held, err = w.awaitHeld(ctx, ag, start); err != nil {
		return r, err
	}
	if r.AtHeld, err = readProcMem(ag.Pid()); err != nil {
		return r, err
	}
	return r, w.measure(ctx, ag, &r)
}

// awaitHeld polls etcd until the agent holds every device.
func (w *fwWorld) awaitHeld(ctx context.Context, ag *sandbox.Proc, start time.Time) (time.Duration, error) {
	deadline := start.Add(5 * time.Minute)
	for {
		if k, err := countLockKeys(ctx, w.cli, w.etcdPrefix); err == nil && k >= len(w.devs) {
			return time.Since(start), nil
		}
		select {
		case <-ag.Done():
			return 0, errors.New("agent exited before holding its devices")
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("agent does not hold all %d devices after %v", len(w.devs), deadline.Sub(start))
		}
	}
}

// measure creates the job and follows its rollout to the end, sampling the
// agent's CPU, memory and etcd's request counters.
func (w *fwWorld) measure(ctx context.Context, ag *sandbox.Proc, r *fwRolloutRun) error {
	st := jobs.NewStore(w.cli, w.etcdPrefix)
	id := fmt.Sprintf("bench-%d", w.run)
	j := jobs.Job{ID: id, Image: jobs.ImageRef{SHA256: w.img.sha256, Size: w.img.size, Version: 1, URL: "file://" + w.img.path, Name: "bench"},
		Chunk: w.cfg.Chunk, Targets: jobs.Targets{Devices: w.devs}, Rollout: jobs.Policy{MaxConcurrent: w.cfg.Concurrent}, By: "edgefence-bench"}
	peak := samplePeak(ag.Pid(), time.Now())
	defer peak.stop()
	req0, cpu0 := gatherEtcdReqs(), readProcCPU(ag.Pid())
	t0 := time.Now()
	if _, _, err := st.Create(ctx, j); err != nil {
		return err
	}
	ro, err := w.follow(ctx, ag, st, id, t0)
	if err != nil {
		return err
	}
	r.Done = time.Since(t0)
	r.CPU = readProcCPU(ag.Pid()) - cpu0
	r.Reqs = gatherEtcdReqs().sub(req0)
	r.Reqs.Range -= uint64(w.polls)
	if r.AtEnd, err = readProcMem(ag.Pid()); err != nil {
		return err
	}
	r.Peak, _ = peak.stop()
	if fi, err := os.Stat(filepath.Join(w.dir, "agent-state", "outbox.db")); err == nil {
		r.Outbox = fi.Size()
	}
	if ro.Status != jobs.RolloutCompleted {
		return fmt.Errorf("rollout %s: %s (%s), counts %v", id, ro.Status, ro.Reason, ro.Counts)
	}
	execs, err := st.Executions(ctx, id)
	if err != nil {
		return err
	}
	r.times(execs, t0)
	if r.Succeeded != len(w.devs) {
		return fmt.Errorf("rollout completed with %d of %d succeeded (others %v)", r.Succeeded, len(w.devs), r.Other)
	}
	return nil
}

// follow polls the rollout every 100 ms until it ends (completed, aborted,
// canceled) or the run's timeout; each poll is one etcd Range, counted.
func (w *fwWorld) follow(ctx context.Context, ag *sandbox.Proc, st *jobs.Store, id string, t0 time.Time) (jobs.Rollout, error) {
	deadline := t0.Add(w.cfg.Timeout)
	last := time.Now()
	for {
		w.polls++
		ro, err := st.Rollout(ctx, id)
		if err == nil && (ro.Status == jobs.RolloutCompleted || ro.Status.Stopping()) {
			return ro, nil
		}
		if time.Since(last) >= 10*time.Second {
			last = time.Now()
			fmt.Fprintf(w.cfg.Log, "fwrollout: %s after %s s: %v\n", ro.Status, strconv.Itoa(int(time.Since(t0).Seconds())), ro.Counts)
		}
		select {
		case <-ag.Done():
			return ro, errors.New("agent exited during the rollout")
		case <-ctx.Done():
			return ro, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return ro, fmt.Errorf("rollout not done after %v: %s, counts %v", w.cfg.Timeout, ro.Status, ro.Counts)
		}
	}
}

// times records the executions' outcomes and start and finish times
// relative to t0.
func (r *fwRolloutRun) times(execs []jobs.Execution, t0 time.Time) {
	r.Other = map[jobs.Status]int{}
	var durs []time.Duration
	for i, e := range execs {
		if e.Status != jobs.Succeeded {
			r.Other[e.Status]++
			continue
		}
		r.Succeeded++
		s, f := e.Started.Sub(t0), e.Finished.Sub(t0)
		if i == 0 || r.Succeeded == 1 {
			r.FirstStart, r.FirstFinish = s, f
		}
		r.FirstStart, r.FirstFinish = min(r.FirstStart, s), min(r.FirstFinish, f)
		r.LastStart, r.LastFinish = max(r.LastStart, s), max(r.LastFinish, f)
		durs = append(durs, e.Finished.Sub(e.Started))
	}
	r.Exec = summarize(durs)
}

func printFWRollout(w io.Writer, r *fwRolloutResult) {
	c := r.Cfg
	fmt.Fprintf(w, "### Firmware rollout: %d devices through one `edgefence run`, max_concurrent %d, image %d KiB in %d KiB chunks (%s)\n\n",
		c.Devices, c.Concurrent, c.ImageSize>>10, c.Chunk>>10, r.Built)
	fmt.Fprintln(w, "Devices: one `edgefence-devsim --firmware --in-process`; etcd embedded and mochi in the bench process. Times from the job's creation (`Store.Create`);")
	fmt.Fprintln(w, "agent CPU is its user+sys (/proc/PID/stat) from creation to completion; etcd requests are the embedded server's gRPC counters over the same span (all clients: the agent's, the devsim's none, the bench's rollout polls taken out), keepalives apart.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| run | all held s | done s | executions/s | first start / first end s | last start / last end s | execution p50 / max s | agent CPU s (% core) | CPU ms / execution | VmRSS held / peak / end MiB | end RssAnon / RssFile MiB | outbox file MiB | etcd Range / Txn / other | etcd req / execution | watch msgs, keepalives |")
	fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	var done []time.Duration
	for i, x := range r.Runs {
		done = append(done, x.Done)
		n := float64(max(x.Succeeded, 1))
		fmt.Fprintf(w, "| %d | %s | %s | %.1f | %s / %s | %s / %s | %s / %s | %s (%.0f %%) | %.1f | %s / %s / %s | %s / %s | %.1f | %d / %d / %d | %.1f | %d, %d |\n",
			i+1, sec(x.Held), sec(x.Done), n/x.Done.Seconds(), sec(x.FirstStart), sec(x.FirstFinish), sec(x.LastStart), sec(x.LastFinish),
			sec(x.Exec.P50), sec(x.Exec.Max), sec(x.CPU), 100*x.CPU.Seconds()/x.Done.Seconds(), float64(x.CPU)/float64(time.Millisecond)/n,
			mib(x.AtHeld.VmRSS), mib(x.Peak), mib(x.AtEnd.VmRSS), mib(x.AtEnd.RssAnon), mib(x.AtEnd.RssFile), float64(x.Outbox)/(1<<20), x.Reqs.Range, x.Reqs.Txn, x.Reqs.Put+x.Reqs.Other,
			float64(x.Reqs.unary())/n, x.Reqs.WatchMsgs, x.Reqs.KeepAlives)
	}
	if len(done) > 0 {
		fmt.Fprintf(w, "\n- median time to done: %s s over %d run(s)\n", sec(median(done)), len(done))
	}
	fmt.Fprintln(w)
}

// sec formats d in seconds with two decimals.
func sec(d time.Duration) string { return fmt.Sprintf("%.2f", d.Seconds()) }

// parseBytes parses a size: a number of bytes, or with a KiB or MiB suffix.
func parseBytes(s string) (int, error) {
	mult := 1
	t := strings.TrimSpace(s)
	for _, u := range []struct {
		suf string
		m   int
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}} {
		if v, ok := strings.CutSuffix(t, u.suf); ok {
			t, mult = v, u.m
			break
		}
	}
	v, err := strconv.Atoi(strings.TrimSpace(t))
	if err != nil || v < 1 {
		return 0, fmt.Errorf("bad size %q: want bytes, or a number with KiB or MiB", s)
	}
	return v * mult, nil
}

// unary is the unary requests (Range, Txn, Put, other).
func (c reqCounts) unary() uint64 { return c.Range + c.Txn + c.Put + c.Other }

// gatherEtcdReqs reads the embedded etcd server's gRPC counters (the
// grpc-prometheus metrics it registers in this process's default
// registry): unary calls handled by method, messages received on Watch and
// LeaseKeepAlive streams, streams started. Zero if they are not there.
func gatherEtcdReqs() reqCounts {
	var c reqCounts
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		return c
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			lab := map[string]string{}
			for _, l := range m.GetLabel() {
				lab[l.GetName()] = l.GetValue()
			}
			v := uint64(m.GetCounter().GetValue())
			unary := lab["grpc_type"] == "unary"
			switch mf.GetName() {
			case "grpc_server_handled_total":
				if unary {
					c.addUnary(lab["grpc_method"], v)
				}
			case "grpc_server_msg_received_total":
				switch lab["grpc_method"] {
				case "Watch":
					c.WatchMsgs += v
				case "LeaseKeepAlive":
					c.KeepAlives += v
				}
			case "grpc_server_started_total":
				if !unary {
					c.Streams += v
				}
			}
		}
	}
	return c
}

// addUnary counts v unary calls of method.
func (c *reqCounts) addUnary(method string, v uint64) {
	switch method {
	case "Range":
		c.Range += v
	case "Txn":
		c.Txn += v
	case "Put":
		c.Put += v
	default:
		c.Other += v
	}
}
