package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/devices/fwjob"
)

// benchFlags are edgefence-bench's flags, by the benchmark that reads
// them. One flag set serves every benchmark: flags may come before or
// after the subcommand.
type benchFlags struct {
	rt       rtFlags
	twins    twinsFlags
	replay   replayFlags
	failover failoverFlags
	rss      rssFlags
	rtu      rtuFlags
	fw       fwFlags
	fan      fanFlags
	cluster  clusterFlags
	lcSizes  string // lifecycle
	devices  int    // locks, replay, failover, twins
	runs     int    // locks, replay, failover, twins, lifecycle
	agentBin string // rss, failover, lifecycle
	keep     bool
	cpuprof  string
	sign     bool // roundtrip, replay, rss, fanout, cluster
	cost     costFlags
}

type costFlags struct {
	etcd string
	idle time.Duration
}

type rtFlags struct {
	broker                         string
	n, rounds, warmup, conc, concN int
	fleets                         string
}

type twinsFlags struct {
	sizes                 string
	runs, changes, fleets int
}

type replayFlags struct {
	backlog int
	cmdTO   time.Duration
}

type failoverFlags struct {
	ttls, faults string
	probes       int
	interval     time.Duration
	devsim       string
}

type fanFlags struct {
	sizes  string
	fleets int
	lanes  int
}

type clusterFlags struct {
	agents, spare, nodes, devsims, lanes int
	ttl, leaderKill, steady              time.Duration
	etcdArgs                             string
}

func (f *clusterFlags) register(fs *flag.FlagSet) {
	fs.IntVar(&f.agents, "agents", 10, "cluster: `edgefence run` processes")
	fs.IntVar(&f.spare, "spare-agents", 0, "cluster: of them, agents with no home devices (backups only); 0: each device's backup is another home agent")
	fs.IntVar(&f.nodes, "etcd-nodes", 3, "cluster: etcd members (Debian's etcd, separate processes)")
	fs.IntVar(&f.devsims, "devsims", 4, "cluster: edgefence-devsim processes per home agent (one bbolt file each)")
	fs.IntVar(&f.lanes, "devsim-lanes", 8, "cluster: MQTT clients per devsim process (edgefence-devsim --lanes): commands reaching different lanes together share one fsync, each acked after it; 1: one command at a time per process")
	fs.DurationVar(&f.ttl, "ttl", 10*time.Second, "cluster: the agents' lease_ttl (whole seconds, at least 2s)")
	fs.DurationVar(&f.leaderKill, "leader-kill", 5*time.Second, "cluster: with 3+ etcd nodes, a last takeover with the etcd leader killed (SIGKILL) this long after the agent (0: none)")
	fs.DurationVar(&f.steady, "steady", 10*time.Second, "cluster: measure etcd's requests and the CPU at rest this long")
	fs.StringVar(&f.etcdArgs, "etcd-args", "", "cluster: more flags for every etcd member, space-separated (e.g. --snapshot-count=10000)")
}

func (f *fanFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.sizes, "fanout-sizes", "1000,10000", "fanout: device counts, comma-separated")
	fs.IntVar(&f.fleets, "fanout-fleets", 4, "fanout: sim.Fleets (an MQTT client + bbolt file each) the devices are split over")
	fs.IntVar(&f.lanes, "fanout-lanes", 1, "fanout: MQTT clients per fleet (sim.FleetConfig.Lanes); above 1 the commands that reach a fleet's lanes together are decided in one bbolt commit, each acked after it")
}

type rtuFlags struct {
	bauds string
	n     int
}

type fwFlags struct {
	concurrent       int
	imageSize, chunk string
	timeout          time.Duration
}

type rssFlags struct {
	sizes       string
	dur, period time.Duration
	minRate     float64
	workers     int
	agentEnv    string
	agentSlack  time.Duration
	idle        time.Duration
	agentProf   string
	verdict     string
	maxEnded    int
}

