package main

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgefence/edgefence/agent"
)

// clusterTrial is one takeover: an agent killed (SIGKILL), times from the
// kill.
type clusterTrial struct {
	N          int
	Victim     string
	Devices    int              // the devices it held: taken over
	Takers     map[string]int   // gateway → devices it took
	Leader     bool             // the etcd leader was killed too
	LeaderAt   time.Duration    // ... this long after the agent
	LeaderWas  int              // its index
	Expired    time.Duration    // the first of the victim's lock keys deleted: its lease's expiry (etcd watch, at this process)
	HeldEtcd   time.Duration    // the last lock key written by its new holder (etcd watch, at this process)
	HeldAgent  time.Duration    // the last device held in its new agent (status: holding since)
	HeldQ      [3]time.Duration // 10th, 50th and 90th percentiles of the same
	First      time.Duration    // the first device that accepted a command from its new holder
	Accepted   time.Duration    // the last one
	Refused    int              // per-device refusals of the fan-outs (held in etcd, not yet in the agent)
	Fanouts    int              // fan-out requests sent
	Other      map[string]int   // outcomes other than accepted and refused
	Revisions  int64            // etcd revisions from the kill to the last accepted
	KilledPid  int
	TargetHeld time.Duration // TTL + 2 s
	TargetAcc  time.Duration // TTL + 4 s
	Sessions   uint64        // etcd sessions the other agents opened during the takeover: each one lost all it held
	// Unsigned and TrustResent are the other agents' sends of plain
	// envelopes and their resends after a fence point lacked their trust
	// update, during the takeover (/metrics).
	Unsigned, TrustResent uint64
	Err                   string // what went wrong, if something did
}

// takeLimit is how long past the TTL (and the leader kill) a takeover may
// take before the trial gives up on the devices not yet accepted.
const takeLimit = 300 * time.Second

// takeover runs trial n: every agent running and queued, the agent holding
// the most devices is killed; with leader, the etcd leader too, LeaderKill
// later. As each device's lock key gets its new holder (an etcd watch),
// the device is handed to that agent's sender, which sends it a command
// in a fan-out with the others handed to it meanwhile, until accepted.
func (e *clusterEnv) takeover(ctx context.Context, n int, leader bool) (clusterTrial, error) {
	tr := clusterTrial{N: n, Leader: leader, LeaderWas: -1, TargetHeld: e.cfg.TTL + 2*time.Second, TargetAcc: e.cfg.TTL + 4*time.Second,
		Takers: map[string]int{}, Other: map[string]int{}}
	if err := e.restartDead(ctx); err != nil {
		return tr, err
	}
	owners, err := e.owners(ctx, "")
	if err != nil {
		return tr, err
	}
	victim := e.mostHolding(owners)
	va := e.agents[victim]
	set := map[string]bool{}
	for d, o := range owners {
		if o == va.name {
			set[d] = true
		}
	}
	tr.Victim, tr.Devices, tr.KilledPid = va.name, len(set), va.proc.pid
	if leader {
		if tr.LeaderWas, err = e.etcd.Leader(ctx, e.cli); err != nil {
			return tr, err
		}
	}
	fmt.Fprintf(e.cfg.Log, "cluster: takeover %d: killing %s holding %d devices%s\n", n, va.name, len(set), map[bool]string{true: ", then the etcd leader", false: ""}[leader])
	rev0, err := e.revision(ctx)
	if err != nil {
		return tr, err
	}
	sess0 := map[string]uint64{}
	for i, a := range e.agents {
		if i != victim {
			sess0[a.name] = a.sessions(ctx)
		}
	}
	tctx, cancel := context.WithTimeout(ctx, e.cfg.TTL+e.cfg.LeaderKill+takeLimit)
	defer cancel()
	col := newTakeCollector(set)
	senders := e.startSenders(tctx, victim, col)
	watched := make(chan struct{})
	go func() { defer close(watched); e.watchHolders(tctx, rev0, set, va.name, senders, col) }()
	profiled := e.profileTakers(ctx, n, victim) // ctx: it outlasts the takeover
	count0 := e.takerCounters(ctx, victim)
	t0 := time.Now()
	if err := va.kill(); err != nil {
		return tr, err
	}
	leaderAt := make(chan time.Duration, 1)
	if leader {
		go func() { leaderAt <- e.killLeaderAfter(tctx, tr.LeaderWas, t0) }()
	} else {
		leaderAt <- 0
	}
	select {
	case <-col.all:
	case <-tctx.Done():
	}
	cancel()
	senders.wait()
	<-watched
	profiled()
	tr.LeaderAt = <-leaderAt
	count1 := e.takerCounters(ctx, victim)
	tr.Unsigned, tr.TrustResent = uint64(count1[0]-count0[0]), uint64(count1[1]-count0[1])
	return tr, e.trialFigures(ctx, &tr, col, set, t0, rev0, sess0)
}

