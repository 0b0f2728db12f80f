package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/internal/sandbox"
)

// Fault modes of the failover benchmark (--faults).
const (
	faultKill = "kill" // SIGKILL: the holder is gone
	faultStop = "stop" // SIGSTOP: the holder is frozen, then resumed
	faultTerm = "term" // SIGTERM: a clean shutdown, the holder releases its locks
)

// failoverConfig configures the failover benchmark.
type failoverConfig struct {
	Devices   int
	TTLs      []time.Duration // lease_ttl of both agents, one series each
	Trials    int             // per TTL and fault
	Faults    []string        // faultKill, faultStop
	Interval  time.Duration   // the load loop's period per device
	Probes    int             // the load goes to this many devices, spread over the list (0: all)
	AgentBin  string          // empty: build ./cmd/edgefence
	DevsimBin string          // empty: build ./cmd/edgefence-devsim
	Dir       string
	Log       io.Writer
}

// failoverTrial is one fault and what followed it; times are from the fault.
type failoverTrial struct {
	TTL        time.Duration
	Fault      string
	FaultAfter time.Duration // the fault came this long after A was started (its lease granted a few ms after)
	First      time.Duration // the first device to get an accepted command from B
	All        time.Duration // the last one (max over devices)
	Held       time.Duration // B held the last device (its status: holding since), max over devices
	Refused    int           // B's answers "not the holder" (HTTP 409) to the load, before it took over
	Late       string        // faultStop: what became of A's commands once resumed
	LateOK     bool          // every late command of A was refused
	LateA      int           // late commands A itself refused (409: it knew it had lost the lock)
	LateDev    int           // late commands the fence point refused (stale)
	Attempts   int           // load commands sent to B in all
	Exit       time.Duration // faultTerm: A's process exited
}

type failoverResult struct {
	Devices  int
	Probes   int
	Interval time.Duration
	Built    string
	Trials   []failoverTrial
}

func runFailover(ctx context.Context, etcd *sandbox.Etcd, cfg failoverConfig) (*failoverResult, error) {
	built, err := buildMissing(ctx, cfg.Dir, cfg.Log, benchBin{"edgefence", &cfg.AgentBin}, benchBin{"edgefence-devsim", &cfg.DevsimBin})
	if err != nil {
		return nil, err
	}
	res := &failoverResult{Devices: cfg.Devices, Probes: len(probeDevices(cfg.Devices, cfg.Probes)), Interval: cfg.Interval,
		Built: cmp.Or(built, "binaries given with --agent-bin/--devsim-bin")}
	br, err := startBroker(ctx, brokerMochi, cfg.Dir)
	if err != nil {
		return nil, err
	}
	defer br.stop()
	devs := make([]string, cfg.Devices)
	for i := range devs {
		devs[i] = fmt.Sprintf("fo-%d", i+1)
	}
	dir := filepath.Join(cfg.Dir, "failover")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	// One device simulator for every trial: each trial's tokens (etcd
	// revisions) are higher than the last one's, so its fence points stay
	// valid across trials.
	const mqttPrefix = "failover"
	devsim, err := sandbox.StartProc("devsim", filepath.Join(dir, "devsim.log"), nil, cfg.DevsimBin,
		"--mqtt", br.url, "--prefix", mqttPrefix, "--devices", strings.Join(devs, ","), "--dir", filepath.Join(dir, "devices"),
		"--log", filepath.Join(dir, "verdicts.jsonl"), "--client-id", "bench-failover-devsim")
	if err != nil {
		return nil, err
	}
	defer func() { _ = devsim.Stop(10 * time.Second) }()
	if err := awaitCtx(ctx, 30*time.Second, func(ctx context.Context) error { return devsim.WaitLine(ctx, "ready") }); err != nil {
		return nil, err
	}
	n := 0
	for _, ttl := range cfg.TTLs {
		for _, fault := range cfg.Faults {
			for k := range cfg.Trials {
				n++
				fmt.Fprintf(cfg.Log, "failover: lease_ttl %v, %s, trial %d/%d\n", ttl, fault, k+1, cfg.Trials)
				tr, err := failoverTrialRun(ctx, etcd, br.url, mqttPrefix, devs, ttl, fault, filepath.Join(dir, fmt.Sprintf("t%02d", n)), cfg)
				if err != nil {
					return res, fmt.Errorf("failover, lease_ttl %v, %s, trial %d: %w", ttl, fault, k+1, err)
				}
				fmt.Fprintf(cfg.Log, "failover: B holds all after %s ms; first device accepted %s ms, all %s ms (target ≤ %s ms); A exited %s ms %s\n",
					ms(tr.Held), ms(tr.First), ms(tr.All), ms(failoverTarget(fault, ttl)), ms(tr.Exit), tr.Late)
				res.Trials = append(res.Trials, tr)
			}
		}
	}
	return res, nil
}

