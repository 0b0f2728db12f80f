package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/internal/backoff"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/transport/modbus"
)

// Node names of the partition scenario's network lab.
const (
	nodeServer = "srv" // etcd, broker, device simulator
	nodeA      = "gwa"
	nodeB      = "gwb"
)

// agentProc is one `edgefence run` of the round.
type agentProc struct {
	name, node string
	cfgPath    string
	sock       string
	stateDir   string
	hist       string
	env        []string
	api        *agent.APIClient

	mu   sync.Mutex
	proc *sandbox.Proc
	runs int
}

func (a *agentProc) current() *sandbox.Proc {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.proc
}

// round is one run of one scenario.
type round struct {
	cfg Config
	sc  string
	rnd *rand.Rand
	res *Result

	etcd    *sandbox.Etcd
	cluster *sandbox.EtcdCluster
	broker  *sandbox.Broker
	dup     *sandbox.Duplicator
	lab     *sandbox.NetLab
	netsb   *sandbox.NetSandbox
	etcdURL string // comma-separated endpoints
	mqttURL string
	auth    *sandbox.BrokerAuth // the broker's users: gw-a, gw-b, devsim
	acl     string              // and its rules

	shimDevs   []string
	serialDevs []string
	lines      []*sandbox.NoisyLine
	legacy     []*sandbox.Proc

	devsimMu   sync.Mutex
	devsim     *sandbox.Proc
	devsimRuns int
	// devsimClientID is the device simulator's MQTT client id; a new one
	// is a fresh session at the broker (device-offline-at-acquisition).
	devsimClientID string

	agents []*agentProc
	trust  *roundTrust // nil: Config.Unsigned

	faultMu sync.Mutex
	sends   atomic.Int64
	closers []func()
}

func (r *round) path(name string) string { return filepath.Join(r.cfg.Dir, name) }

func (r *round) logf(format string, args ...any) {
	r.cfg.Logger.Info(fmt.Sprintf(format, args...), "scenario", r.sc)
}

func (r *round) fault(kind string) {
	r.faultMu.Lock()
	r.res.Faults[kind]++
	r.faultMu.Unlock()
}

// jitter returns a random duration in [lo, hi).
func (r *round) jitter(lo, hi time.Duration) time.Duration {
	r.faultMu.Lock()
	defer r.faultMu.Unlock()
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(r.rnd.Int64N(int64(hi-lo)))
}

func (r *round) outage(lo, hi time.Duration) time.Duration {
	if r.cfg.Outage > 0 {
		return r.cfg.Outage
	}
	return r.jitter(lo, hi)
}