// newFlagSet returns edgefence-bench's flag set, parsing into the
// returned benchFlags.
func newFlagSet(stderr io.Writer) (*flag.FlagSet, *benchFlags) {
	fs := flag.NewFlagSet("edgefence-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage); fs.PrintDefaults() }
	f := &benchFlags{}
	f.rt.register(fs)
	f.twins.register(fs)
	f.replay.register(fs)
	f.failover.register(fs)
	f.rss.register(fs)
	f.rtu.register(fs)
	f.fw.register(fs)
	f.fan.register(fs)
	f.cluster.register(fs)
	fs.StringVar(&f.cost.etcd, "etcd", "both", "etcdcost: embedded (3.7, in process), debian (/usr/bin/etcd, 3.4) or both")
	fs.DurationVar(&f.cost.idle, "cost-idle", 20*time.Second, "etcdcost: each idle window (keep-alives, requests per second)")
	fs.StringVar(&f.lcSizes, "lc-sizes", "10,1000", "lifecycle: device counts, comma-separated")
	fs.IntVar(&f.devices, "devices", 0, "locks: devices (default 1000); replay: devices (default 10); failover: devices (default 4); twins: devices on the agent, all changing at once in the throughput runs (default 1000); fwrollout: firmware devices, all targets of the job (default 1000); etcdcost: devices per agent (default 1000)")
	fs.IntVar(&f.runs, "runs", 0, "locks, replay, fwrollout, fanout: repetitions (default 5, 3, 3, 3: fan-outs per size, the first warms up); failover: trials per lease_ttl and fault (default 3); twins: latency rounds per size (default 30)")
	fs.StringVar(&f.agentBin, "agent-bin", "", "rss, failover, lifecycle, fwrollout, fanout: the edgefence binary (default: go build it from the module in the working directory)")
	fs.BoolVar(&f.keep, "keep", false, "keep the temp dir (logs, configs, data)")
	fs.BoolVar(&f.sign, "sign", false, "roundtrip, replay, rss, fanout, cluster: run signed (I7): commands signed by the agent and verified by the devices, acks and state reports signed by the devices and verified by the agent; fanout: the bare paho client signs and verifies too; cluster: each agent has a gateway key and certificate, the devsims only the root and their device keys (the gateways' certificates reach them as trust updates)")
	fs.StringVar(&f.cpuprof, "cpuprofile", "", "write a CPU profile of this process (etcd, mochi, devices and the in-process agent) to FILE")
	return fs, f
}

func (f *rtFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.broker, "broker", "both", "roundtrip: mochi, mosquitto or both")
	fs.IntVar(&f.n, "n", 5000, "roundtrip: sequential operations per path")
	fs.IntVar(&f.rounds, "rounds", 10, "roundtrip: interleave the sequential paths in this many rounds")
	fs.IntVar(&f.warmup, "warmup", 200, "roundtrip: unmeasured operations per path first")
	fs.IntVar(&f.conc, "conc", 32, "roundtrip: devices in parallel for the concurrent variant (1 = none)")
	fs.IntVar(&f.concN, "conc-n", 20000, "roundtrip: operations per concurrent path")
	fs.StringVar(&f.fleets, "fleets", "1,32", "roundtrip: comma-separated; run the concurrent variant with the devices split over this many sim.Fleets (an MQTT client + bbolt file each); the sequential one uses the first")
}

func (f *twinsFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.sizes, "twin-sizes", "1,100", "twins: devices changing at once in the latency rounds, comma-separated (at most --devices)")
	fs.IntVar(&f.runs, "twin-runs", 3, "twins: throughput runs (0: none)")
	fs.IntVar(&f.changes, "changes", 1, "twins: desired changes per device per throughput run (a stream; only the last must show in reported)")
	fs.IntVar(&f.fleets, "twin-fleets", 1, "twins: split the devices over this many sim.Fleets (an MQTT client + bbolt file each, commands handled one at a time per fleet)")
}

