// Command edgefence-bench measures the performance figures edgefence
// promises, on real components, and prints them as Markdown tables for
// docs/BENCHMARKS.md (each section there gives the command that made it):
//
//	roundtrip  agent → broker → shim → ack, p50/p99, sequential and
//	           concurrent, beside bare paho QoS 1 on the same broker
//	locks      one agent holding 1,000 devices on one etcd session, beside
//	           bare concurrency.Mutex acquisition
//	rss        resident memory of the real `edgefence run` under load, by
//	           fleet size
//	lifecycle  the real binary: exec → READY=1, SIGTERM → exit, locks and
//	           lease checked in etcd
//	all        the four above (≈ 6 min)
//	replay     the outbox across a broker outage: enqueue rate, time to the
//	           first replayed ack, replay rate; every command once, in order
//	failover   two real agents on the same devices: the holder killed,
//	           frozen or stopped under load; time to the other's first ack
//	twins      the twin reconciler: desired → twin.set → reported, latency
//	           and throughput, etcd requests per update
//	modbus-rtu the Modbus RTU bus master against the line-rate limit, with
//	           the Go slave on a paced RS-485 line (sandbox.RS485)
//	fwrollout  one firmware job over 1,000 devices (one devsim --firmware
//	           --in-process) through one `edgefence run`, 50 at a time: time
//	           to done, the agent's RSS and CPU, etcd requests
//	fanout     one POST /v1/fanout to 1,000 and 10,000 devices through one
//	           `edgefence run`: time to all accepted, outbox commits, agent
//	           CPU per device, beside bare paho to the same devices
//	etcdcost   what one agent's devices cost etcd, on the embedded 3.7 and
//	           Debian's 3.4: revisions, requests, watchers and db bytes per
//	           held and per waiting lock, per takeover; keep-alives and
//	           requests per second while idle
//	cluster    many `edgefence run` on an etcd cluster of separate
//	           processes, devices on devsim processes, each device on a
//	           home and a backup agent: time to all held, etcd requests,
//	           DB size and memory at rest; the agent holding the most
//	           killed: time to all held again and all accepted a command,
//	           once more with the etcd leader killed during the takeover
//
// roundtrip, locks, replay and twins run the agent in process, built by
// agent/daemon as `edgefence run` builds it (outbox included). Run from the
// module root (rss and failover build the binaries): go run
// ./cmd/edgefence-bench all. It starts what it needs (embedded etcd, mochi,
// Mosquitto from /usr/sbin/mosquitto) in a temp dir and removes it; it
// measures and reports, and its exit code does not depend on targets.
// Linux only (/proc).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/edgefence/edgefence/internal/sandbox"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	var code int
	if os.Getenv(bareChildEnv) != "" {
		code = runBareChild(ctx, os.Stdin, os.Stdout) // fanoutbare.go
	} else {
		code = run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	}
	stop()
	os.Exit(code)
}

