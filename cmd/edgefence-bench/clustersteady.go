package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"
)

// clusterSteady is the cluster at rest: every device held and backed up,
// no commands.
type clusterSteady struct {
	Window    time.Duration
	Keys      int                // lock keys (holders' and waiters')
	Requests  map[string]float64 // etcd gRPC messages received per second, by method, summed over members
	Members   []clusterMember
	AgentCPU  float64 // % of one core, all agents together
	AgentRSS  int64   // KiB, all agents together
	AgentMax  int64   // KiB, the largest agent
	DevsimRSS int64   // KiB, all devsim processes together
}

type clusterMember struct {
	Leader          bool
	DBSize, DBInUse int64
	RSS             int64   // KiB
	CPU             float64 // % of one core over the window
}

// total is every request per second.
func (s clusterSteady) total() float64 {
	t := 0.0
	for _, v := range s.Requests {
		t += v
	}
	return t
}

func (s clusterSteady) line() string {
	return fmt.Sprintf("%d lock keys, etcd %.0f requests/s (%s), agents %.1f %% of a core, %.0f MiB", s.Keys, s.total(), fmtRates(s.Requests), s.AgentCPU, float64(s.AgentRSS)/1024)
}

func fmtRates(m map[string]float64) string {
	var out []string
	for _, k := range sortedKeys(m) {
		if m[k] >= 0.05 {
			out = append(out, fmt.Sprintf("%s %.1f", k, m[k]))
		}
	}
	return strings.Join(out, ", ")
}

// steady measures the cluster at rest over cfg.Steady.
func (e *clusterEnv) steady(ctx context.Context) (clusterSteady, error) {
	s := clusterSteady{Window: e.cfg.Steady, Requests: map[string]float64{}}
	var err error
	if s.Keys, err = e.lockKeys(ctx); err != nil {
		return s, err
	}
	if !sleepCtx(ctx, 3*time.Second) { // the last campaigns' aftermath
		return s, ctx.Err()
	}
	before, err := e.etcdMessages(ctx)
	if err != nil {
		return s, err
	}
	pids := e.memberPids()
	cpu0, agent0, t0 := pidsCPU(pids), e.agentsCPU(), time.Now()
	if !sleepCtx(ctx, e.cfg.Steady) {
		return s, ctx.Err()
	}
	after, err := e.etcdMessages(ctx)
	if err != nil {
		return s, err
	}
	secs := time.Since(t0).Seconds()
	cpu1 := pidsCPU(pids)
	s.AgentCPU = 100 * (e.agentsCPU() - agent0).Seconds() / secs
	for k, v := range after {
		s.Requests[k] = (v - before[k]) / secs
	}
	for i, st := range e.etcd.Status(ctx, e.cli) {
		m := clusterMember{Leader: st.Leader, DBSize: st.DBSize, DBInUse: st.DBInUse, CPU: 100 * (cpu1[i] - cpu0[i]).Seconds() / secs}
		if pm, err := readProcMem(pids[i]); err == nil {
			m.RSS = pm.VmRSS
		}
		s.Members = append(s.Members, m)
	}
	for _, a := range e.agents {
		if pm, err := readProcMem(a.proc.pid); err == nil {
			s.AgentRSS += pm.VmRSS
			s.AgentMax = max(s.AgentMax, pm.VmRSS)
		}
	}
	for _, p := range e.devsims {
		if pm, err := readProcMem(p.Pid()); err == nil {
			s.DevsimRSS += pm.VmRSS
		}
	}
	return s, nil
}

func (e *clusterEnv) memberPids() []int {
	pids := make([]int, e.etcd.Members())
	for i := range pids {
		pids[i] = e.etcd.Pid(i)
	}
	return pids
}

func pidsCPU(pids []int) []time.Duration {
	out := make([]time.Duration, len(pids))
	for i, p := range pids {
		out[i] = readProcCPU(p)
	}
	return out
}

func (e *clusterEnv) agentsCPU() time.Duration {
	var t time.Duration
	for _, a := range e.agents {
		t += readProcCPU(a.proc.pid)
	}
	return t
}