func (f *replayFlags) register(fs *flag.FlagSet) {
	fs.IntVar(&f.backlog, "backlog", 10000, "replay: commands queued while the broker is down")
	fs.DurationVar(&f.cmdTO, "cmd-timeout", 10*time.Second, "replay: the agent's command timeout (command.timeout)")
}

func (f *failoverFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.ttls, "ttls", "2s,5s,10s", "failover: lease_ttl values, comma-separated (whole seconds, at least 2s)")
	fs.StringVar(&f.faults, "faults", "kill,stop", "failover: kill (SIGKILL), stop (SIGSTOP, then SIGCONT once B took over) and/or term (SIGTERM: clean shutdown), comma-separated")
	fs.IntVar(&f.probes, "probes", 0, "failover: send the load to this many devices, spread over the list (0: every device)")
	fs.DurationVar(&f.interval, "interval", 10*time.Millisecond, "failover: the load sends one command per device this often through B")
	fs.StringVar(&f.devsim, "devsim-bin", "", "failover, fwrollout: the edgefence-devsim binary (default: go build it)")
}

// profDir makes dir (if given) and returns it absolute.
func profDir(dir string) (string, error) {
	if dir == "" {
		return "", nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("--agent-cpuprofile: %w", err)
	}
	return filepath.Abs(dir)
}

func (f *rssFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.sizes, "sizes", "10,1000,10000", "rss: device counts, comma-separated")
	fs.DurationVar(&f.dur, "rss-duration", 60*time.Second, "rss: measure this long after the agent process started")
	fs.DurationVar(&f.period, "rss-period", 60*time.Second, "rss: the load sends each device one command per period...")
	fs.Float64Var(&f.minRate, "rss-min-rate", 5, "rss: ...but at least this many commands/s over all devices")
	fs.IntVar(&f.workers, "rss-workers", 8, "rss: API clients sending the load concurrently")
	fs.DurationVar(&f.idle, "rss-idle", 20*time.Second, "rss: measure the agent's CPU this long with all devices held and no commands, before the load (0: not)")
	fs.StringVar(&f.agentProf, "agent-cpuprofile", "", "rss, fanout, cluster: the agent is built for profiling (-tags edgefence_pprof; an --agent-bin must be too) and serves pprof (metrics.pprof). rss: a CPU profile of each size's load window (at most 25 s) is written to DIR/agent-cpu-N.pprof, of its idle window to agent-idle-N.pprof, and its allocations since start to agent-allocs-N.pprof; fanout: of each size's last fan-out (the first run's time + 2 s, at most 25 s) to DIR/agent-fanout-N.pprof; cluster: before the first takeover every agent's heap and goroutines to DIR/cluster-<gw>-heap.pprof and -goroutine.pprof, and during it (TTL + 5 s) each taker's CPU to DIR/cluster-<gw>-takeover-cpu.pprof")
	fs.StringVar(&f.verdict, "rss-verdict-delay", "", "rss: the agent's outbox.verdict_delay (e.g. 0s: strict, a commit per verdict; empty: the agent's default)")
	fs.IntVar(&f.maxEnded, "rss-max-ended", 0, "rss: the agent's outbox.max_ended, the ended commands its outbox keeps at most (0: the agent's default)")
	fs.DurationVar(&f.agentSlack, "agent-timerslack", 0, "rss, fanout, cluster: start the agents with this timer slack (prctl PR_SET_TIMERSLACK, as deploy/edgefence.service's TimerSlackNSec= does; 0: the bench's own, 50µs by default)")
	fs.StringVar(&f.agentEnv, "agent-env", "", "rss, fanout, cluster: extra environment for the agent(s), comma-separated (e.g. GOGC=50,GODEBUG=gctrace=1; see --keep for its log)")
}

