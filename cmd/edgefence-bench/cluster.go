package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgefence/edgefence/internal/sandbox"
)

// The cluster benchmark (issue 17): many gateways, one etcd cluster, every
// part a separate process — etcd members (Debian's etcd), `edgefence run`
// agents, `edgefence-devsim` processes whose devices fsync each command —
// but the MQTT broker (mochi, in this process). Each device is configured
// on two agents: its home, which holds it, and a backup, whose campaign
// waits behind the home's lock key. Then the agent holding the most
// devices is killed (SIGKILL) and the others' takeover is timed: until
// they hold every device it held, and until every one of them accepted a
// command from its new holder; once more with the etcd leader killed
// during the takeover.

// clusterConfig configures the cluster benchmark.
type clusterConfig struct {
	Agents     int
	Spare      int // agents with no home devices, backups only
	Devices    int
	EtcdNodes  int
	TTL        time.Duration // the agents' lease_ttl
	Devsims    int           // devsim processes per home agent
	Lanes      int           // MQTT clients per devsim process
	EtcdArgs   []string      // more flags for every etcd member
	Trials     int           // plain kill trials
	LeaderKill time.Duration // >0 and 3+ nodes: one more trial, the etcd leader killed this long after the agent
	Steady     time.Duration // the steady-state window (etcd requests, CPU)
	AgentBin   string
	DevsimBin  string
	TimerSlack time.Duration // the agents' timer slack (--agent-timerslack); 0: the bench's
	Env        []string      // more environment for every agent (--agent-env)
	Sign       bool          // signed (--sign): clusterTrust
	// ProfDir: the agents serve pprof (a profiling build); before the
	// first takeover each agent's heap and goroutines, and during it each
	// taker's CPU, are written here (clusterProfiles).
	ProfDir string
	Dir     string
	Log     io.Writer
}

// clusterPlan says which agent is home and which backup of each device,
// and which devsim process serves it.
type clusterPlan struct {
	homes   int        // agents with home devices: the first homes
	home    [][]string // by agent: the devices it holds first
	backup  [][]string // by agent: the devices it backs up
	devsims [][]string // by devsim process
}

// newClusterPlan places cfg.Devices devices: in blocks on the home agents,
// Devsims processes per home agent; a device's backup is a spare agent (round
// robin) or, without spares, one of the other agents (round robin), so a
// killed agent's devices have takers spread over the rest.
func newClusterPlan(cfg clusterConfig) (*clusterPlan, error) {
	p := &clusterPlan{homes: cfg.Agents - cfg.Spare}
	nd := p.homes * cfg.Devsims
	switch {
	case cfg.Agents < 2 || p.homes < 1:
		return nil, fmt.Errorf("need at least 2 agents and one with home devices (--agents %d, --spare-agents %d)", cfg.Agents, cfg.Spare)
	case cfg.Devsims < 1 || cfg.Devices%nd != 0:
		return nil, fmt.Errorf("--devices %d does not split evenly over %d devsim processes (%d home agents × --devsims %d)", cfg.Devices, nd, p.homes, cfg.Devsims)
	}
	p.home, p.backup = make([][]string, cfg.Agents), make([][]string, cfg.Agents)
	per := cfg.Devices / nd
	for k := range nd {
		h := k / cfg.Devsims
		var ids []string
		for j := range per {
			id := fmt.Sprintf("d%d-%d", k, j+1) // devsim --count --id-prefix d<k>-
			ids = append(ids, id)
			p.home[h] = append(p.home[h], id)
			i := len(p.home[h]) - 1
			b := (h + 1 + i%(cfg.Agents-1)) % cfg.Agents
			if cfg.Spare > 0 {
				b = p.homes + i%cfg.Spare
			}
			p.backup[b] = append(p.backup[b], id)
		}
		p.devsims = append(p.devsims, ids)
	}
	return p, nil
}

// clusterEnv is what one cluster run has running.
type clusterEnv struct {
	cfg     clusterConfig
	plan    *clusterPlan
	etcd    *sandbox.EtcdProcCluster
	cli     *clientv3.Client
	broker  *broker
	prefix  string // the agents' etcd prefix
	agents  []*clusterAgent
	devsims []*sandbox.Proc
	trust   *clusterTrust // --sign; nil: unsigned
}

