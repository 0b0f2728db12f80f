// Command edgefence-bench measures the performance figures edgefence
// promises, on real components, and prints them as Markdown tables for
// docs/BENCHMARKS.md:
//
//	roundtrip  command round trip agent → broker → shim → ack (p50/p99,
//	           sequential and concurrent), beside bare paho QoS 1 round trips
//	           on the same broker in the same run; mochi and/or Mosquitto
//	locks      time for one agent to hold 1,000 devices on one etcd session,
//	           beside bare concurrency.Mutex acquisition
//	rss        resident memory of the real `edgefence run` binary (a
//	           subprocess) 60 s after its start, under a light command
//	           load, at 10, 1,000 and 10,000 devices
//	lifecycle  the real binary with existing local state: exec → READY=1
//	           on a NOTIFY_SOCKET, SIGTERM → exit, lock keys and lease
//	           checked in etcd after the exit (10 runs at 10 and 1,000
//	           devices)
//	all        the four above (≈ 6 min)
//	replay     the outbox across a broker outage: the rate of durable
//	           Enqueues while the broker is down, then, once it is back,
//	           the time to the first replayed command accepted and the
//	           replay rate; checks that every command ended accepted, once,
//	           in order per device (in-process agent, mochi, sim.Fleet)
//	failover   two real `edgefence run` agents on the same devices
//	           (edgefence-devsim): the holder is killed (SIGKILL), frozen
//	           (SIGSTOP) or stopped cleanly (SIGTERM) under load, and the
//	           time until the other one's first accepted command is
//	           measured per lease_ttl
//	twins      the twin reconciler, in process (agent with outbox, twin
//	           cache and state reports, mochi, sim.Fleet): desired put → twin.set
//	           accepted → reported written, p50/p99 for 1 and 100 devices
//	           changing at once beside bare etcd put → watch; updates/s for
//	           1,000 devices on one agent; etcd requests per twin update
//
// replay, failover and twins are not part of all (they take minutes).
// roundtrip, locks, replay and twins run the agent in process, built and
// run by agent/daemon as `edgefence run` builds it (outbox included).
//
// Usage (from the module root, so that rss and failover can build the
// binaries):
//
//	go run ./cmd/edgefence-bench all
//	go run ./cmd/edgefence-bench roundtrip --broker both --n 5000 --conc 32
//	go run ./cmd/edgefence-bench locks --devices 1000 --runs 5
//	go run ./cmd/edgefence-bench rss --sizes 10,1000,10000 --rss-duration 60s --rss-period 60s --rss-min-rate 5
//	go run ./cmd/edgefence-bench lifecycle --lc-sizes 10,1000 --runs 10
//	go run ./cmd/edgefence-bench failover --faults term --ttls 10s --runs 10 --devices 1000 --probes 20
//	go run ./cmd/edgefence-bench replay --devices 10 --backlog 10000 --runs 3
//	go run ./cmd/edgefence-bench failover --devices 4 --ttls 2s,5s,10s --runs 3 --faults kill,stop
//	go run ./cmd/edgefence-bench twins --twin-sizes 1,100 --runs 30 --devices 1000 --changes 1 --twin-runs 3
//
// It starts everything it needs (embedded etcd with fast timings, mochi in
// process, Mosquitto from /usr/sbin/mosquitto) in a temp dir and removes it.
// It measures and reports; targets are printed as met or not, and the exit
// code does not depend on them. Linux only (/proc).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/devices/sandbox"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