func (f *fwFlags) register(fs *flag.FlagSet) {
	fs.IntVar(&f.concurrent, "concurrent", 50, "fwrollout: the job's max_concurrent (executions in progress at once)")
	fs.StringVar(&f.imageSize, "image-size", "64KiB", "fwrollout: the image's size (bytes, or with KiB or MiB)")
	fs.StringVar(&f.chunk, "chunk", "16KiB", "fwrollout: bytes per fw.chunk (bytes, or with KiB; at most 30 KiB)")
	fs.DurationVar(&f.timeout, "fw-timeout", 30*time.Minute, "fwrollout: give up on a rollout not done this long after its creation")
}

func (f *rtuFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.bauds, "bauds", "9600,115200", "modbus-rtu: line rates, comma-separated")
	fs.IntVar(&f.n, "rtu-n", 500, "modbus-rtu: transactions per rate and operation")
}

// benchNames are the subcommands.
var benchNames = []string{"roundtrip", "locks", "rss", "all", "replay", "failover", "twins", "lifecycle", "modbus-rtu", "fwrollout", "fanout", "etcdcost", "cluster"}

// parseArgs parses args, the flags before or after the one benchmark
// name, and returns that name. With ok false the command is to exit with
// code: 0 after -h, 2 on a usage error (reported on stderr).
func parseArgs(fs *flag.FlagSet, args []string, stderr io.Writer) (what string, code int, ok bool) {
	rest := args
	for {
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return "", 0, false
			}
			return "", 2, false
		}
		if fs.NArg() == 0 {
			break
		}
		if what != "" {
			fmt.Fprintf(stderr, "edgefence-bench: more than one benchmark given: %q and %q\n", what, fs.Arg(0))
			return "", 2, false
		}
		what, rest = fs.Arg(0), fs.Args()[1:]
	}
	switch {
	case what == "":
		fs.Usage()
		return "", 2, false
	case !slices.Contains(benchNames, what):
		fmt.Fprintf(stderr, "edgefence-bench: unknown benchmark %q\n", what)
		fs.Usage()
		return "", 2, false
	}
	return what, 0, true
}

// benches is what one invocation runs: the benchmark (what) and each
// benchmark's configuration from the flags, but for Dir and Log.
type benches struct {
	what      string
	brokers   []string // roundtrip's, before checking Mosquitto is installed
	rt        rtConfig
	locks     locksConfig
	rss       rssConfig
	replay    replayConfig
	failover  failoverConfig
	lifecycle lifecycleConfig
	twins     twinsConfig
	rtu       modbusRTUConfig
	fw        fwRolloutConfig
	fan       fanoutConfig
	cluster   clusterConfig
	cost      etcdCostConfig
	keep      bool
	cpuprof   string
}