type clusterResult struct {
	Cfg      clusterConfig
	Built    string
	Version  string
	Load     string
	Held     time.Duration // the home agents' start → all devices held (agents' status)
	HeldEtcd time.Duration // → every lock key written with its holder (etcd)
	RevHeld  int64         // revisions the first acquisitions consumed
	Queued   time.Duration // the backups' campaigns all queued (the restarts included)
	Steady   clusterSteady
	Trials   []clusterTrial
}

func runCluster(ctx context.Context, cfg clusterConfig) (res *clusterResult, err error) {
	res = &clusterResult{Cfg: cfg}
	plan, err := newClusterPlan(cfg)
	if err != nil {
		return nil, err
	}
	if cfg.ProfDir != "" && cfg.AgentBin == "" {
		if cfg.AgentBin, err = buildBinary(ctx, cfg.Dir, "edgefence", cfg.Log, "edgefence_pprof"); err != nil {
			return nil, err
		}
	}
	built, err := buildMissing(ctx, cfg.Dir, cfg.Log, benchBin{"edgefence", &cfg.AgentBin}, benchBin{"edgefence-devsim", &cfg.DevsimBin})
	if err != nil {
		return nil, err
	}
	res.Built = cmp.Or(built, "binaries given with --agent-bin/--devsim-bin")
	e := &clusterEnv{cfg: cfg, plan: plan, prefix: fmt.Sprintf("/bench/cluster-%d", time.Now().UnixNano())}
	defer e.close()
	if err := e.start(ctx); err != nil {
		return res, err
	}
	if v, err := e.etcd.Version(); err == nil {
		res.Version = v
	}
	if err := e.acquire(ctx, res); err != nil {
		return res, err
	}
	if err := e.queueBackups(ctx, res); err != nil {
		return res, err
	}
	if res.Steady, err = e.steady(ctx); err != nil {
		return res, err
	}
	fmt.Fprintf(cfg.Log, "cluster: steady: %s\n", res.Steady.line())
	kinds := make([]bool, cfg.Trials)
	if cfg.LeaderKill > 0 && cfg.EtcdNodes >= 3 {
		kinds = append(kinds, true)
	}
	var errs []error
	for i, leader := range kinds {
		tr, err := e.takeover(ctx, i+1, leader)
		if err != nil {
			// Said in the table; the next takeover starts from whatever
			// the cluster settles to (restartDead, waitQueued).
			tr.Err = err.Error()
			errs = append(errs, fmt.Errorf("takeover %d: %w", i+1, err))
			fmt.Fprintf(cfg.Log, "cluster: takeover %d: %v\n", i+1, err)
		}
		res.Trials = append(res.Trials, tr)
		if ctx.Err() != nil {
			break
		}
	}
	return res, errors.Join(errs...)
}

// start starts etcd, the broker and the devsim processes.
func (e *clusterEnv) start(ctx context.Context) error {
	dir := filepath.Join(e.cfg.Dir, "cluster")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	var err error
	fmt.Fprintf(e.cfg.Log, "cluster: etcd, %d members (separate processes)\n", e.cfg.EtcdNodes)
	if e.etcd, err = sandbox.StartEtcdProcCluster(ctx, sandbox.EtcdProcClusterConfig{Dir: filepath.Join(dir, "etcd"), Members: e.cfg.EtcdNodes, Args: e.cfg.EtcdArgs}); err != nil {
		return err
	}
	if e.cli, err = e.etcd.Client(); err != nil {
		return err
	}
	if e.broker, err = startBroker(ctx, brokerMochi, dir); err != nil {
		return err
	}
	if e.cfg.Sign {
		fmt.Fprintf(e.cfg.Log, "cluster: signed: enrolling %d devices, their certificates in etcd\n", e.cfg.Devices)
		if e.trust, err = newClusterTrust(ctx, dir, e.etcd.Endpoints(), e.prefix, slices.Concat(e.plan.devsims...)); err != nil {
			return err
		}
	}
	fmt.Fprintf(e.cfg.Log, "cluster: %d devsim processes, %d devices\n", len(e.plan.devsims), e.cfg.Devices)
	for k, ids := range e.plan.devsims {
		args := append([]string{"--mqtt", e.broker.url, "--prefix", clusterMQTTPrefix, "--count", fmt.Sprint(len(ids)), "--id-prefix", fmt.Sprintf("d%d-", k),
			"--dir", filepath.Join(dir, fmt.Sprintf("devsim-%d", k)), "--log", filepath.Join(dir, fmt.Sprintf("verdicts-%d.jsonl", k)),
			"--client-id", fmt.Sprintf("bench-cluster-devsim-%d", k), "--lanes", fmt.Sprint(e.cfg.Lanes)}, e.trust.devsimArgs()...)
		p, err := sandbox.StartProc(fmt.Sprintf("devsim-%d", k), filepath.Join(dir, fmt.Sprintf("devsim-%d.log", k)), nil, e.cfg.DevsimBin, args...)
		if err != nil {
			return err
		}
		e.devsims = append(e.devsims, p)
	}
	for _, p := range e.devsims {
		if err := awaitCtx(ctx, 120*time.Second, func(ctx context.Context) error { return p.WaitLine(ctx, "ready") }); err != nil {
			return err
		}
	}
	return nil
}