const usage = `usage: edgefence-bench [flags] roundtrip|locks|rss|all|replay|failover|twins|lifecycle [flags]

Measures edgefence's performance figures on real components and prints
Markdown tables (progress goes to stderr). Flags:
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("edgefence-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage); fs.PrintDefaults() }
	var (
		brokers  = fs.String("broker", "both", "roundtrip: mochi, mosquitto or both")
		n        = fs.Int("n", 5000, "roundtrip: sequential operations per path")
		rounds   = fs.Int("rounds", 10, "roundtrip: interleave the sequential paths in this many rounds")
		warmup   = fs.Int("warmup", 200, "roundtrip: unmeasured operations per path first")
		conc     = fs.Int("conc", 32, "roundtrip: devices in parallel for the concurrent variant (1 = none)")
		concN    = fs.Int("conc-n", 20000, "roundtrip: operations per concurrent path")
		fleets   = fs.String("fleets", "1,32", "roundtrip: comma-separated; run the concurrent variant with the devices split over this many sim.Fleets (an MQTT client + bbolt file each); the sequential one uses the first")
		devices  = fs.Int("devices", 0, "locks: devices (default 1000); replay: devices (default 10); failover: devices (default 4); twins: devices on the agent, all changing at once in the throughput runs (default 1000)")
		runs     = fs.Int("runs", 0, "locks, replay: repetitions (default 5, 3); failover: trials per lease_ttl and fault (default 3); twins: latency rounds per size (default 30)")
		twSizes  = fs.String("twin-sizes", "1,100", "twins: devices changing at once in the latency rounds, comma-separated (at most --devices)")
		twRuns   = fs.Int("twin-runs", 3, "twins: throughput runs (0: none)")
		changes  = fs.Int("changes", 1, "twins: desired changes per device per throughput run (a stream; only the last must show in reported)")
		twFleets = fs.Int("twin-fleets", 1, "twins: split the devices over this many sim.Fleets (an MQTT client + bbolt file each, commands handled one at a time per fleet)")
		backlog  = fs.Int("backlog", 10000, "replay: commands queued while the broker is down")
		cmdTO    = fs.Duration("cmd-timeout", 10*time.Second, "replay: the agent's command timeout (command.timeout)")
		ttls     = fs.String("ttls", "2s,5s,10s", "failover: lease_ttl values, comma-separated (whole seconds, at least 2s)")
		faults   = fs.String("faults", "kill,stop", "failover: kill (SIGKILL), stop (SIGSTOP, then SIGCONT once B took over) and/or term (SIGTERM: clean shutdown), comma-separated")
		probes   = fs.Int("probes", 0, "failover: send the load to this many devices, spread over the list (0: every device)")
		interval = fs.Duration("interval", 10*time.Millisecond, "failover: the load sends one command per device this often through B")
		devsim   = fs.String("devsim-bin", "", "failover: the edgefence-devsim binary (default: go build it)")
		sizes    = fs.String("sizes", "10,1000,10000", "rss: device counts, comma-separated")
		rssDur   = fs.Duration("rss-duration", 60*time.Second, "rss: measure this long after the agent process started")
		rssEvery = fs.Duration("rss-period", 60*time.Second, "rss: the load sends each device one command per period...")
		rssMin   = fs.Float64("rss-min-rate", 5, "rss: ...but at least this many commands/s over all devices")
		lcSizes  = fs.String("lc-sizes", "10,1000", "lifecycle: device counts, comma-separated")
		rssConc  = fs.Int("rss-workers", 8, "rss: API clients sending the load concurrently")
		agentBin = fs.String("agent-bin", "", "rss, failover: the edgefence binary (default: go build it from the module in the working directory)")
		agentEnv = fs.String("agent-env", "", "rss: extra environment for the agent, comma-separated (e.g. GOGC=50,GODEBUG=gctrace=1; see --keep for its log)")
		keep     = fs.Bool("keep", false, "keep the temp dir (logs, configs, data)")
		cpuprof  = fs.String("cpuprofile", "", "write a CPU profile of this process (etcd, mochi, devices and the in-process agent) to FILE")
	)
	// Flags may come before or after the subcommand.
	var what string
	rest := args
	for {
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return 0
			}
			return 2
		}
		if fs.NArg() == 0 {
			break
		}
		if what != "" {
			fmt.Fprintf(stderr, "edgefence-bench: more than one benchmark given: %q and %q\n", what, fs.Arg(0))
			return 2
		}
		what, rest = fs.Arg(0), fs.Args()[1:]
	}
	switch what {
	case "roundtrip", "locks", "rss", "all", "replay", "failover", "twins", "lifecycle":
	case "":
		fs.Usage()
		return 2
	default:
		fmt.Fprintf(stderr, "edgefence-bench: unknown benchmark %q\n", what)
		fs.Usage()
		return 2
	}
	var brokerList []string
	switch *brokers {
	case "both":
		brokerList = []string{brokerMochi, brokerMosquitto}
	case brokerMochi, brokerMosquitto:
		brokerList = []string{*brokers}
	default:
		fmt.Fprintf(stderr, "edgefence-bench: --broker %q: want mochi, mosquitto or both\n", *brokers)
		return 2
	}
	sizeList, err := intList(*sizes)
	if err != nil {
		fmt.Fprintln(stderr, "edgefence-bench: --sizes:", err)
		return 2
	}
	fleetList, err := intList(*fleets)
	if err != nil {
		fmt.Fprintln(stderr, "edgefence-bench: --fleets:", err)
		return 2
	}
	lcSizeList, err := intList(*lcSizes)
	if err != nil {
		fmt.Fprintln(stderr, "edgefence-bench: --lc-sizes:", err)
		return 2
	}
	twSizeList, err := intList(*twSizes)
	if err != nil {
		fmt.Fprintln(stderr, "edgefence-bench: --twin-sizes:", err)
		return 2
	}
	// --devices and --runs have a default per benchmark.
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if !set["devices"] {
		*devices = map[string]int{"replay": 10, "failover": 4}[what]
		if *devices == 0 {
			*devices = 1000
		}
	}
	if !set["runs"] {
		*runs = map[string]int{"replay": 3, "failover": 3, "twins": 30, "lifecycle": 10}[what]
		if *runs == 0 {
			*runs = 5
		}
	}
	if *n < 1 || *conc < 1 || *devices < 1 || *runs < 1 || *backlog < 1 || *changes < 1 || *twFleets < 1 {
		fmt.Fprintln(stderr, "edgefence-bench: --n, --conc, --devices, --runs, --backlog, --changes and --twin-fleets must be at least 1")
		return 2
	}
	if *twRuns < 0 {
		fmt.Fprintln(stderr, "edgefence-bench: --twin-runs must not be negative")
		return 2
	}
	if what == "twins" && slices.Max(twSizeList) > *devices {
		fmt.Fprintf(stderr, "edgefence-bench: --twin-sizes: %d devices at once, but --devices is %d\n", slices.Max(twSizeList), *devices)
		return 2
	}
	if *cmdTO <= 0 || *interval <= 0 || *rssDur <= 0 || *rssEvery <= 0 || *rssMin <= 0 || *rssConc < 1 {
		fmt.Fprintln(stderr, "edgefence-bench: --cmd-timeout, --interval, --rss-duration, --rss-period, --rss-min-rate and --rss-workers must be positive")
		return 2
	}
	ttlVals, err := ttlList(*ttls)
	if err != nil {
		fmt.Fprintln(stderr, "edgefence-bench: --ttls:", err)
		return 2
	}
	faultVals, err := faultList(*faults)
	if err != nil {
		fmt.Fprintln(stderr, "edgefence-bench: --faults:", err)
		return 2
	}

	dir, err := os.MkdirTemp("", "edgefence-bench-")
	if err != nil {
		fmt.Fprintln(stderr, "edgefence-bench:", err)
		return 1
	}
	if *keep {
		fmt.Fprintln(stderr, "keeping", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	if *cpuprof != "" {
		f, err := os.Create(*cpuprof)
		if err != nil {
			fmt.Fprintln(stderr, "edgefence-bench:", err)
			return 1
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(stderr, "edgefence-bench:", err)
			return 1
		}
		defer pprof.StopCPUProfile()
	}

	printMachine(stdout)
	etcd, err := startEtcd(ctx, dir)
	if err != nil {
		fmt.Fprintln(stderr, "edgefence-bench:", err)
		return 1
	}
	defer etcd.Close()

	all := what == "all"
	failed := false
	fail := func(err error) {
		failed = true
		fmt.Fprintln(stderr, "edgefence-bench:", err)
	}
	if what == "roundtrip" || all {
		var bl []string
		for _, b := range brokerList {
			if b == brokerMosquitto && !haveMosquitto() {
				fmt.Fprintf(stderr, "roundtrip: mosquitto not installed (%s): skipped; apt-get install mosquitto\n", sandbox.MosquittoPath)
				continue
			}
			bl = append(bl, b)
		}
		res, err := runRoundTrip(ctx, etcd, rtConfig{Brokers: bl, N: *n, Rounds: *rounds, Warmup: *warmup, Conc: *conc,
			ConcN: *concN, Fleets: fleetList, Dir: dir, Log: stderr})
		printRoundTrip(stdout, res)
		if err != nil {
			fail(err)
		}
	}
	if what == "locks" || all {
		res, err := runLocks(ctx, etcd, locksConfig{N: *devices, Runs: *runs, Dir: dir, Log: stderr})
		if err != nil {
			fail(err)
		} else {
			printLocks(stdout, res)
		}
	}
	if what == "rss" || all {
		res, err := runRSS(ctx, etcd, rssConfig{Sizes: sizeList, AgentBin: *agentBin, Duration: *rssDur, Period: *rssEvery, MinRate: *rssMin,
			Workers: *rssConc, Env: splitNonEmpty(*agentEnv), Dir: dir, Log: stderr})
		if err != nil {
			fail(err)
		} else {
			printRSS(stdout, res)
		}
	}
	if what == "replay" {
		res, err := runReplay(ctx, etcd, replayConfig{Devices: *devices, Backlog: *backlog, Runs: *runs, Timeout: *cmdTO, Dir: dir, Log: stderr})
		if res != nil && len(res.Runs) > 0 {
			printReplay(stdout, res)
		}
		if err != nil {
			fail(err)
		}
		if res != nil {
			for _, r := range res.Runs {
				if r.Check != "" {
					fail(fmt.Errorf("replay: %s", r.Check))
				}
			}
		}
	}
	if what == "failover" {
		res, err := runFailover(ctx, etcd, failoverConfig{Devices: *devices, TTLs: ttlVals, Trials: *runs, Faults: faultVals,
			Interval: *interval, Probes: *probes, AgentBin: *agentBin, DevsimBin: *devsim, Dir: dir, Log: stderr})
		if res != nil && len(res.Trials) > 0 {
			printFailover(stdout, res)
		}
		if err != nil {
			fail(err)
		}
	}
	if what == "lifecycle" || all {
		lcRuns := *runs
		if all && !set["runs"] {
			lcRuns = 10 // all's --runs default (5) is the locks benchmark's
		}
		res, err := runLifecycle(ctx, etcd, lifecycleConfig{Sizes: lcSizeList, Runs: lcRuns, AgentBin: *agentBin, Dir: dir, Log: stderr})
		if res != nil && len(res.Sizes) > 0 {
			printLifecycle(stdout, res)
		}
		if err != nil {
			fail(err)
		}
	}
	if what == "twins" {
		res, err := runTwins(ctx, etcd, twinsConfig{Sizes: twSizeList, Rounds: *runs, Devices: *devices, Changes: *changes,
			TPRuns: *twRuns, Fleets: *twFleets, Dir: dir, Log: stderr})
		if res != nil && (len(res.Lat) > 0 || len(res.TP) > 0) {
			printTwins(stdout, res)
		}
		if err != nil {
			fail(err)
		}
	}
	printLoad(stdout, "after")
	if failed {
		return 1
	}
	return 0
}

// intList parses a comma-separated list of positive integers.
func intList(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || v < 1 {
			return nil, fmt.Errorf("bad count %q", f)
		}
		out = append(out, v)
	}
	return out, nil
}

// ttlList parses a comma-separated list of lease TTLs: whole seconds, at
// least agent.MinLeaseTTL.
func ttlList(s string) ([]time.Duration, error) {
	var out []time.Duration
	for _, f := range strings.Split(s, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(f))
		if err != nil || d < agent.MinLeaseTTL || d%time.Second != 0 {
			return nil, fmt.Errorf("bad lease TTL %q: want whole seconds, at least %v", f, agent.MinLeaseTTL)
		}
		out = append(out, d)
	}
	return out, nil
}

// faultList parses --faults.
func faultList(s string) ([]string, error) {
	var out []string
	for _, f := range strings.Split(s, ",") {
		switch f = strings.TrimSpace(f); f {
		case faultKill, faultStop, faultTerm:
			out = append(out, f)
		default:
			return nil, fmt.Errorf("bad fault %q: want %s, %s or %s", f, faultKill, faultStop, faultTerm)
		}
	}
	return out, nil
}

func splitNonEmpty(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

func haveMosquitto() bool {
	if _, err := os.Stat(sandbox.MosquittoPath); err == nil {
		return true
	}
	return false
}

// printMachine prints what the figures were measured on and how busy the
// machine was just before.
func printMachine(w io.Writer) {
	cpu := "?"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				cpu = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	fmt.Fprintf(w, "machine: %d CPUs (GOMAXPROCS %d), %s, %s %s/%s, %s\n",
		runtime.NumCPU(), runtime.GOMAXPROCS(0), cpu, runtime.Version(), runtime.GOOS, runtime.GOARCH,
		time.Now().UTC().Format(time.RFC3339))
	printLoad(w, "before")
}

// printLoad prints the load average and the CPU and I/O pressure (PSI
// avg10: share of the last 10 s in which some task waited), to tell a quiet
// run from one that shared the machine.
func printLoad(w io.Writer, when string) {
	load := "?"
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) >= 3 {
			load = strings.Join(f[:3], " ")
		}
	}
	psi := func(res string) string {
		b, err := os.ReadFile("/proc/pressure/" + res)
		if err != nil {
			return "?"
		}
		for _, f := range strings.Fields(string(b)) {
			if v, ok := strings.CutPrefix(f, "avg10="); ok {
				return v + "%"
			}
		}
		return "?"
	}
	fmt.Fprintf(w, "load %s: loadavg %s, PSI avg10 cpu %s io %s\n\n", when, load, psi("cpu"), psi("io"))
}

func printRoundTrip(w io.Writer, results []*rtResult) {
	for _, r := range results {
		fmt.Fprintf(w, "### Command round trip on %s (envelope %d B, ack %d B)\n\n", r.Broker, r.EnvBytes, r.AckBytes)
		fmt.Fprintln(w, "| path | parallel | fleets | n | p50 µs | p90 µs | p99 µs | p99.9 µs | max µs | ops/s |")
		fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
		for _, x := range r.Rows {
			fmt.Fprintf(w, "| %s | %d | %d | %d | %s | %s | %s | %s | %s | %.0f |\n", x.Path, x.Conc, x.Fleets, x.S.N,
				us(x.S.P50), us(x.S.P90), us(x.S.P99), us(x.S.P999), us(x.S.Max), x.Rate)
		}
		fmt.Fprintln(w)
		one, ok1 := r.row(pathOneHop, 1)
		echo, ok2 := r.row(pathEcho, 1)
		for _, p := range []string{pathAccepted, pathDuplicate} {
			x, ok := r.row(p, 1)
			if !ok {
				continue
			}
			if ok1 {
				ratio := float64(x.S.P99) / float64(one.S.P99)
				fmt.Fprintf(w, "- %s: p99 %s µs = **%.2f×** the bare 1-hop p99 (%s µs); target ≤ 1.5×: **%s**",
					p, us(x.S.P99), ratio, us(one.S.P99), metOrNot(ratio <= 1.5))
			}
			if ok2 {
				fmt.Fprintf(w, "; %.2f× the bare 2-hop p99 (%s µs)", float64(x.S.P99)/float64(echo.S.P99), us(echo.S.P99))
			}
			fmt.Fprintln(w)
		}
		acc, ok3 := r.row(pathAccepted, 1)
		dup, ok4 := r.row(pathDuplicate, 1)
		hacc, ok5 := r.row(pathHostAcc, 1)
		hdup, ok6 := r.row(pathHostDup, 1)
		if ok2 && ok3 && ok4 && ok5 && ok6 {
			fmt.Fprintf(w, "- p50 decomposition: bare 2 hops %s µs; + agent (its outbox included), Commander and shim decode/admit (duplicate − 2 hops) %s µs; "+
				"+ commit and state publish (accepted − duplicate) %s µs, of which Host.Handle's commit alone (accepted − duplicate) %s µs\n",
				us(echo.S.P50), us(dup.S.P50-echo.S.P50), us(acc.S.P50-dup.S.P50), us(hacc.S.P50-hdup.S.P50))
		}
		fmt.Fprintln(w)
	}
}

func metOrNot(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

func printLocks(w io.Writer, r *locksResult) {
	fmt.Fprintf(w, "### Lock acquisition, %d devices on one etcd session (%d runs)\n\n", r.N, len(r.Times[locksAgent]))
	fmt.Fprintln(w, "| what | min ms | median ms | max ms | runs ms |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---|")
	for _, v := range locksVariants {
		ts := r.Times[v]
		if len(ts) == 0 {
			continue
		}
		var each []string
		lo, hi := ts[0], ts[0]
		for _, t := range ts {
			lo, hi = min(lo, t), max(hi, t)
			each = append(each, ms(t))
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", v, ms(lo), ms(median(ts)), ms(hi), strings.Join(each, ", "))
	}
	fmt.Fprintln(w)
	if ts := r.Times[locksAgent]; len(ts) > 0 {
		m := median(ts)
		fmt.Fprintf(w, "- agent, all %d held: median %s ms; target ≤ 500 ms: **%s** (worst run %s ms: %s)\n\n",
			r.N, ms(m), metOrNot(m <= 500*time.Millisecond), ms(slicesMax(ts)), metOrNot(slicesMax(ts) <= 500*time.Millisecond))
	}
}

func slicesMax(ts []time.Duration) time.Duration {
	m := ts[0]
	for _, t := range ts {
		m = max(m, t)
	}
	return m
}

func printRSS(w io.Writer, r *rssResult) {
	fmt.Fprintf(w, "### Agent memory after %v: `edgefence run` subprocess (binary %.1f MiB; %s)\n\n", r.Duration, float64(r.BinSize)/(1<<20), r.Built)
	fmt.Fprintf(w, "Load from all held to the end: one `set` per device per %v, at least %.0f/s, round robin, through the API socket; devices: one sim.Fleet in the bench process (not counted).\n\n", r.Period, r.MinRate)
	fmt.Fprintln(w, "| devices | all held after | VmRSS held | VmRSS at end | RssAnon | RssFile | VmHWM | sampled peak (at) | Go heap in use / sys | goroutines | threads | load cmds/s | agent CPU % | accepted / sent | send p50 / p99 ms | target | met (VmRSS at end / VmHWM) |")
	fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
	for _, x := range r.Rows {
		t := rssTarget(x.Devices)
		achieved := 0.0
		if x.LoadFor > 0 {
			achieved = float64(x.Sent) / x.LoadFor.Seconds()
		}
		fmt.Fprintf(w, "| %d | %s ms | %s MiB | %s MiB | %s MiB | %s MiB | %s MiB | %s MiB (%s ms) | %.1f / %.1f MiB | %.0f | %d | %.1f (planned %.1f) | %.1f | %d / %d | %s / %s | ≤ %.0f MiB | **%s / %s** |\n",
			x.Devices, ms(x.Held), mib(x.AtHeld.VmRSS), mib(x.AtEnd.VmRSS), mib(x.AtEnd.RssAnon),
			mib(x.AtEnd.RssFile), mib(x.AtEnd.VmHWM), mib(x.Peak), ms(x.PeakAt), x.Go.HeapInuse/(1<<20), x.Go.Sys/(1<<20), x.Go.Goroutines,
			x.Threads, achieved, x.Rate, x.CPU, x.Accepted, x.Sent, ms(x.SendP50), ms(x.SendP99), t, metOrNot(float64(x.AtEnd.VmRSS)/1024 <= t), metOrNot(float64(x.AtEnd.VmHWM)/1024 <= t))
	}
	fmt.Fprintln(w)
}