// benches checks the flags for the benchmark what, set being the flags
// given, and returns the configurations. The checks run in a fixed order;
// the first that fails is the error.
func (f *benchFlags) benches(what string, set map[string]bool) (*benches, error) {
	l, err := f.lists()
	if err != nil {
		return nil, err
	}
	f.defaults(what, set)
	if err := f.checkBounds(what, l.twinSizes); err != nil {
		return nil, err
	}
	ttls, err := ttlList(f.failover.ttls)
	if err != nil {
		return nil, fmt.Errorf("--ttls: %w", err)
	}
	faults, err := faultList(f.failover.faults)
	if err != nil {
		return nil, fmt.Errorf("--faults: %w", err)
	}
	fw, err := f.fw.config(f)
	if err != nil {
		return nil, err
	}
	cl, err := f.cluster.config(f)
	if err != nil {
		return nil, err
	}
	pdir, err := profDir(f.rss.agentProf)
	if err != nil {
		return nil, err
	}
	cl.ProfDir = pdir
	lcRuns := f.runs
	if what == "all" && !set["runs"] {
		lcRuns = 10 // all's --runs default (5) is the locks benchmark's
	}
	return &benches{
		what:    what,
		brokers: l.brokers,
		rt: rtConfig{N: f.rt.n, Rounds: f.rt.rounds, Warmup: f.rt.warmup, Conc: f.rt.conc,
			ConcN: f.rt.concN, Fleets: l.fleets, Sign: f.sign},
		locks: locksConfig{N: f.devices, Runs: f.runs},
		rss: rssConfig{Sizes: l.sizes, AgentBin: f.agentBin, Duration: f.rss.dur, Period: f.rss.period, MinRate: f.rss.minRate,
			Workers: f.rss.workers, Env: splitNonEmpty(f.rss.agentEnv), Sign: f.sign, Idle: f.rss.idle, ProfDir: pdir, TimerSlack: f.rss.agentSlack,
			VerdictDelay: f.rss.verdict, MaxEnded: f.rss.maxEnded},
		replay: replayConfig{Devices: f.devices, Backlog: f.replay.backlog, Runs: f.runs, Timeout: f.replay.cmdTO, Sign: f.sign},
		failover: failoverConfig{Devices: f.devices, TTLs: ttls, Trials: f.runs, Faults: faults,
			Interval: f.failover.interval, Probes: f.failover.probes, AgentBin: f.agentBin, DevsimBin: f.failover.devsim},
		lifecycle: lifecycleConfig{Sizes: l.lcSizes, Runs: lcRuns, AgentBin: f.agentBin},
		twins: twinsConfig{Sizes: l.twinSizes, Rounds: f.runs, Devices: f.devices, Changes: f.twins.changes,
			TPRuns: f.twins.runs, Fleets: f.twins.fleets},
		rtu:     modbusRTUConfig{Bauds: l.bauds, N: f.rtu.n},
		fw:      fw,
		fan:     fanoutConfig{Sizes: l.fanSizes, Runs: f.runs, Fleets: max(f.fan.fleets, 1), Lanes: max(f.fan.lanes, 1), AgentBin: f.agentBin, ProfDir: pdir, Env: splitNonEmpty(f.rss.agentEnv), TimerSlack: f.rss.agentSlack, Sign: f.sign},
		cost:    etcdCostConfig{N: f.devices, Impls: l.etcds, Idle: f.cost.idle, LeaseTTL: 10 * time.Second},
		cluster: cl,
		keep:    f.keep,
		cpuprof: f.cpuprof,
	}, nil
}

// flagLists are the list flags, parsed.
type flagLists struct {
	brokers, etcds                    []string
	sizes, fleets, lcSizes, twinSizes []int
	bauds, fanSizes                   []int
}

// oneOrBoth reads the flag name's value v: x, y or "both".
func oneOrBoth(name, v, x, y string) ([]string, error) {
	switch v {
	case "both":
		return []string{x, y}, nil
	case x, y:
		return []string{v}, nil
	}
	return nil, fmt.Errorf("--%s %q: want %s, %s or both", name, v, x, y)
}

func (f *benchFlags) lists() (flagLists, error) {
	var l flagLists
	var err error
	if l.brokers, err = oneOrBoth("broker", f.rt.broker, brokerMochi, brokerMosquitto); err != nil {
		return l, err
	}
	if l.etcds, err = oneOrBoth("etcd", f.cost.etcd, etcdEmbedded, etcdDebian); err != nil {
		return l, err
	}
	for _, x := range []struct {
		name, val string
		list      *[]int
	}{{"sizes", f.rss.sizes, &l.sizes}, {"fleets", f.rt.fleets, &l.fleets}, {"lc-sizes", f.lcSizes, &l.lcSizes}, {"twin-sizes", f.twins.sizes, &l.twinSizes}, {"bauds", f.rtu.bauds, &l.bauds}, {"fanout-sizes", f.fan.sizes, &l.fanSizes}} {
		if *x.list, err = intList(x.val); err != nil {
			return l, fmt.Errorf("--%s: %w", x.name, err)
		}
	}
	return l, nil
}

// defaults sets --devices and --runs, when not given, to the default of
// the benchmark what.
func (f *benchFlags) defaults(what string, set map[string]bool) {
	if !set["devices"] {
		f.devices = map[string]int{"replay": 10, "failover": 4, "cluster": 100_000}[what]
		if f.devices == 0 {
			f.devices = 1000
		}
	}
	if !set["runs"] {
		f.runs = map[string]int{"replay": 3, "failover": 3, "fwrollout": 3, "twins": 30, "lifecycle": 10, "fanout": 3, "cluster": 1}[what]
		if f.runs == 0 {
			f.runs = 5
		}
	}
}