// failoverAgent is one `edgefence run` subprocess and its API.
type failoverAgent struct {
	proc *sandbox.Proc
	api  *agent.APIClient
}

func startFailoverAgent(ctx context.Context, name, dir, etcdURL, brokerURL, mqttPrefix, etcdPrefix string, devs []string, ttl time.Duration, bin string) (*failoverAgent, error) {
	c := sandbox.AgentConfig{Gateway: name, Etcd: etcdURL, MQTT: brokerURL, Devices: devs,
		Socket: filepath.Join(dir, name+".sock"), StateDir: filepath.Join(dir, name+"-state"),
		EtcdPrefix: etcdPrefix, MQTTPrefix: mqttPrefix, ClientID: "bench-" + name + "-" + filepath.Base(dir),
		LeaseTTL: ttl, LogLevel: "info", LogFormat: "text"}
	cpath := filepath.Join(dir, name+".yaml")
	if err := c.Write(cpath); err != nil {
		return nil, err
	}
	p, err := sandbox.StartProc(name, filepath.Join(dir, name+".log"), nil, bin, "run", "--config", cpath)
	if err != nil {
		return nil, err
	}
	return &failoverAgent{proc: p, api: agent.NewAPIClient(c.Socket)}, nil
}

// waitStates polls the agent's status until every device is in state.
func (a *failoverAgent) waitStates(ctx context.Context, state string, n int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		st, err := a.api.Status(ctx)
		if err == nil && st.Etcd.Session {
			k := 0
			for _, d := range st.Devices {
				if d.State == state {
					k++
				}
			}
			if k == n {
				return nil
			}
		}
		select {
		case <-a.proc.Done():
			return fmt.Errorf("%s exited while waiting for %s", a.proc.Name, state)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not all %d devices %s after %v (status err %v)", a.proc.Name, n, state, limit, err)
		}
	}
}

// failoverTrialRun is one trial: agent A holds devs, B campaigns for them
// under load, then A meets fault; it times B's takeover from the fault.
func failoverTrialRun(ctx context.Context, etcd *sandbox.Etcd, brokerURL, mqttPrefix string, devs []string, ttl time.Duration, fault, dir string, cfg failoverConfig) (tr failoverTrial, err error) {
	tr = failoverTrial{TTL: ttl, Fault: fault}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return tr, err
	}
	prefix := fmt.Sprintf("/bench/failover-%d", time.Now().UnixNano())
	aStart := time.Now()
	a, err := startFailoverAgent(ctx, "gw-a", dir, etcd.Endpoint(), brokerURL, mqttPrefix, prefix, devs, ttl, cfg.AgentBin)
	if err != nil {
		return tr, err
	}
	defer func() { _ = a.proc.Stop(10 * time.Second) }()
	if err := a.waitStates(ctx, agent.StateHolding, len(devs), 30*time.Second); err != nil {
		return tr, err
	}
	// A's first command per device, so that the fence points know A's
	// token before B's arrive.
	if err := sendEach(ctx, a.api, devs, 8); err != nil {
		return tr, fmt.Errorf("first commands of agent A: %w", err)
	}
	b, err := startFailoverAgent(ctx, "gw-b", dir, etcd.Endpoint(), brokerURL, mqttPrefix, prefix, devs, ttl, cfg.AgentBin)
	if err != nil {
		return tr, err
	}
	defer func() { _ = b.proc.Stop(10 * time.Second) }()
	if err := b.waitStates(ctx, agent.StateCampaigning, len(devs), 30*time.Second); err != nil {
		return tr, err
	}

	// The load: one loop per device sends through B every Interval until
	// B accepts one; B answers 409 (not the holder) until it takes over.
	lctx, lcancel := context.WithTimeout(ctx, ttl+30*time.Second+time.Duration(len(devs))*time.Second)
	defer lcancel()
	probes := probeDevices(len(devs), cfg.Probes)
	outs := make([]failoverOutcome, len(probes))
	var wg sync.WaitGroup
	for i, di := range probes {
		wg.Go(func() { outs[i] = probeUntilAccepted(lctx, b.api, devs[di], cfg.Interval) })
	}
	// Let the load run against the healthy holder first.
	time.Sleep(200 * time.Millisecond)
	fault0 := time.Now()
	tr.FaultAfter = fault0.Sub(aStart)
	exited, err := injectFailoverFault(a, fault)
	if exited != nil {
		defer func() { tr.Exit = (<-exited).Sub(fault0) }()
	}
	if err != nil {
		lcancel()
		wg.Wait()
		return tr, err
	}
	wg.Wait()
	errs := tr.count(outs, fault0)
	if st, err := b.api.Status(ctx); err == nil {
		for _, d := range st.Devices {
			if d.State == agent.StateHolding {
				tr.Held = max(tr.Held, d.Since.Sub(fault0))
			}
		}
	}
	if tr.Refused == 0 {
		errs = append(errs, errors.New("agent B never answered 409 before the fault: the load did not start in time"))
	}
	if fault == faultStop {
		tr.Late, tr.LateOK, tr.LateA, tr.LateDev = lateCommands(ctx, a, devs)
	}
	if err := errors.Join(errs...); err != nil {
		return tr, fmt.Errorf("%w (logs in %s)", err, dir)
	}
	return tr, nil
}

