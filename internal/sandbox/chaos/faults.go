package chaos

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/edgefence/edgefence/internal/backoff"
	"github.com/edgefence/edgefence/internal/sandbox"
)

// inject runs the round's fault during the load window and heals it before
// it returns.
func (r *round) inject(ctx context.Context) error {
	if !backoff.Sleep(ctx, r.jitter(300*time.Millisecond, r.cfg.Load/4)) {
		return ctx.Err()
	}
	r.res.FaultStart = time.Now()
	defer func() { r.res.FaultEnd = time.Now() }()
	return r.injectFault(ctx)
}

// injectFault injects the fault of the round's scenario and heals it.
func (r *round) injectFault(ctx context.Context) error {
	ttl := r.cfg.TTL
	switch r.sc {
	case FaultFreeze:
		return r.freezeHolder(ctx, r.outage(ttl+500*time.Millisecond, 2*ttl+time.Second))
	case FaultKillAgent:
		return r.killAgents(ctx)
	case FaultKillBridge:
		return r.killAgent(ctx, r.agents[1]) // gw-b is the serial devices' home
	case FaultKillDevsim:
		return r.killDevsims(ctx)
	case FaultEtcdRestart:
		return r.restartEtcd(ctx)
	case FaultLeaderLoss:
		return r.killLeader(ctx)
	case FaultBroker:
		return r.restartBroker(ctx)
	case FaultPartition:
		return r.partition(ctx)
	case FaultDuplicate:
		// The duplicator works from the start; count what it did once
		// the load is over.
		backoff.Sleep(ctx, r.cfg.Load/2)
		r.faultMu.Lock()
		r.res.Faults[FaultDuplicate] += int(r.dup.Duplicated())
		r.faultMu.Unlock()
		return nil
	case FaultSerialNoise:
		return r.serialNoise(ctx)
	case FaultOffline:
		return r.offlineAtAcquisition(ctx)
	case FaultEtcdRebuilt:
		return r.etcdRebuilt(ctx)
	case FaultRevoked:
		return r.gatewayRevoked(ctx)
	case FaultRotated:
		return r.keyRotated(ctx)
	}
	return fmt.Errorf("no fault for scenario %q", r.sc)
}

// killAgents kills one or two agents drawn at random (maybe the same one
// twice), each restarted before the next kill.
func (r *round) killAgents(ctx context.Context) error {
	for range 1 + int(r.jitter(0, 2)) {
		if err := r.killAgent(ctx, r.agents[int(r.jitter(0, time.Duration(len(r.agents))))]); err != nil {
			return err
		}
	}
	return nil
}

// killDevsims kills the device simulator one to three times, a moment
// apart.
func (r *round) killDevsims(ctx context.Context) error {
	for range 1 + int(r.jitter(0, 3)) {
		if err := r.killDevsim(ctx); err != nil {
			return err
		}
		backoff.Sleep(ctx, r.jitter(200*time.Millisecond, time.Second))
	}
	return nil
}

// restartEtcd stops the single etcd node for an outage, then starts it on
// the same data.
func (r *round) restartEtcd(ctx context.Context) error {
	if err := r.etcd.Stop(); err != nil {
		return err
	}
	r.fault(FaultEtcdRestart)
	d := r.outage(r.cfg.TTL/2, 3*r.cfg.TTL)
	r.logf("etcd stopped for %v", d)
	backoff.Sleep(ctx, d)
	return r.etcd.Start(ctx)
}

// killLeader kills the etcd cluster's leader, waits for another to be
// elected, and restarts the killed member after an outage.
func (r *round) killLeader(ctx context.Context) error {
	l, err := r.cluster.WaitLeader(ctx, -1)
	if err != nil {
		return err
	}
	if err := r.cluster.Kill(l); err != nil {
		return err
	}
	r.fault(FaultLeaderLoss)
	if _, err := r.cluster.WaitLeader(ctx, l); err != nil {
		return err
	}
	r.logf("etcd leader %d killed; new leader elected", l)
	backoff.Sleep(ctx, r.outage(500*time.Millisecond, 2*r.cfg.TTL))
	return r.cluster.Restart(ctx, l)
}