// checkBounds checks the numeric flags' ranges.
func (f *benchFlags) checkBounds(what string, twinSizes []int) error {
	if f.rt.n < 1 || f.rt.conc < 1 || f.devices < 1 || f.runs < 1 || f.replay.backlog < 1 || f.twins.changes < 1 || f.twins.fleets < 1 || f.rtu.n < 1 {
		return errors.New("--n, --conc, --devices, --runs, --backlog, --changes, --twin-fleets and --rtu-n must be at least 1")
	}
	if f.twins.runs < 0 {
		return errors.New("--twin-runs must not be negative")
	}
	if what == "twins" && slices.Max(twinSizes) > f.devices {
		return fmt.Errorf("--twin-sizes: %d devices at once, but --devices is %d", slices.Max(twinSizes), f.devices)
	}
	if f.replay.cmdTO <= 0 || f.failover.interval <= 0 || f.rss.dur <= 0 || f.rss.period <= 0 || f.rss.minRate <= 0 || f.rss.workers < 1 {
		return errors.New("--cmd-timeout, --interval, --rss-duration, --rss-period, --rss-min-rate and --rss-workers must be positive")
	}
	return nil
}

// config checks the cluster flags and returns its configuration.
func (f *clusterFlags) config(b *benchFlags) (clusterConfig, error) {
	c := clusterConfig{Agents: f.agents, Spare: f.spare, Devices: b.devices, EtcdNodes: f.nodes, TTL: f.ttl, Devsims: f.devsims, Lanes: f.lanes, EtcdArgs: strings.Fields(f.etcdArgs),
		Trials: b.runs, LeaderKill: f.leaderKill, Steady: f.steady, AgentBin: b.agentBin, DevsimBin: b.failover.devsim, TimerSlack: b.rss.agentSlack,
		Env: splitNonEmpty(b.rss.agentEnv), Sign: b.sign}
	switch {
	case f.agents < 2 || f.spare < 0 || f.spare >= f.agents:
		return c, errors.New("--agents must be at least 2, and --spare-agents from 0 to --agents − 1")
	case f.nodes < 1 || f.devsims < 1 || f.lanes < 1:
		return c, errors.New("--etcd-nodes, --devsims and --devsim-lanes must be at least 1")
	case f.ttl < agent.MinLeaseTTL || f.ttl%time.Second != 0:
		return c, fmt.Errorf("--ttl %v: want whole seconds, at least %v", f.ttl, agent.MinLeaseTTL)
	case f.leaderKill < 0 || f.steady <= 0:
		return c, errors.New("--leader-kill must not be negative and --steady must be positive")
	}
	return c, nil
}

// config checks the fwrollout flags and returns its configuration.
func (f *fwFlags) config(b *benchFlags) (fwRolloutConfig, error) {
	c := fwRolloutConfig{Devices: b.devices, Concurrent: f.concurrent, Runs: b.runs, Timeout: f.timeout,
		AgentBin: b.agentBin, DevsimBin: b.failover.devsim}
	var err error
	if c.ImageSize, err = parseBytes(f.imageSize); err != nil {
		return c, fmt.Errorf("--image-size: %w", err)
	}
	if c.Chunk, err = parseBytes(f.chunk); err != nil {
		return c, fmt.Errorf("--chunk: %w", err)
	}
	switch {
	case c.Chunk > fwjob.MaxChunk:
		return c, fmt.Errorf("--chunk: %d bytes, more than a fw.chunk carries (%d)", c.Chunk, fwjob.MaxChunk)
	case f.concurrent < 1:
		return c, errors.New("--concurrent must be at least 1")
	case f.timeout <= 0:
		return c, errors.New("--fw-timeout must be positive")
	}
	return c, nil
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