// failoverOutcome is what became of the load on one device: when B
// accepted a command, after how many attempts and refusals (409).
type failoverOutcome struct {
	at       time.Time
	refused  int
	attempts int
	err      error
}

// probeUntilAccepted sends a command to device d through api every
// interval until one is accepted; "not the holder" answers are counted,
// anything else, and ctx ending, is the outcome's error.
func probeUntilAccepted(ctx context.Context, api *agent.APIClient, d string, interval time.Duration) (o failoverOutcome) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		o.attempts++
		r, err := api.Send(ctx, d, sim.KindSet, json.RawMessage(`{"setpoint": 25}`))
		switch {
		case r != nil && r.Verdict == "accepted":
			o.at = time.Now()
			return o
		case r != nil && r.Verdict == "" && strings.Contains(r.Error, agent.ErrNotHolder.Error()):
			o.refused++
		case ctx.Err() != nil:
			o.err = fmt.Errorf("%s: no command accepted by B in time: %w", d, ctx.Err())
			return o
		default:
			// A verdict other than accepted, or no answer: report it
			// rather than hide it in the figure.
			o.err = fmt.Errorf("%s: B answered %+v, err %v", d, r, err)
			return o
		}
		select {
		case <-t.C:
		case <-ctx.Done():
		}
	}
}

// injectFailoverFault does fault to agent A. For faultTerm, exited
// receives the time A's process exited.
func injectFailoverFault(a *failoverAgent, fault string) (exited <-chan time.Time, err error) {
	switch fault {
	case faultKill:
		return nil, a.proc.Kill()
	case faultStop:
		return nil, a.proc.Freeze()
	case faultTerm:
		// Stop sends SIGCONT (a no-op here) and SIGTERM, and waits.
		ch := make(chan time.Time, 1)
		go func() {
			_ = a.proc.Stop(10 * time.Second)
			ch <- time.Now()
		}()
		return ch, nil
	}
	return nil, fmt.Errorf("unknown fault %q", fault)
}

// count adds the load's outcomes to tr: refusals, attempts, and the first
// and last device accepted after fault0. It returns the outcomes' errors.
func (tr *failoverTrial) count(outs []failoverOutcome, fault0 time.Time) []error {
	var errs []error
	for i, o := range outs {
		tr.Refused += o.refused
		tr.Attempts += o.attempts
		if o.err != nil {
			errs = append(errs, o.err)
			continue
		}
		d := o.at.Sub(fault0)
		if i == 0 || d < tr.First {
			tr.First = d
		}
		tr.All = max(tr.All, d)
	}
	return errs
}

// lateCommands resumes the frozen A and sends one command per device
// through it: each must be refused, by A itself (409, it knows it lost the
// lock) or by the fence point (stale).
func lateCommands(ctx context.Context, a *failoverAgent, devs []string) (what string, ok bool, byA, byDevice int) {
	if err := a.proc.Resume(); err != nil {
		return "resume: " + err.Error(), false, 0, 0
	}
	var notHolder, stale, other int
	var bad []string
	for _, d := range devs {
		r, err := a.api.Send(ctx, d, sim.KindSet, json.RawMessage(`{"setpoint": 99}`))
		switch {
		case r != nil && r.Verdict == "stale":
			stale++
		case r != nil && r.Verdict == "" && strings.Contains(r.Error, agent.ErrNotHolder.Error()):
			notHolder++
		default:
			other++
			bad = append(bad, fmt.Sprintf("%s: %+v %v", d, r, err))
		}
	}
	what = fmt.Sprintf("A resumed: %d refused by A (409), %d stale at the device", notHolder, stale)
	if other > 0 {
		what += fmt.Sprintf(", %d NOT refused: %s", other, strings.Join(bad, "; "))
	}
	return what, other == 0, notHolder, stale
}