// trialFigures fills tr from the collector, the agents' status and etcd.
func (e *clusterEnv) trialFigures(ctx context.Context, tr *clusterTrial, col *takeCollector, set map[string]bool, t0 time.Time, rev0 int64, sess0 map[string]uint64) error {
	col.mu.Lock()
	tr.Refused, tr.Fanouts = col.refused, col.fanouts
	if !col.expired.IsZero() {
		tr.Expired = col.expired.Sub(t0)
	}
	maps.Copy(tr.Other, col.other)
	accepted := len(col.accepted)
	for _, at := range col.accepted {
		tr.Accepted = max(tr.Accepted, at.Sub(t0))
		if tr.First == 0 || at.Sub(t0) < tr.First {
			tr.First = at.Sub(t0)
		}
	}
	for _, at := range col.held {
		tr.HeldEtcd = max(tr.HeldEtcd, at.Sub(t0))
	}
	for _, g := range col.taker {
		tr.Takers[g]++
	}
	col.mu.Unlock()
	if rev, err := e.revision(ctx); err == nil {
		tr.Revisions = rev - rev0
	}
	var since []time.Duration
	for _, a := range e.agents {
		if a.exited() {
			continue
		}
		ts, n, err := a.holdingSince(ctx, set)
		if err != nil {
			return err
		}
		if before, ok := sess0[a.name]; ok && n > before {
			tr.Sessions += n - before
		}
		for _, t := range ts {
			since = append(since, t.Sub(t0))
		}
	}
	held := len(since)
	if held > 0 {
		slices.Sort(since)
		tr.HeldAgent = since[held-1]
		tr.HeldQ = [3]time.Duration{since[held/10], since[held/2], since[held*9/10]}
	}
	fmt.Fprintf(e.cfg.Log, "cluster: takeover %d: %d devices: lease expired %s ms, held %s ms (etcd) %s ms (agents; p10/p50/p90 %s/%s/%s ms), accepted first %s ms, all %s ms; %d refusals, %d fan-outs, other %v, %d revisions, %d sessions lost by the others\n",
		tr.N, tr.Devices, ms(tr.Expired), ms(tr.HeldEtcd), ms(tr.HeldAgent), ms(tr.HeldQ[0]), ms(tr.HeldQ[1]), ms(tr.HeldQ[2]), ms(tr.First), ms(tr.Accepted), tr.Refused, tr.Fanouts, tr.Other, tr.Revisions, tr.Sessions)
	if accepted != len(set) || held != len(set) {
		return fmt.Errorf("of %d devices, %d accepted a command and %d are held after the takeover", len(set), accepted, held)
	}
	return nil
}

// takerCounters are the counters read from the takers around a takeover:
// sends of plain envelopes, resends after a trust update.
var takerCounters = []string{"edgefence_commands_unsigned_total", "edgefence_commands_resent_after_trust_total"}

// takerCounters sums takerCounters over the running agents but victim
// (an agent whose metrics do not answer counts 0).
func (e *clusterEnv) takerCounters(ctx context.Context, victim int) []float64 {
	sum := make([]float64, len(takerCounters))
	for i, a := range e.agents {
		if i == victim || a.exited() {
			continue
		}
		m, err := scrapeMetrics(ctx, "http://"+a.metrics+"/metrics", takerCounters...)
		if err != nil {
			fmt.Fprintf(e.cfg.Log, "cluster: metrics of %s: %v\n", a.name, err)
			continue
		}
		for j, name := range takerCounters {
			sum[j] += m[name]
		}
	}
	return sum
}

// mostHolding returns the index of the running agent that holds the most
// devices in owners (the lowest index on a tie).
func (e *clusterEnv) mostHolding(owners map[string]string) int {
	count := map[string]int{}
	for _, o := range owners {
		count[o]++
	}
	best := 0
	for i, a := range e.agents {
		if count[a.name] > count[e.agents[best].name] {
			best = i
		}
	}
	return best
}

// restartDead starts the agents a takeover killed again, with all their
// devices, and waits until every backup is queued.
func (e *clusterEnv) restartDead(ctx context.Context) error {
	for i, a := range e.agents {
		if !a.exited() {
			continue
		}
		devs := append(append([]string(nil), e.plan.home[i]...), e.plan.backup[i]...)
		var err error
		if e.agents[i], err = e.startAgent(i, devs); err != nil {
			return err
		}
	}
	return e.waitQueued(ctx)
}