// Run runs one round of scenario (one of Scenarios) and returns what it
// found. An error means the round could not run to its end (a process did
// not start, the commands did not settle); violations of the invariants
// are in Result.Report, not errors.
func Run(ctx context.Context, cfg Config, scenario string) (*Result, error) {
	cfg.defaults()
	if cfg.Bin == "" || cfg.Dir == "" {
		return nil, errors.New("chaos: Bin and Dir are required")
	}
	known := false
	for _, s := range Scenarios() {
		known = known || s == scenario
	}
	if !known {
		return nil, fmt.Errorf("chaos: unknown scenario %q (have %s)", scenario, strings.Join(Scenarios(), ", "))
	}
	if cfg.Unsigned && slices.Contains(signedOnly, scenario) {
		return nil, fmt.Errorf("chaos: scenario %s needs a signed round", scenario)
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	if scenario == FaultSerialNoise || scenario == FaultKillBridge {
		cfg.Serial = max(cfg.Serial, 2)
	}
	r := &round{cfg: cfg, sc: scenario, devsimClientID: "devsim-chaos", rnd: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		res: &Result{Scenario: scenario, Seed: cfg.Seed, Faults: map[string]int{}, Signed: !cfg.Unsigned}}
	start := time.Now()
	defer r.close()
	err := r.run(ctx)
	r.res.Elapsed = time.Since(start)
	if err != nil {
		return r.res, fmt.Errorf("chaos: %s (seed %d, dir %s): %w", scenario, cfg.Seed, cfg.Dir, err)
	}
	return r.res, nil
}

func (r *round) close() {
	for i := len(r.closers) - 1; i >= 0; i-- {
		r.closers[i]()
	}
}

func (r *round) run(ctx context.Context) error {
	if err := r.startInfra(ctx); err != nil {
		return err
	}
	if err := r.startTrust(ctx); err != nil {
		return err
	}
	if err := r.agedEtcd(ctx); err != nil {
		return err
	}
	if r.sc == FaultFirmware {
		return r.runFirmware(ctx)
	}
	if err := r.startDevices(ctx); err != nil {
		return err
	}
	if err := r.startAgents(ctx); err != nil {
		return err
	}
	if err := r.waitAllHeld(ctx, 60*time.Second); err != nil {
		return err
	}
	r.logf("every device held; load for %v with fault %s", r.cfg.Load, r.sc)

	loadStart := time.Now()
	lctx, stopLoad := context.WithCancel(ctx)
	var load sync.WaitGroup
	for _, d := range r.shimDevs {
		load.Add(1)
		go func() { defer load.Done(); r.load(lctx, d, false) }()
	}
	for _, d := range r.serialDevs {
		load.Add(1)
		go func() { defer load.Done(); r.load(lctx, d, true) }()
	}
	ferr := r.inject(ctx)
	// Commands keep flowing for the whole load window, also after the
	// fault healed.
	if rest := r.cfg.Load - time.Since(loadStart); rest > 0 {
		backoff.Sleep(ctx, rest)
	}
	stopLoad()
	load.Wait()
	if ferr != nil {
		return fmt.Errorf("inject %s: %w", r.sc, ferr)
	}
	live := r.checkLiveness(ctx)
	if err := r.drain(ctx, 120*time.Second+r.cfg.Outage); err != nil {
		return err
	}
	if err := r.collect(ctx); err != nil {
		return err
	}
	r.res.Report.Violations = append(append(r.res.Report.Violations, live...), r.checkTrustDelivered()...)
	return nil
}

// brokerAuth is the round's broker users and rules (deploy/mosquitto's):
// gateways gw-a and gw-b (gw-b the home of the serial devices), devsim,
// serving the shim devices d1..dN, and the operator's read-only login.
func (r *round) brokerAuth() error {
	const p = "edgefence/v1"
	var shim, serial []string
	for i := range r.cfg.Devices {
		shim = append(shim, fmt.Sprintf("d%d", i+1))
	}
	for i := range r.cfg.Serial {
		serial = append(serial, fmt.Sprintf("s%d", i+1))
	}
	r.acl = sandbox.GatewayACL(p, "gw-a") + sandbox.GatewayACL(p, "gw-b", serial...) + sandbox.FleetACL(p, "devsim", shim...) +
		sandbox.ObserverACL(p, "operator")
	auth, err := sandbox.NewBrokerAuth(r.acl)
	if err != nil {
		return err
	}
	for _, u := range []string{"gw-a", "gw-b", "devsim", "operator"} {
		if _, err := auth.User(u); err != nil {
			return err
		}
	}
	r.auth = auth
	return nil
}

// mqttEnv is the environment holding user's broker password, which the
// agent and devsim read.
func (r *round) mqttEnv(user string) []string {
	p, _ := r.auth.User(user) // every user exists: brokerAuth
	return []string{"EDGEFENCE_MQTT_PASSWORD=" + p}
}

func (r *round) startInfra(ctx context.Context) error {
	if err := r.brokerAuth(); err != nil {
		return err
	}
	switch r.sc {
	case FaultPartition:
		lab, err := sandbox.StartNetLab(nodeServer, nodeA, nodeB)
		if err != nil {
			return err
		}
		r.lab = lab
		r.closers = append(r.closers, func() { lab.Close() })
		users, acl := r.path("mqtt-users"), r.path("mqtt.acl")
		if err := r.auth.WritePasswords(users); err != nil {
			return err
		}
		if err := os.WriteFile(acl, []byte(r.acl), 0o644); err != nil {
			return err
		}
		sb, err := lab.StartSandbox(ctx, nodeServer, sandbox.NetSandboxConfig{Bin: filepath.Join(r.cfg.Bin, "edgefence-sandbox"),
			Dir: r.path("sandbox"), Fast: true, MQTTUsers: users, MQTTACL: acl})
		if err != nil {
			return err
		}
		r.netsb = sb
		r.closers = append(r.closers, func() { _ = sb.Stop(10 * time.Second) })
		r.etcdURL, r.mqttURL = sb.Etcd, sb.MQTT
		return nil
	case FaultLeaderLoss:
		c, err := sandbox.StartEtcdCluster(ctx, sandbox.EtcdClusterConfig{Size: 3, Dir: r.path("etcd"), Fast: true})
		if err != nil {
			return err
		}
		r.cluster = c
		r.closers = append(r.closers, func() { c.Close() })
		r.etcdURL = strings.Join(c.Endpoints(), ",")
	default:
		e, err := sandbox.StartEtcd(ctx, sandbox.EtcdConfig{Dir: r.path("etcd"), Fast: true})
		if err != nil {
			return err
		}
		r.etcd = e
		r.closers = append(r.closers, func() { e.Close() })
		r.etcdURL = e.Endpoint()
	}
	bc := sandbox.BrokerConfig{Auth: r.auth}
	if r.sc == FaultDuplicate {
		r.dup = sandbox.NewDuplicator(sandbox.DuplicateConfig{Probability: 0.3, Topics: []string{"edgefence/v1/dev/+/cmd"},
			Delay: r.jitter(0, 30*time.Millisecond), Seed: r.cfg.Seed + 1})
		bc.Setup = r.dup.Attach
	}
	b, err := sandbox.StartBroker(bc)
	if err != nil {
		return err
	}
	r.broker = b
	r.closers = append(r.closers, func() { b.Close() })
	r.mqttURL = b.URL()
	return nil
}

// command returns the argv to run bin in node (directly when there is no
// lab).
func (r *round) command(node, bin string, args ...string) (string, []string) {
	if r.lab == nil {
		return bin, args
	}
	return sandbox.NetLabIP, r.lab.ExecArgs(node, bin, args...)
}

// startTrust names the round's shim devices and provisions and publishes
// its trust chain (none with Config.Unsigned).
func (r *round) startTrust(ctx context.Context) error {
	for i := range r.cfg.Devices {
		r.shimDevs = append(r.shimDevs, fmt.Sprintf("d%d", i+1))
	}
	devices := slices.Clone(r.shimDevs)
	if r.sc != FaultFirmware {
		for i := range r.cfg.Serial {
			devices = append(devices, fmt.Sprintf("s%d", i+1))
		}
	}
	if err := r.provisionTrust(devices, r.shimDevs); err != nil {
		return err
	}
	return r.publishDeviceCerts(ctx, r.shimDevs)
}

func (r *round) startDevices(ctx context.Context) error {
	if err := r.startDevsim(ctx); err != nil {
		return err
	}
	for i := range r.cfg.Serial {
		id := fmt.Sprintf("s%d", i+1)
		line, err := sandbox.NewNoisyLine(sandbox.NoisyLineConfig{Seed: r.cfg.Seed + uint64(i) + 7})
		if err != nil {
			return err
		}
		r.closers = append(r.closers, func() { line.Close() })
		p, err := sandbox.StartProc("legacy-"+id, r.path("legacy-"+id+".log"), nil, filepath.Join(r.cfg.Bin, "edgefence-devsim"),
			"--serial", line.B, "--devices", id, "--log", r.path("applied-"+id+".jsonl"))
		if err != nil {
			return err
		}
		r.closers = append(r.closers, func() { _ = p.Stop(5 * time.Second) })
		if err := awaitReady(ctx, p); err != nil {
			return err
		}
		r.serialDevs = append(r.serialDevs, id)
		r.lines = append(r.lines, line)
		r.legacy = append(r.legacy, p)
	}
	return nil
}

func (r *round) startDevsim(ctx context.Context) error {
	r.devsimMu.Lock()
	defer r.devsimMu.Unlock()
	r.devsimRuns++
	dev := filepath.Join(r.cfg.Bin, "edgefence-devsim")
	if r.cfg.CDeviceBin != "" {
		dev = r.cfg.CDeviceBin
	}
	args := append([]string{"--mqtt", r.mqttURL, "--devices", strings.Join(r.shimDevs, ","), "--dir", r.path("devices"),
		"--log", r.path("verdicts.jsonl"), "--client-id", r.devsimClientID, "--mqtt-user", "devsim",
		"--history", r.path("hist-devsim.jsonl"), "--history-source", "shim"}, r.trust.devsimArgs()...)
	bin, args := r.command(nodeServer, dev, args...)
	p, err := sandbox.StartProc(fmt.Sprintf("devsim#%d", r.devsimRuns), r.path(fmt.Sprintf("devsim-%d.log", r.devsimRuns)), r.mqttEnv("devsim"), bin, args...)
	if err != nil {
		return err
	}
	r.devsim = p
	if r.devsimRuns == 1 {
		r.closers = append(r.closers, func() {
			r.devsimMu.Lock()
			defer r.devsimMu.Unlock()
			_ = r.devsim.Stop(10 * time.Second)
		})
	}
	return awaitReady(ctx, p)
}

// readyWithin bounds the wait for a started device process's ready line: a
// process that never gets ready fails the round, naming its log, instead
// of holding it until the suite's timeout.
const readyWithin = 60 * time.Second

func awaitReady(ctx context.Context, p *sandbox.Proc) error {
	wctx, cancel := context.WithTimeout(ctx, readyWithin)
	defer cancel()
	if err := p.WaitLine(wctx, "ready"); err != nil {
		return fmt.Errorf("not ready within %v: %w", readyWithin, err)
	}
	return nil
}

// agentConfig writes gw's config: every device, half of the shim devices
// autonomous, the serial devices wired to gw-b; signed (its auth block), or
// in an unsigned round every device `auth: off`.
func (r *round) agentConfig(gw string) (string, error) {
	off := ""
	if r.trust == nil {
		off = "    auth: off\n"
	}
	var devs strings.Builder
	for i, d := range r.shimDevs {
		policy := agent.PolicyStrict
		if i%2 == 1 {
			policy = agent.PolicyAutonomous
		}
		fmt.Fprintf(&devs, "  - id: %s\n    policy: %s\n%s", d, policy, off)
	}
	for i, d := range r.serialDevs {
		fmt.Fprintf(&devs, "  - id: %s\n    fence: gateway\n    home: gw-b\n%s", d, off)
		if gw == "gw-b" {
			fmt.Fprintf(&devs, "    serial:\n      port: %s\n", r.lines[i].A)
		}
	}
	conf := fmt.Sprintf(`gateway: %s
state_dir: %s
etcd:
  endpoints: [%s]
  lease_ttl: %s
  dial_timeout: 2s
mqtt:
  brokers: [%s]
  client_id: %s-chaos
  username: %s
  keep_alive: 2s
api:
  socket: %s
command:
  timeout: 3s
log:
  level: info
  format: json
%sdevices:
%s`, gw, r.path(gw+"-state"), r.etcdURL, r.cfg.TTL, r.mqttURL, gw, gw, r.path(gw+".sock"), r.trust.authYAML(gw), devs.String())
	p := r.path(gw + ".yaml")
	return p, os.WriteFile(p, []byte(conf), 0o644)
}

func (r *round) startAgent(ctx context.Context, name, node string) (*agentProc, error) {
	cpath, err := r.agentConfig(name)
	if err != nil {
		return nil, err
	}
	a := &agentProc{name: name, node: node, cfgPath: cpath, sock: r.path(name + ".sock"), stateDir: r.path(name + "-state"),
		hist: r.path("hist-" + name + ".jsonl"), env: append(r.mqttEnv(name), "EDGEFENCE_HISTORY="+r.path("hist-bridge-"+name+".jsonl"))}
	a.api = agent.NewAPIClient(a.sock)
	if err := r.runAgent(ctx, a); err != nil {
		return nil, err
	}
	r.closers = append(r.closers, func() {
		if p := a.current(); p != nil {
			_ = p.Stop(10 * time.Second)
		}
	})
	return a, nil
}

// runAgent starts (or restarts) a's process and waits for its session.
func (r *round) runAgent(ctx context.Context, a *agentProc) error {
	a.mu.Lock()
	a.runs++
	n := a.runs
	a.mu.Unlock()
	bin, args := r.command(a.node, filepath.Join(r.cfg.Bin, "edgefence"), "run", "--config", a.cfgPath, "--history", a.hist)
	p, err := sandbox.StartProc(fmt.Sprintf("%s#%d", a.name, n), r.path(fmt.Sprintf("%s-%d.log", a.name, n)), a.env, bin, args...)
	if err != nil {
		return err
	}
	a.mu.Lock()
	a.proc = p
	a.mu.Unlock()
	// A restart within the lease TTL re-attaches to the killed run's
	// lease; later it opens a new one: either way its status says the
	// session is up. Bounded, so that an agent that never gets a session
	// fails the round instead of hanging it.
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		if st, err := r.status(wctx, a); err == nil && st.Etcd.Session {
			return nil
		}
		select {
		case <-wctx.Done():
			return fmt.Errorf("%s: no etcd session: %w", a.name, wctx.Err())
		case <-p.Done():
			return fmt.Errorf("%s exited", a.name)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// status asks a for its status, briefly.
func (r *round) status(ctx context.Context, a *agentProc) (*agent.Status, error) {
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return a.api.Status(sctx)
}

// holders maps each device to the agents holding it now.
func (r *round) holders(ctx context.Context) map[string][]*agentProc {
	m := map[string][]*agentProc{}
	for _, a := range r.agents {
		st, err := r.status(ctx, a)
		if err != nil {
			continue
		}
		for _, d := range st.Devices {
			if d.State == agent.StateHolding {
				m[d.ID] = append(m[d.ID], a)
			}
		}
	}
	return m
}

func (r *round) waitAllHeld(ctx context.Context, bound time.Duration) error {
	deadline := time.Now().Add(bound)
	for {
		h := r.holders(ctx)
		if len(h) == len(r.shimDevs)+len(r.serialDevs) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("devices not all held after %v: %d of %d", bound, len(h), len(r.shimDevs)+len(r.serialDevs))
		}
		if !backoff.Sleep(ctx, 50*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// load sends commands to dev until ctx ends, through whichever agent
// takes them (the other answers "not the holder").
func (r *round) load(ctx context.Context, dev string, serial bool) {
	n := 0
	for ctx.Err() == nil {
		n++
		// Setpoints stay in the simulated thermostat's range, except one
		// command in 50, which the device refuses as invalid.
		sp := n % 150
		if n%50 == 0 {
			sp = 999
		}
		kind, body := "set", json.RawMessage(fmt.Sprintf(`{"setpoint": %d}`, sp))
		if serial {
			kind, body = modbus.KindWriteRegister, json.RawMessage(fmt.Sprintf(`{"addr": 0, "value": %d}`, n%65536))
		}
		first := int(r.jitter(0, time.Duration(len(r.agents))))
		for i := range r.agents {
			a := r.agents[(first+i)%len(r.agents)]
			sctx, cancel := context.WithTimeout(ctx, 4*time.Second)
			res, err := a.api.Send(sctx, dev, kind, body)
			cancel()
			if res != nil && res.Error != "" && strings.Contains(res.Error, agent.ErrNotHolder.Error()) {
				continue // the other agent may hold it
			}
			if err == nil || res != nil {
				r.sends.Add(1)
			}
			break
		}
		if !backoff.Sleep(ctx, r.cfg.Pause) {
			return
		}
	}
}

// drain waits until no agent has a command without a terminal state, and
// no new command has been created for a while: a request the load gave up
// on may still be appending on the agent's side.
func (r *round) drain(ctx context.Context, bound time.Duration) error {
	deadline := time.Now().Add(bound)
	lastQueued, quietSince := uint64(0), time.Time{}
	for {
		pending, unreachable := 0, 0
		var queued uint64
		for _, a := range r.agents {
			st, err := r.status(ctx, a)
			if err != nil {
				unreachable++
				continue
			}
			queued += st.Counters.Queued
			for _, d := range st.Devices {
				pending += d.Queued
			}
		}
		if queued != lastQueued || pending != 0 || unreachable != 0 {
			lastQueued, quietSince = queued, time.Time{}
		} else if quietSince.IsZero() {
			quietSince = time.Now()
		}
		if !quietSince.IsZero() && time.Since(quietSince) >= 500*time.Millisecond {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("commands still queued after %v: %d pending, %d agents unreachable", bound, pending, unreachable)
		}
		if !backoff.Sleep(ctx, 100*time.Millisecond) {
			return ctx.Err()
		}
	}
}