// restartBroker stops the broker (it keeps no sessions) for an outage,
// then starts it again.
func (r *round) restartBroker(ctx context.Context) error {
	if err := r.broker.Stop(); err != nil {
		return err
	}
	r.fault(FaultBroker)
	d := r.outage(300*time.Millisecond, 3*time.Second)
	r.logf("broker down (no persistence) for %v", d)
	backoff.Sleep(ctx, d)
	return r.broker.Start(ctx)
}

// partition cuts gw-a from etcd and the broker for an outage, then heals.
func (r *round) partition(ctx context.Context) error {
	if err := r.lab.Partition(nodeA, nodeServer); err != nil {
		return err
	}
	r.res.FaultStart = time.Now() // in effect from here on
	r.fault(FaultPartition)
	d := r.outage(r.cfg.TTL+500*time.Millisecond, 3*r.cfg.TTL)
	r.logf("gw-a cut from etcd and broker for %v", d)
	backoff.Sleep(ctx, d)
	return r.lab.Heal(nodeA, nodeServer)
}

// serialNoise corrupts the serial lines for a while, the first one also
// unplugged for a moment, then makes them clean again.
func (r *round) serialNoise(ctx context.Context) error {
	for i, l := range r.lines {
		l.SetNoise(sandbox.LineNoise{Flip: 0.002, Insert: 0.001, Drop: 0.001})
		r.fault(FaultSerialNoise)
		if i == 0 {
			l.Unplug()
			backoff.Sleep(ctx, r.jitter(100*time.Millisecond, time.Second))
			l.Plug()
		}
	}
	backoff.Sleep(ctx, r.outage(time.Second, 3*time.Second))
	for _, l := range r.lines {
		l.SetNoise(sandbox.LineNoise{})
	}
	return nil
}

// freezeHolder SIGSTOPs the agent holding the most devices for d, then
// resumes it: the other agent takes over meanwhile, and the frozen one's
// commands in flight meet the fence when it wakes.
func (r *round) freezeHolder(ctx context.Context, d time.Duration) error {
	return r.freeze(ctx, r.busiestHolder(ctx), d)
}

// freeze SIGSTOPs victim for d, then resumes it.
func (r *round) freeze(ctx context.Context, victim *agentProc, d time.Duration) error {
	p := victim.current()
	if err := p.Freeze(); err != nil {
		return err
	}
	r.fault(FaultFreeze)
	r.logf("%s frozen (SIGSTOP) for %v", victim.name, d)
	backoff.Sleep(ctx, d)
	return p.Resume()
}

// busiestHolder returns the agent holding the most devices now (gw-a
// when none answers).
func (r *round) busiestHolder(ctx context.Context) *agentProc {
	counts := map[*agentProc]int{}
	for _, hs := range r.holders(ctx) {
		for _, a := range hs {
			counts[a]++
		}
	}
	victim := r.agents[0]
	for a, n := range counts {
		if n > counts[victim] {
			victim = a
		}
	}
	return victim
}

// killAgent SIGKILLs a and starts it again on the same state.
func (r *round) killAgent(ctx context.Context, a *agentProc) error {
	p := a.current()
	if err := p.Kill(); err != nil {
		return err
	}
	<-p.Done()
	r.fault(FaultKillAgent)
	if a.name == "gw-b" && len(r.serialDevs) > 0 {
		r.fault(FaultKillBridge)
	}
	down := r.jitter(100*time.Millisecond, 1500*time.Millisecond)
	r.logf("%s killed (SIGKILL); restart in %v", a.name, down)
	backoff.Sleep(ctx, down)
	return r.runAgent(ctx, a)
}

// killDevsim SIGKILLs the device simulator and starts it again on the same
// state.
func (r *round) killDevsim(ctx context.Context) error {
	r.devsimMu.Lock()
	p := r.devsim
	r.devsimMu.Unlock()
	if err := p.Kill(); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	<-p.Done()
	r.fault(FaultKillDevsim)
	down := r.jitter(50*time.Millisecond, time.Second)
	r.logf("device simulator killed (SIGKILL); restart in %v", down)
	backoff.Sleep(ctx, down)
	return r.startDevsim(ctx)
}