// killLeaderAfter kills etcd member leader at t0 + cfg.LeaderKill and
// returns when, after t0 (0 if ctx ended first).
func (e *clusterEnv) killLeaderAfter(ctx context.Context, leader int, t0 time.Time) time.Duration {
	if !sleepCtx(ctx, time.Until(t0.Add(e.cfg.LeaderKill))) {
		return 0
	}
	at := time.Since(t0)
	if err := e.etcd.Kill(leader); err != nil {
		fmt.Fprintln(e.cfg.Log, "cluster: kill the etcd leader:", err)
		return 0
	}
	fmt.Fprintf(e.cfg.Log, "cluster: etcd member %d (leader) killed %s ms after the agent\n", leader, ms(at))
	return at
}

// watchHolders hands each device of set whose lock key gets a new holder
// (its value, the gateway, written when it takes its turn: agent/turn.go) to that holder's sender,
// watching from rev0+1 until ctx ends (again from the last revision seen
// if the watch ends early).
func (e *clusterEnv) watchHolders(ctx context.Context, rev0 int64, set map[string]bool, victim string, senders *takeSenders, col *takeCollector) {
	last := rev0
	for ctx.Err() == nil {
		wch := e.cli.Watch(ctx, e.prefix+"/devices/", clientv3.WithPrefix(), clientv3.WithRev(last+1))
		last = e.watchOnce(wch, last, set, victim, senders, col)
		sleepCtx(ctx, 50*time.Millisecond)
	}
}

// watchOnce reads wch until it closes and returns the last revision seen.
func (e *clusterEnv) watchOnce(wch clientv3.WatchChan, last int64, set map[string]bool, victim string, senders *takeSenders, col *takeCollector) int64 {
	for wr := range wch {
		now := time.Now()
		if wr.Err() != nil {
			fmt.Fprintln(e.cfg.Log, "cluster: watch:", wr.Err())
			continue
		}
		for _, ev := range wr.Events {
			last = max(last, ev.Kv.ModRevision)
		}
		for _, ev := range wr.Events {
			if ev.Type == clientv3.EventTypeDelete {
				if dev, ok := lockDevice(e.prefix, string(ev.Kv.Key)); ok && set[dev] {
					col.expiredAt(now)
				}
			}
			if ev.Type != clientv3.EventTypePut || len(ev.Kv.Value) == 0 {
				continue
			}
			dev, ok := lockDevice(e.prefix, string(ev.Kv.Key))
			gw := string(ev.Kv.Value)
			if !ok || !set[dev] || gw == victim {
				continue
			}
			if col.heldAt(dev, gw, now) {
				senders.hand(gw, dev)
			}
		}
	}
	return last
}

// takeCollector gathers a takeover's per-device times.
type takeCollector struct {
	want     int
	mu       sync.Mutex
	expired  time.Time            // the first delete of a taken device's lock key
	held     map[string]time.Time // lock key written by the new holder
	taker    map[string]string
	accepted map[string]time.Time
	refused  int
	fanouts  int
	other    map[string]int
	all      chan struct{}
}

func newTakeCollector(set map[string]bool) *takeCollector {
	return &takeCollector{want: len(set), held: map[string]time.Time{}, taker: map[string]string{}, accepted: map[string]time.Time{},
		other: map[string]int{}, all: make(chan struct{})}
}

// expiredAt records t as the lease's expiry unless one was recorded.
func (c *takeCollector) expiredAt(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.expired.IsZero() {
		c.expired = t
	}
}

// heldAt records dev held by gw at t (the first time only) and whether
// gw is a new taker of dev: the first, or another after the first lost it.
func (c *takeCollector) heldAt(dev, gw string, t time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.held[dev]; !ok {
		c.held[dev] = t
	}
	if c.taker[dev] == gw {
		return false
	}
	c.taker[dev] = gw
	return true
}

// takenBy reports whether gw is dev's latest taker.
func (c *takeCollector) takenBy(dev, gw string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.taker[dev] == gw
}

func (c *takeCollector) acceptedAt(dev string, t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.accepted[dev]; ok {
		return
	}
	c.accepted[dev] = t
	if len(c.accepted) == c.want {
		close(c.all)
	}
}

// takeSenders are the survivors' senders, by gateway.
type takeSenders struct {
	by map[string]chan string
	wg sync.WaitGroup
}

func (s *takeSenders) hand(gw, dev string) {
	if ch, ok := s.by[gw]; ok {
		select {
		case ch <- dev:
		default: // more hand-overs than 4 a device: the takers keep losing it
		}
	}
}

func (s *takeSenders) wait() { s.wg.Wait() }

// startSenders starts one sender per agent but the victim.
func (e *clusterEnv) startSenders(ctx context.Context, victim int, col *takeCollector) *takeSenders {
	s := &takeSenders{by: map[string]chan string{}}
	for i, a := range e.agents {
		if i == victim {
			continue
		}
		ch := make(chan string, 4*col.want) // a device may be handed again (its taker lost it)
		s.by[a.name] = ch
		s.wg.Go(func() { sendTaken(ctx, a.name, a.api, ch, col) })
	}
	return s
}