const clusterMQTTPrefix = "cluster"

func (e *clusterEnv) close() {
	for _, a := range e.agents {
		a.stop()
	}
	for _, p := range e.devsims {
		_ = p.Stop(10 * time.Second)
	}
	if e.broker != nil {
		e.broker.stop()
	}
	if e.cli != nil {
		e.cli.Close()
	}
	e.etcd.Close()
}

// acquire starts the home agents with their home devices only and waits
// until they hold them all.
func (e *clusterEnv) acquire(ctx context.Context, res *clusterResult) error {
	rev0, err := e.revision(ctx)
	if err != nil {
		return err
	}
	e.agents = make([]*clusterAgent, e.cfg.Agents)
	t0 := time.Now()
	for i := range e.plan.homes {
		if e.agents[i], err = e.startAgent(i, e.plan.home[i]); err != nil {
			return err
		}
	}
	fmt.Fprintf(e.cfg.Log, "cluster: %d home agents started, %d devices each\n", e.plan.homes, len(e.plan.home[0]))
	deadline := t0.Add(max(300*time.Second, time.Duration(e.cfg.Devices)*10*time.Millisecond))
	for {
		// Counted first (cheap), then read (100,000 keys are megabytes).
		n, err := e.lockKeys(ctx)
		var owners map[string]string
		if err == nil && n >= e.cfg.Devices {
			owners, err = e.owners(ctx, "")
		}
		if err == nil && len(owners) == e.cfg.Devices {
			res.HeldEtcd = time.Since(t0)
			break
		}
		if err := e.agentsAlive(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not all %d devices held after %v: %d (%v)", e.cfg.Devices, time.Since(t0), len(owners), err)
		}
		if !sleepCtx(ctx, time.Second) {
			return ctx.Err()
		}
	}
	rev1, err := e.revision(ctx)
	if err != nil {
		return err
	}
	res.RevHeld = rev1 - rev0
	for i := range e.plan.homes {
		ts, _, err := e.agents[i].holdingSince(ctx, nil)
		if err != nil {
			return err
		}
		if len(ts) != len(e.plan.home[i]) {
			return fmt.Errorf("%s holds %d of its %d home devices", e.agents[i].name, len(ts), len(e.plan.home[i]))
		}
		for _, t := range ts {
			res.Held = max(res.Held, t.Sub(t0))
		}
	}
	fmt.Fprintf(e.cfg.Log, "cluster: all %d held: %s ms (agents' status), %s ms (etcd); %d revisions\n", e.cfg.Devices, ms(res.Held), ms(res.HeldEtcd), res.RevHeld)
	return nil
}