// etcdMessages sums grpc_server_msg_received_total by grpc_method over
// every live member's /metrics.
func (e *clusterEnv) etcdMessages(ctx context.Context) (map[string]float64, error) {
	out := map[string]float64{}
	for i, ep := range e.etcd.Endpoints() {
		if e.etcd.Pid(i) == 0 {
			continue
		}
		if err := addMethodCounts(ctx, ep+"/metrics", "grpc_server_msg_received_total", out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// addMethodCounts adds the samples of metric in a Prometheus text
// exposition at url to out, by their grpc_method label.
func addMethodCounts(ctx context.Context, url, metric string, out map[string]float64) error {
	all, err := fetchMetrics(ctx, url)
	if err != nil {
		return err
	}
	for series, v := range all {
		if !strings.HasPrefix(series, metric+"{") {
			continue
		}
		if _, rest, ok := strings.Cut(series, `grpc_method="`); ok {
			method, _, _ := strings.Cut(rest, `"`)
			out[method] += v
		}
	}
	return nil
}

func printCluster(w io.Writer, r *clusterResult) {
	c := r.Cfg
	etcdArgs := ""
	if len(c.EtcdArgs) > 0 {
		etcdArgs = " `" + strings.Join(c.EtcdArgs, " ") + "`"
	}
	signed := "unsigned"
	if c.Sign {
		signed = "signed"
	}
	fmt.Fprintf(w, "### Cluster: %d devices over %d agents on a %d-node etcd %s%s, lease_ttl %v, %s (%s)\n\n", c.Devices, c.Agents, c.EtcdNodes, r.Version, etcdArgs, c.TTL, signed, r.Built)
	if c.Sign {
		fmt.Fprintln(w, "Signed (I7): each agent signs with a gateway key certified by the root, its devices `auth: required`; each device has a key, its certificate in etcd (the agents read it at the device's first ack). The devsims have the root and their device keys only: an agent's certificate reaches a device in the trust update it publishes (retained) before its first command to it, in the takeover's time.")
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "Separate processes: %d etcd members, %d `edgefence run`, %d `edgefence-devsim` of %d lanes each (each device's mark fsynced before its ack; commands reaching different lanes together share the fsync); mochi in the bench process. Each device on two agents: home and backup (%d spare agents).\n\n",
		c.EtcdNodes, c.Agents, (c.Agents-c.Spare)*c.Devsims, c.Lanes, c.Spare)
	fmt.Fprintf(w, "- all held: %s ms from the home agents' start (their status), %s ms (every lock key written, etcd); %d revisions = %.2f per lock\n",
		ms(r.Held), ms(r.HeldEtcd), r.RevHeld, float64(r.RevHeld)/float64(c.Devices))
	fmt.Fprintf(w, "- backups queued (home agents restarted with their backups, re-attaching their lease): %s ms\n", ms(r.Queued))
	s := r.Steady
	fmt.Fprintf(w, "- at rest over %v, %d lock keys: etcd %.1f requests/s (%s); agents %.2f %% of a core together, RSS %.0f MiB together (largest %.0f MiB); devsims %.0f MiB\n",
		s.Window, s.Keys, s.total(), fmtRates(s.Requests), s.AgentCPU, float64(s.AgentRSS)/1024, float64(s.AgentMax)/1024, float64(s.DevsimRSS)/1024)
	for i, m := range s.Members {
		perKey := 0.0
		if s.Keys > 0 {
			perKey = float64(m.DBInUse) / float64(s.Keys)
		}
		fmt.Fprintf(w, "- etcd member %d%s: DB %.1f MiB (in use %.1f MiB, %.0f B per lock key), RSS %.0f MiB, CPU %.2f %% of a core\n",
			i, map[bool]string{true: " (leader)"}[m.Leader], float64(m.DBSize)/(1<<20), float64(m.DBInUse)/(1<<20), perKey, float64(m.RSS)/1024, m.CPU)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| trial | killed | devices | etcd leader killed | lease expired ms | held, etcd ms | held, agents ms (p10 / p50 / p90) | target held | first accepted ms | all accepted ms | target accepted | refusals / fan-outs | other | revisions (per device) | sessions lost by the others | takers |")
	fmt.Fprintln(w, "|---:|---|---:|---|---:|---:|---:|---|---:|---:|---|---:|---|---:|---:|---|")
	for _, t := range r.Trials {
		lead := "no"
		if t.Leader {
			lead = fmt.Sprintf("member %d, %s ms after", t.LeaderWas, ms(t.LeaderAt))
		}
		var takers []string
		for _, g := range sortedKeys(t.Takers) {
			takers = append(takers, fmt.Sprintf("%s %d", g, t.Takers[g]))
		}
		ok := t.Err == ""
		fmt.Fprintf(w, "| %d | %s | %d | %s | %s | %s | %s (%s / %s / %s) | ≤ %s: **%s** | %s | %s | ≤ %s: **%s** | %d / %d | %v | %d (%.2f) | %d | %s |\n", t.N, t.Victim, t.Devices, lead,
			ms(t.Expired), ms(t.HeldEtcd), ms(t.HeldAgent), ms(t.HeldQ[0]), ms(t.HeldQ[1]), ms(t.HeldQ[2]), ms(t.TargetHeld), metOrNot(ok && t.HeldAgent <= t.TargetHeld), ms(t.First), ms(t.Accepted), ms(t.TargetAcc),
			metOrNot(ok && t.Accepted > 0 && t.Accepted <= t.TargetAcc), t.Refused, t.Fanouts, t.Other, t.Revisions, float64(t.Revisions)/float64(max(t.Devices, 1)), t.Sessions, strings.Join(takers, ", "))
	}
	fmt.Fprintln(w)
	for _, t := range r.Trials {
		if c.Sign {
			fmt.Fprintf(w, "- takeover %d, signed: the takers sent %d plain envelopes and resent %d commands after a trust update\n", t.N, t.Unsigned, t.TrustResent)
		}
		if t.Err != "" {
			fmt.Fprintf(w, "- takeover %d: **%s**\n", t.N, t.Err)
		}
	}
	fmt.Fprintln(w)
}