// takeFanouts is how many fan-outs a sender keeps in flight: a device
// handed on while they run waits for the next free one, not for the
// verdicts of every device before it.
const takeFanouts = 4

// sendTaken sends the devices handed on in to their new holder gw, api:
// a fan-out with every device handed meanwhile, up to takeFanouts at once.
func sendTaken(ctx context.Context, gw string, api *agent.APIClient, in chan string, col *takeCollector) {
	slots := make(chan struct{}, takeFanouts)
	var wg sync.WaitGroup
	defer wg.Wait()
	var pending []string
	for {
		if len(pending) == 0 {
			select {
			case d := <-in:
				pending = append(pending, d)
			case <-ctx.Done():
				return
			}
		}
		select {
		case slots <- struct{}{}:
		case d := <-in:
			pending = append(pending, d)
			continue
		case <-ctx.Done():
			return
		}
	drain:
		for {
			select {
			case d := <-in:
				pending = append(pending, d)
			default:
				break drain
			}
		}
		batch := pending
		pending = nil
		wg.Go(func() {
			defer func() { <-slots }()
			fanTaken(ctx, gw, api, batch, col)
		})
	}
}

// fanTaken sends batch to gw in a fan-out; a device the agent refuses (it
// does not hold it yet: the lock key is written before its token is
// recorded) goes in the next, unless another agent took it since.
// Fan-outs in which nothing was accepted back off (20 ms, doubling to 1 s).
func fanTaken(ctx context.Context, gw string, api *agent.APIClient, batch []string, col *takeCollector) {
	idle := 20 * time.Millisecond
	for len(batch) > 0 && ctx.Err() == nil {
		var retry []string
		accepted := 0
		_, err := api.FanOut(ctx, agent.FanoutRequest{Selection: agent.Selection{Devices: batch}, Kind: "ping"}, func(ev agent.FanoutEvent) {
			r := ev.Result
			if r == nil {
				return
			}
			switch o := r.Outcome(); o {
			case "accepted", "duplicate": // duplicate: applied once, a resend's ack came first
				accepted++
				col.acceptedAt(r.Device, time.Now())
				if o == "duplicate" {
					col.count(o)
				}
			case "refused", "expired", "unknown", "queued":
				if col.takenBy(r.Device, gw) {
					retry = append(retry, r.Device)
				}
				col.count(o)
			default:
				col.count(o)
			}
		})
		col.count("fanout")
		if err != nil {
			retry = batch // the request failed as a whole: try them all again
			col.count("fan-out failed")
		}
		batch = retry
		if accepted > 0 {
			idle = 20 * time.Millisecond
		}
		if len(batch) > 0 {
			if !sleepCtx(ctx, idle) {
				return
			}
			if accepted == 0 {
				idle = min(2*idle, time.Second)
			}
		}
	}
}

func (c *takeCollector) count(outcome string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch outcome {
	case "fanout":
		c.fanouts++
	case "refused":
		c.refused++
	default:
		c.other[outcome]++
	}
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}

// profileTakers, with cfg.ProfDir and for the first takeover only, writes
// every running agent's heap and goroutine profiles (before the kill) and
// starts a CPU profile of each agent but the victim for TTL + 5 s; the
// function it returns waits for those (or ctx's end).
func (e *clusterEnv) profileTakers(ctx context.Context, n, victim int) (wait func()) {
	if e.cfg.ProfDir == "" || n != 1 {
		return func() {}
	}
	var wg sync.WaitGroup
	for i, a := range e.agents {
		if a.exited() {
			continue
		}
		base := filepath.Join(e.cfg.ProfDir, "cluster-"+a.name)
		for _, kind := range []string{"heap", "goroutine"} {
			if err := fetchTo(ctx, "http://"+a.metrics+"/debug/pprof/"+kind, base+"-"+kind+".pprof"); err != nil {
				fmt.Fprintf(e.cfg.Log, "cluster: %s profile of %s: %v\n", kind, a.name, err)
			}
		}
		if i == victim {
			continue
		}
		secs := int((e.cfg.TTL + 5*time.Second) / time.Second)
		wg.Go(func() {
			url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", a.metrics, secs)
			if err := fetchTo(ctx, url, base+"-takeover-cpu.pprof"); err != nil {
				fmt.Fprintf(e.cfg.Log, "cluster: CPU profile of %s: %v\n", a.name, err)
			}
		})
	}
	time.Sleep(50 * time.Millisecond) // let the profiles start before the kill
	return wg.Wait
}