const usage = `usage: edgefence-bench [flags] roundtrip|locks|rss|all|replay|failover|twins|lifecycle|modbus-rtu|fwrollout|fanout|etcdcost|cluster [flags]

Measures edgefence's performance figures on real components and prints
Markdown tables (progress goes to stderr). Flags:
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, f := newFlagSet(stderr)
	what, code, ok := parseArgs(fs, args, stderr)
	if !ok {
		return code
	}
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	b, err := f.benches(what, set)
	if err != nil {
		fmt.Fprintln(stderr, "edgefence-bench:", err)
		return 2
	}
	return b.run(ctx, stdout, stderr)
}

// run runs the benchmarks in a temp dir with one etcd and returns the exit
// code: 1 if one failed.
func (b *benches) run(ctx context.Context, stdout, stderr io.Writer) int {
	dir, err := os.MkdirTemp("", "edgefence-bench-")
	if err != nil {
		fmt.Fprintln(stderr, "edgefence-bench:", err)
		return 1
	}
	if b.keep {
		fmt.Fprintln(stderr, "keeping", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	if b.cpuprof != "" {
		stop, err := startCPUProfile(b.cpuprof)
		if err != nil {
			fmt.Fprintln(stderr, "edgefence-bench:", err)
			return 1
		}
		defer stop()
	}

	// What an earlier run left — its files' dirty pages, the blocks its
	// deletes freed — is written out before anything is measured, so that
	// a run right after another does not pay for its writeback in its own
	// fsyncs.
	t0 := time.Now()
	syscall.Sync()
	printMachine(stdout, time.Since(t0))
	etcd, err := startEtcd(ctx, dir)
	if err != nil {
		fmt.Fprintln(stderr, "edgefence-bench:", err)
		return 1
	}
	defer etcd.Close()
	e := &benchEnv{etcd: etcd, dir: dir, stdout: stdout, stderr: stderr}
	b.dispatch(ctx, e)
	printLoad(stdout, "after")
	if e.failed {
		return 1
	}
	return 0
}

// startCPUProfile profiles this process into the file path until stop.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// benchEnv is what the benchmarks of one invocation share: one etcd, the
// temp dir, the output (tables on stdout, progress and errors on stderr)
// and whether one of them failed.
type benchEnv struct {
	etcd           *sandbox.Etcd
	dir            string
	stdout, stderr io.Writer
	failed         bool
}

// fail reports err and marks the run failed.
func (e *benchEnv) fail(err error) {
	e.failed = true
	fmt.Fprintln(e.stderr, "edgefence-bench:", err)
}

// dispatch runs the benchmarks b.what names, in order.
func (b *benches) dispatch(ctx context.Context, e *benchEnv) {
	b.setDir(e.dir, e.stderr)
	all := b.what == "all"
	if b.what == "roundtrip" || all {
		b.rt.Brokers = installed(b.brokers, e.stderr)
		res, err := runRoundTrip(ctx, e.etcd, b.rt)
		show(e, res, err, true, printRoundTrip)
	}
	if b.what == "locks" || all {
		res, err := runLocks(ctx, e.etcd, b.locks)
		show(e, res, err, res != nil, printLocks)
	}
	if b.what == "rss" || all {
		res, err := runRSS(ctx, e.etcd, b.rss)
		show(e, res, err, res != nil, printRSS)
	}
	if b.what == "replay" {
		res, err := runReplay(ctx, e.etcd, b.replay)
		show(e, res, err, res != nil && len(res.Runs) > 0, printReplay)
		if res != nil {
			for _, r := range res.Runs {
				if r.Check != "" {
					e.fail(fmt.Errorf("replay: %s", r.Check))
				}
			}
		}
	}
	if b.what == "failover" {
		res, err := runFailover(ctx, e.etcd, b.failover)
		show(e, res, err, res != nil && len(res.Trials) > 0, printFailover)
	}
	if b.what == "lifecycle" || all {
		res, err := runLifecycle(ctx, e.etcd, b.lifecycle)
		show(e, res, err, res != nil && len(res.Sizes) > 0, printLifecycle)
	}
	if b.what == "twins" {
		res, err := runTwins(ctx, e.etcd, b.twins)
		show(e, res, err, res != nil && (len(res.Lat) > 0 || len(res.TP) > 0), printTwins)
	}
	if b.what == "fwrollout" {
		res, err := runFWRollout(ctx, e.etcd, b.fw)
		show(e, res, err, res != nil && len(res.Runs) > 0, printFWRollout)
	}
	if b.what == "fanout" {
		res, err := runFanout(ctx, e.etcd, b.fan)
		show(e, res, err, res != nil && len(res.Rows) > 0, printFanout)
	}
	if b.what == "etcdcost" {
		res, err := runEtcdCost(ctx, e.etcd, b.cost)
		show(e, res, err, len(res) > 0, printEtcdCost)
	}
	if b.what == "cluster" {
		res, err := runCluster(ctx, b.cluster)
		show(e, res, err, res != nil && res.Held > 0, printCluster)
	}
	if b.what == "modbus-rtu" {
		res, err := runModbusRTU(ctx, b.rtu)
		show(e, res, err, len(res) > 0, printModbusRTU)
	}
}

// setDir gives every benchmark the temp dir and the progress log.
func (b *benches) setDir(dir string, log io.Writer) {
	b.rt.Dir, b.rt.Log = dir, log
	b.locks.Dir, b.locks.Log = dir, log
	b.rss.Dir, b.rss.Log = dir, log
	b.replay.Dir, b.replay.Log = dir, log
	b.failover.Dir, b.failover.Log = dir, log
	b.lifecycle.Dir, b.lifecycle.Log = dir, log
	b.twins.Dir, b.twins.Log = dir, log
	b.rtu.Dir, b.rtu.Log = dir, log
	b.fw.Dir, b.fw.Log = dir, log
	b.fan.Dir, b.fan.Log = dir, log
	b.cluster.Dir, b.cluster.Log = dir, log
	b.cost.Dir, b.cost.Log = dir, log
}

// show prints a benchmark's result res with print if ok (it holds
// something to print), then fails the run on err.
func show[R any](e *benchEnv, res R, err error, ok bool, print func(io.Writer, R)) {
	if ok {
		print(e.stdout, res)
	}
	if err != nil {
		e.fail(err)
	}
}

// installed returns brokers without Mosquitto if it is not installed,
// saying so on stderr.
func installed(brokers []string, stderr io.Writer) []string {
	var out []string
	for _, b := range brokers {
		if b == brokerMosquitto && !haveMosquitto() {
			fmt.Fprintf(stderr, "roundtrip: mosquitto not installed (%s): skipped; apt-get install mosquitto\n", sandbox.MosquittoPath)
			continue
		}
		out = append(out, b)
	}
	return out
}

func haveMosquitto() bool {
	if _, err := os.Stat(sandbox.MosquittoPath); err == nil {
		return true
	}
	return false
}

// printMachine prints what the figures were measured on, how long the
// sync before the run took (synced: what an earlier run left to write) and
// how busy the machine was just before.
func printMachine(w io.Writer, synced time.Duration) {
	cpu := "?"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				cpu = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	fmt.Fprintf(w, "machine: %d CPUs (GOMAXPROCS %d), %s, %s %s/%s, %s; sync before the run %s ms\n",
		runtime.NumCPU(), runtime.GOMAXPROCS(0), cpu, runtime.Version(), runtime.GOOS, runtime.GOARCH,
		time.Now().UTC().Format(time.RFC3339), ms(synced))
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
		printRTRatios(w, r)
		acc, ok3 := r.row(pathAccepted, 1)
		dup, ok4 := r.row(pathDuplicate, 1)
		hacc, ok5 := r.row(pathHostAcc, 1)
		hdup, ok6 := r.row(pathHostDup, 1)
		echo, ok2 := r.row(pathEcho, 1)
		if ok2 && ok3 && ok4 && ok5 && ok6 {
			fmt.Fprintf(w, "- p50 decomposition: bare 2 hops %s µs; + agent (its outbox included), Commander and shim decode/admit (duplicate − 2 hops) %s µs; "+
				"+ commit and state publish (accepted − duplicate) %s µs, of which Host.Handle's commit alone (accepted − duplicate) %s µs\n",
				us(echo.S.P50), us(dup.S.P50-echo.S.P50), us(acc.S.P50-dup.S.P50), us(hacc.S.P50-hdup.S.P50))
		}
		if bolt, ok := r.row(pathEchoBolt, 1); ok && ok2 {
			fmt.Fprintf(w, "- the bare responder's durable write in place, p50: bbolt commit (2 hops + bbolt − 2 hops) %s µs", us(bolt.S.P50-echo.S.P50))
			if sync, ok := r.row(pathEchoSync, 1); ok {
				fmt.Fprintf(w, "; pwrite + fdatasync %s µs", us(sync.S.P50-echo.S.P50))
			}
			fmt.Fprintln(w)
		}
		fmt.Fprintln(w)
	}
}

// rtTarget is issue 17's round-trip target: the agent's accepted p99
// within this factor of the bare 2-hop request→reply whose responder
// commits one mark in bbolt.
const rtTarget = 1.5

// printRTRatios prints the accepted path's p99 against the bare 2-hop
// request→reply with one fsync at the responder (issue 17's target, against
// the bbolt commit; the fdatasync one for reference), and the earlier ratios
// (1 hop, 2 hops without fsync: BENCHMARKS §1, 1a/1b) for history.
func printRTRatios(w io.Writer, r *rtResult) {
	ratio := func(x, base rtRow) float64 { return float64(x.S.P99) / float64(base.S.P99) }
	acc, okAcc := r.row(pathAccepted, 1)
	if bolt, ok := r.row(pathEchoBolt, 1); ok && okAcc {
		q := ratio(acc, bolt)
		fmt.Fprintf(w, "- **accepted p99 %s µs = %.2f× the bare 2-hop request→reply whose responder commits a mark in bbolt (p99 %s µs); target ≤ %.1f×: %s**",
			us(acc.S.P99), q, us(bolt.S.P99), rtTarget, metOrNot(q <= rtTarget))
		fmt.Fprintf(w, "; p50 %s ÷ %s µs = %.2f×", us(acc.S.P50), us(bolt.S.P50), float64(acc.S.P50)/float64(bolt.S.P50))
		if sync, ok := r.row(pathEchoSync, 1); ok {
			fmt.Fprintf(w, "; against the responder's pwrite + fdatasync (p99 %s µs): %.2f×", us(sync.S.P99), ratio(acc, sync))
		}
		if both, ok := r.row(pathEchoBoth, 1); ok {
			fmt.Fprintf(w, "; against requester and responder each committing in bbolt, the agent's shape (p99 %s µs): %.2f× (p50 %.2f×)",
				us(both.S.P99), ratio(acc, both), float64(acc.S.P50)/float64(both.S.P50))
		}
		fmt.Fprintln(w)
	}
	one, okOne := r.row(pathOneHop, 1)
	echo, okEcho := r.row(pathEcho, 1)
	for _, p := range []string{pathAccepted, pathDuplicate} {
		x, ok := r.row(p, 1)
		if !ok || !okOne || !okEcho {
			continue
		}
		fmt.Fprintf(w, "- %s: p99 %s µs = %.2f× the bare 1-hop p99 (%s µs), %.2f× the bare 2-hop p99 without fsync (%s µs) (the comparisons before issue 17)\n",
			p, us(x.S.P99), ratio(x, one), us(one.S.P99), ratio(x, echo), us(echo.S.P99))
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
	printRSSCPU(w, r)
}

// printRSSCPU prints the agent's CPU per accepted command (issue 17).
func printRSSCPU(w io.Writer, r *rssResult) {
	fmt.Fprintln(w, "Agent CPU (user+sys from /proc/PID/stat, 10 ms ticks): idle with all held and no commands; under the load, per accepted command, gross and net of the idle rate over as long.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| devices | idle window s | idle CPU % core | load s | load CPU s | accepted | outbox commits / command | µs / command gross | µs / command net of idle | target ≤ 150 µs | profile |")
	fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
	for _, x := range r.Rows {
		g, n := x.perCommand()
		commits := "?"
		if x.Commits >= 0 && x.Accepted > 0 {
			commits = fmt.Sprintf("%.2f", x.Commits/float64(x.Accepted))
		}
		fmt.Fprintf(w, "| %d | %.1f | %.2f | %.1f | %.2f | %d | %s | %.0f | %.0f | **%s** | %s |\n", x.Devices, x.IdleFor.Seconds(), x.IdleCPU,
			x.LoadFor.Seconds(), x.LoadCPU.Seconds(), x.Accepted, commits, float64(g)/1e3, float64(n)/1e3, metOrNot(g <= 150*time.Microsecond), x.Profile)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Agent thread wakes (context switches, voluntary + involuntary, summed over /proc/PID/task/*/status; CPU from each thread's schedstat, ns): idle rate; under the load, per accepted command, gross and net of the idle rate, the threads' CPU, and the three busiest threads' switches (CPU) per command.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| devices | idle switches/s | load switches/s | switches / command gross | net of idle | threads' CPU µs / command | busiest threads / command |")
	fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|---|")
	for _, x := range r.Rows {
		g, n, top := switchesPerCommand(x.LoadSw, x.IdleSw, x.Accepted)
		cpu := 0.0
		if x.Accepted > 0 {
			cpu = float64(x.LoadSw.CPU) / float64(time.Microsecond) / float64(x.Accepted)
		}
		fmt.Fprintf(w, "| %d | %.0f | %.0f | %.1f | %.1f | %.0f | %s |\n", x.Devices, x.IdleSw.perSecond(), x.LoadSw.perSecond(), g, n, cpu, top)
	}
	fmt.Fprintln(w)
}