// probeDevices returns the indices of p of n devices, spread evenly over
// the list from the first to the last (all n if p is 0 or at least n).
func probeDevices(n, p int) []int {
	if p <= 0 || p >= n {
		p = n
	}
	out := make([]int, p)
	for i := range out {
		if p == 1 {
			break
		}
		out[i] = i * (n - 1) / (p - 1)
	}
	return out
}

// failoverTarget is the target for fault → B's commands accepted:
// a lease TTL and a second when the holder dies or freezes, a second after
// a clean shutdown (it releases its locks).
func failoverTarget(fault string, ttl time.Duration) time.Duration {
	if fault == faultTerm {
		return time.Second
	}
	return ttl + time.Second
}

func printFailover(w io.Writer, r *failoverResult) {
	fmt.Fprintf(w, "### Failover: `edgefence run` ×2 over %d devices, holder killed, frozen or stopped (load every %v on each of %d devices; %s)\n\n",
		r.Devices, r.Interval, r.Probes, r.Built)
	fmt.Fprintf(w, "Fault → B's first accepted command (the ack in the client's hand): for the first of the %d loaded devices, and for all of them (the last); B holds all %d: B's status.\n", r.Probes, r.Devices)
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| lease_ttl | fault | trials | fault after A started, median ms | B holds all, median ms | first device median ms | all devices median ms | all devices max ms | trials, all devices ms | A exited median / max ms | target | met (max) |")
	fmt.Fprintln(w, "|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---|")
	type key struct {
		ttl   time.Duration
		fault string
	}
	var keys []key
	groups := map[key][]failoverTrial{}
	for _, t := range r.Trials {
		k := key{t.TTL, t.Fault}
		if _, ok := groups[k]; !ok {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], t)
	}
	var late, firstLines []string
	for _, k := range keys {
		ts := groups[k]
		var each []string
		var fs, as, hs, fa, ex []time.Duration
		var n, byA, byDev int
		var notRefused []string
		for _, t := range ts {
			fs, as, hs, fa = append(fs, t.First), append(as, t.All), append(hs, t.Held), append(fa, t.FaultAfter)
			each = append(each, ms(t.All))
			if t.Fault == faultTerm {
				ex = append(ex, t.Exit)
			}
			if t.Fault == faultStop {
				n, byA, byDev = n+1, byA+t.LateA, byDev+t.LateDev
				if !t.LateOK {
					notRefused = append(notRefused, t.Late)
				}
			}
		}
		if n > 0 {
			l := fmt.Sprintf("lease_ttl %v, %s: A resumed after B took over, %d trials: %d late commands refused by A itself (409, it knew it had lost the lock), %d refused stale by the fence point",
				k.ttl, k.fault, n, byA, byDev)
			if len(notRefused) > 0 {
				l += "; **NOT refused**: " + strings.Join(notRefused, "; ")
			}
			late = append(late, l)
		}
		target := failoverTarget(k.fault, k.ttl)
		// kill/stop: every device back within T + 1 s; term: the standby's
		// first accepted command within 1 s.
		judged := slicesMax(as)
		if k.fault == faultTerm {
			judged = slicesMax(fs)
		}
		exited := "–"
		if len(ex) > 0 {
			exited = ms(median(ex)) + " / " + ms(slicesMax(ex))
		}
		fmt.Fprintf(w, "| %v | %s | %d | %s | %s | %s | %s | %s | %s | %s | ≤ %s | **%s** |\n", k.ttl, k.fault, len(ts), ms(median(fa)), ms(median(hs)), ms(median(fs)), ms(median(as)),
			ms(slicesMax(as)), strings.Join(each, ", "), exited, ms(target), metOrNot(judged <= target))
		if k.fault == faultTerm {
			firstLines = append(firstLines, fmt.Sprintf("lease_ttl %v, term: the standby's first accepted command after SIGTERM to the holder, over %d trials: median %s ms, max %s ms (%s); target ≤ %s ms on the first command: **%s**",
				k.ttl, len(ts), ms(median(fs)), ms(slicesMax(fs)), joinMs(fs), ms(target), metOrNot(slicesMax(fs) <= target)))
		}
	}
	fmt.Fprintln(w)
	for _, l := range append(firstLines, late...) {
		fmt.Fprintf(w, "- %s\n", l)
	}
	if len(late)+len(firstLines) > 0 {
		fmt.Fprintln(w)
	}
}

func joinMs(ds []time.Duration) string {
	var s []string
	for _, d := range ds {
		s = append(s, ms(d))
	}
	return strings.Join(s, ", ")
}