// queueBackups gives every agent its backups: a home agent is killed
// (SIGKILL) and started again at once with its home and backup devices —
// its next run re-attaches the lease its lock keys live under, so it keeps
// its devices — and a spare agent starts with its backups. It waits until
// every device has two lock keys: its holder's and its backup's.
func (e *clusterEnv) queueBackups(ctx context.Context, res *clusterResult) error {
	t0 := time.Now()
	for i := range e.cfg.Agents {
		devs := append(append([]string(nil), e.plan.home[i]...), e.plan.backup[i]...)
		if a := e.agents[i]; a != nil {
			if err := a.kill(); err != nil {
				return err
			}
		}
		var err error
		if e.agents[i], err = e.startAgent(i, devs); err != nil {
			return err
		}
		// The restarted agent re-attaches before the next is killed.
		if err := e.agents[i].waitSession(ctx, 60*time.Second); err != nil {
			return err
		}
	}
	if err := e.waitQueued(ctx); err != nil {
		return err
	}
	res.Queued = time.Since(t0)
	fmt.Fprintf(e.cfg.Log, "cluster: backups queued after %s ms\n", ms(res.Queued))
	return nil
}

// waitQueued waits until every device has two lock keys and is held in an
// agent (status), every agent running.
func (e *clusterEnv) waitQueued(ctx context.Context) error {
	deadline := time.Now().Add(max(300*time.Second, time.Duration(e.cfg.Devices)*10*time.Millisecond))
	for {
		n, err := e.lockKeys(ctx)
		if err == nil && n == 2*e.cfg.Devices {
			// Every key is there; and every device held in an agent (a
			// restarted agent's campaigns for the devices it re-attached
			// are still writing until then).
			var held int
			if held, err = e.heldInAgents(ctx); err == nil && held == e.cfg.Devices {
				return nil
			}
		}
		if err := e.agentsAlive(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("backups not queued: %d lock keys of %d (%v)", n, 2*e.cfg.Devices, err)
		}
		if !sleepCtx(ctx, 500*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// heldInAgents returns how many devices the running agents hold (their
// status).
func (e *clusterEnv) heldInAgents(ctx context.Context) (int, error) {
	n := 0
	for _, a := range e.agents {
		if a == nil || a.exited() {
			continue
		}
		ts, _, err := a.holdingSince(ctx, nil)
		if err != nil {
			return n, err
		}
		n += len(ts)
	}
	return n, nil
}

func (e *clusterEnv) agentsAlive() error {
	var errs []error
	for _, a := range e.agents {
		if a != nil && a.exited() {
			errs = append(errs, fmt.Errorf("%s exited (log %s)", a.name, a.log))
		}
	}
	return errors.Join(errs...)
}

// revision returns etcd's current revision.
func (e *clusterEnv) revision(ctx context.Context) (int64, error) {
	r, err := e.cli.Get(ctx, "bench-revision")
	if err != nil {
		return 0, err
	}
	return r.Header.Revision, nil
}

// lockKeys counts the keys under the agents' devices prefix: their lock
// keys (holders' and waiters'), the only keys there with twins off and no
// firmware job.
func (e *clusterEnv) lockKeys(ctx context.Context) (int, error) {
	r, err := e.cli.Get(ctx, e.prefix+"/devices/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, err
	}
	return int(r.Count), nil
}

// owners returns device → holder (the gateway written into its lock key
// by the holder when it takes its turn: agent/turn.go) for every device whose lock is
// held, read in one range from etcd; only devices under sub (a device id
// prefix) if not empty.
func (e *clusterEnv) owners(ctx context.Context, sub string) (map[string]string, error) {
	r, err := e.cli.Get(ctx, e.prefix+"/devices/"+sub, clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	type first struct {
		rev   int64
		owner string
	}
	low := map[string]first{}
	for _, kv := range r.Kvs {
		dev, ok := lockDevice(e.prefix, string(kv.Key))
		if !ok {
			continue
		}
		if f, seen := low[dev]; !seen || kv.CreateRevision < f.rev {
			low[dev] = first{kv.CreateRevision, string(kv.Value)}
		}
	}
	out := make(map[string]string, len(low))
	for d, f := range low {
		if f.owner != "" { // "": a key whose holder has not read its token yet
			out[d] = f.owner
		}
	}
	return out, nil
}

// lockDevice returns the device of a lock key prefix/devices/<id>/lock/<lease>.
func lockDevice(prefix, key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, prefix+"/devices/")
	if !ok {
		return "", false
	}
	dev, tail, ok := strings.Cut(rest, "/")
	if !ok || !strings.HasPrefix(tail, "lock/") {
		return "", false
	}
	return dev, true
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
