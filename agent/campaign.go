package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/internal/backoff"
)

// campaign acquires d's lock in run's session — while another holder has
// it, the campaign gives its slot back and parks (turn.go) — and installs a
// controller under its token. It is called holding one of run's slots and
// counted in run.wg.
func (l *leases) campaign(run *sessionRun, d *device) {
	ctx := run.ctx
	if err := l.mayCommand(d); err != nil {
		<-run.slots
		l.distrusted(run, d, err) // untrusted.go
		return
	}
	// Jittered: the gateways retrying one lock do not retry in step.
	delay := backoff.Backoff{Min: 50 * time.Millisecond, Max: 2 * time.Second}
	d.mu.Lock()
	if (d.ctl == nil || d.ctl.lost.Load()) && d.state != StateRefused && d.state != StateCampaigning {
		// Keep saying why the device is campaigning again (deposed,
		// session lost).
		d.setStateLocked(StateCampaigning, d.reason.current(d), l.now())
	}
	d.mu.Unlock()
	held := true
	release := func() {
		if held {
			held = false
			<-run.slots
		}
	}
	defer release()
	for {
		t, parked, err := l.acquire(run, d, release)
		switch {
		case parked:
			return // resumeTurn goes on
		case err == nil:
			release()
			l.installTurn(run, d, t)
			return
		case ctx.Err() != nil || errors.Is(err, concurrency.ErrSessionExpired):
			return
		}
		wait := delay.Next()
		l.log.Warn("lock", "device", d.id, "err", err, "retry_in", wait)
		if !backoff.Sleep(ctx, wait) {
			return
		}
		if !held {
			if !acquireSlot(ctx, run.slots) {
				return
			}
			held = true
		}
	}
}

// acquire queues d's key under the session's lease (or finds the one
// queued before: a re-attached lease keeps its place) and takes the turn
// (turn.go), or parks: another agent holds the device, and the campaign's
// slot is given back (release).
func (l *leases) acquire(run *sessionRun, d *device, release func()) (t lockTurn, parked bool, err error) {
	t, first, rev, err := l.queueTurn(run.ctx, l.lockPrefix(d.id), run.sess.Lease())
	if err != nil {
		return t, false, err
	}
	if string(first.Key) != t.key {
		// An autonomous controller from a lost session stops here (I6)
		// — the fence would refuse it anyway once the holder reaches
		// the device.
		l.heldElsewhere(d)
		release()
	}
	_, parked, err = l.turnOrPark(run, d, t, first, rev)
	return t, parked, err
}

// turnOrPark is tryTurn for d's key t in run's session. A parked campaign
// is counted in run.wg until it resumes (resumeTurn) or run ends (unpark).
func (l *leases) turnOrPark(run *sessionRun, d *device, t lockTurn, first *mvccpb.KeyValue, rev int64) (ok, parked bool, err error) {
	p := &turnPark{pfx: l.lockPrefix(d.id), t: t, lease: run.sess.Lease(), owner: run,
		note: func(kv *mvccpb.KeyValue) { l.noteHolder(d, kv) }, drop: run.wg.Done}
	p.resume = func() {
		defer run.wg.Done()
		l.resumeTurn(run, d, t)
	}
	run.wg.Add(1)
	ok, parked, err = l.tryTurn(run.ctx, p, first, rev)
	if !parked {
		run.wg.Done()
	}
	return ok, parked, err
}

// resumeTurn goes on with d's parked campaign once the key before its
// own is gone: it takes the turn and installs, parks again, or — after
// an error — campaigns anew.
func (l *leases) resumeTurn(run *sessionRun, d *device, t lockTurn) {
	ctx := run.ctx
	if ctx.Err() != nil {
		return
	}
	ok, parked, err := l.turnOrPark(run, d, t, nil, 0)
	switch {
	case parked:
		return
	case ok:
		l.installTurn(run, d, t)
		return
	case ctx.Err() != nil || errors.Is(err, concurrency.ErrSessionExpired):
		return
	}
	wait := (&backoff.Backoff{Min: 50 * time.Millisecond, Max: 2 * time.Second}).Next()
	l.log.Warn("lock", "device", d.id, "err", err, "retry_in", wait)
	if backoff.Sleep(ctx, wait) && acquireSlot(ctx, run.slots) {
		l.campaign(run, d)
	}
}

// installTurn installs a controller under t, d's lock taken, and starts
// its work; a refused token lets the lock go and campaigns again later.
func (l *leases) installTurn(run *sessionRun, d *device, t lockTurn) {
	lease := run.sess.Lease()
	ok, _, refused := l.install(run.ctx, d, fence.Token(t.rev), t.key, lease)
	if ok {
		l.hooks.acquired(d) // deliver its queue, reconcile its twin under the new token
		return
	}
	if refused {
		// Not ours to command: let the lock move on, and try again later.
		l.recampaign(d, fence.Token(t.rev), t.key, lease, false)
	}
}

// install makes token the device's controller and reports whether it did,
// whether it resumed the same lock key (a reattached session), and, if it
// did not, whether it refused the token (the caller then lets the lock go).
// It refuses a token below the highest ever held for the device or at or
// below the highest a fence point of the device said it holds (etcd was
// rebuilt from an old snapshot, or wiped: a token regression), and one equal
// to the highest held unless it is the same lock key — the same lease,
// resumed (reattach) — in which case the controller carries on with its
// seq.
func (l *leases) install(ctx context.Context, d *device, token fence.Token, key string, lease clientv3.LeaseID) (ok, resumed, refused bool) {
	// d.sem guards the seq a resumed controller carries on with.
	select {
	case d.sem <- struct{}{}:
	case <-ctx.Done():
		return false, false, false
	}
	defer func() { <-d.sem }()
	g, why, regression := l.vet(d, grant{token: token, key: key, lease: lease})
	if regression && l.lowerGuard(ctx, d, token) {
		g, why, regression = l.vet(d, grant{token: token, key: key, lease: lease})
	}
	if why != "" {
		l.refuse(d, token, why, regression)
		return false, false, true
	}
	if !g.same {
		// Before the controller is visible: no twin worker may push
		// reported patches queued under an older token with this one.
		l.hooks.newToken(d.id, token)
		// Durable before the first command under it can leave.
		if err := l.store.SetHeld(d.id, token); err != nil {
			l.stats.outboxErr.Add(1)
			l.refuse(d, token, "cannot record the held token durably; not commanding the device: "+err.Error(), false)
			return false, false, true
		}
	}
	l.adopt(d, g)
	return true, g.same, false
}

// grant is a lock key install may make d's controller, and how.
type grant struct {
	token fence.Token
	key   string
	lease clientv3.LeaseID
	same  bool // the lock key d's last controller had: the same lease, resumed
	// fromDisk: the lock key of the previous run, whose lease this run
	// re-attached (reattach); seq is the last it issued under token.
	fromDisk bool
	seq      uint64
}

// vet returns g with same, fromDisk and seq filled in, or why g's token
// must not be installed (why != ""; regression: it is a token regression).
func (l *leases) vet(d *device, g grant) (_ grant, why string, regression bool) {
	d.mu.Lock()
	g.same = d.last != nil && d.last.token == g.token && d.last.key == g.key
	maxToken, mark := d.maxToken, d.fenceMark
	d.mu.Unlock()
	l.mu.Lock()
	// The previous run's lease, re-attached (reattach): its lock key,
	// and the token recorded durably as held, are ours.
	g.fromDisk = !g.same && g.lease == l.resumed && g.token == maxToken
	l.mu.Unlock()
	if g.fromDisk {
		t, s, err := l.store.Issued(d.id)
		if err != nil {
			l.stats.outboxErr.Add(1)
			return g, "cannot read the last seq issued under the token; not commanding the device: " + err.Error(), false
		}
		if t == g.token {
			g.seq = s // carry on above every seq the previous run issued
		}
		g.same = true
	}
	switch {
	case g.token < maxToken || (g.token == maxToken && !g.same):
		// etcd handed out a revision not above one we held before: the
		// cluster was rebuilt from an old snapshot. Commanding would be
		// refused at best; say why and hold off (README: recovery).
		return g, fmt.Sprintf("token regression: etcd granted token %d, not above token %d this gateway held before; "+
			"not commanding the device (README: Token regression: recovery runbook)", g.token, maxToken), true
	case g.token <= mark:
		return g, regressionReason(g.token, mark), true
	}
	return g, "", false
}

// adopt makes g d's controller.
func (l *leases) adopt(d *device, g grant) {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch old := d.ctl; {
	case g.same && old == d.last && old != nil:
		// An autonomous controller whose lease survived: it simply
		// carries on.
		old.lease = g.lease
	case g.fromDisk:
		d.ctl = &controller{token: g.token, key: g.key, lease: g.lease, seq: g.seq}
	case g.same:
		d.ctl = &controller{token: g.token, key: g.key, lease: g.lease, seq: d.last.seq}
	default:
		if old != nil {
			old.lost.Store(true)
		}
		d.ctl = &controller{token: g.token, key: g.key, lease: g.lease}
	}
	d.last, d.autonomy = d.ctl, false
	d.maxToken = g.token
	d.untrusted = ""
	d.setStateLocked(StateHolding, "", l.now())
	d.holder = holderInfo{}
	l.stats.acquired.Add(1)
	reason := "acquired"
	switch {
	case g.fromDisk:
		reason = "resumed: the previous run's lease survived"
	case g.same:
		reason = "resumed: the session's lease survived"
	}
	l.log.Info("holding device", "device", d.id, "token", g.token, "reason", reason, "holder", l.gateway, "key", g.key, "resumed", g.same, "seq", d.ctl.seq)
}

// regressionReason says why token is a regression against mark, the token
// a fence point of the device holds.
func regressionReason(token, mark fence.Token) string {
	return fmt.Sprintf("token regression: the device's fence point holds token %d, above token %d that etcd granted us "+
		"(etcd rebuilt or wiped); not commanding the device (README: Token regression: recovery runbook)", mark, token)
}

// refuse records that the agent will not command d under token, and why. A
// regression puts d in state refused and counts in token_regressions once
// until the device is held again (the campaigns after the backoff are
// refused again: one line each, "lease refused again", not counted); any
// other refusal leaves d campaigning.
func (l *leases) refuse(d *device, token fence.Token, reason string, regression bool) {
	state := StateCampaigning
	if regression {
		state = StateRefused
	}
	d.mu.Lock()
	again := regression && d.state == StateRefused
	d.setStateLocked(state, reason, l.now())
	maxHeld, mark, n := d.maxToken, d.fenceMark, d.refusals
	d.mu.Unlock()
	msg, level := "lease refused", slog.LevelError
	if again {
		msg, level = "lease refused again", slog.LevelWarn
	} else if regression {
		l.stats.regressions.Add(1)
	}
	l.log.Log(context.Background(), level, msg, "device", d.id, "token", token, "reason", reason, "holder", l.gateway,
		"max_held", maxHeld, "fence_token", mark, "releases", n)
}

// heldElsewhere is called when another session holds d's lock: every
// token of ours up to the last one is superseded. An autonomous controller
// left from a lost session stops (I6; the fence would refuse it anyway once
// the holder reaches the device), and queued commands of those tokens are
// let out of the queue to be ended as stale (deliver).
func (l *leases) heldElsewhere(d *device) {
	d.mu.Lock()
	if d.autonomy && d.ctl != nil {
		l.log.Warn("lease lost", "device", d.id, "token", d.ctl.token, "reason", "superseded: another session holds the lock; autonomy ends",
			"holder", l.gateway)
		d.ctl.lost.Store(true)
		d.ctl, d.autonomy = nil, false
		d.state, d.since = StateCampaigning, l.now()
	}
	// Every token this agent ever held for d is superseded: the last of
	// this process, or — after a restart — the durable record of the
	// highest held, which covers the commands a previous run queued.
	top := d.maxToken
	if d.last != nil && d.last.token > top {
		top = d.last.token
	}
	superseded := top > d.deposedAt
	if superseded {
		d.deposedAt = top
	}
	d.mu.Unlock()
	if superseded {
		l.hooks.heldElsewhere(d)
	}
}

// campaignSlots bounds how many campaigns queue, take their turn and
// install at once. A thousand devices campaigning at the same moment
// otherwise double the agent's peak RSS (docs/BENCHMARKS.md §2 and §3:
// each then had its own RPC in flight, and 16 slots were the bound). Their
// writes now share transactions (turn.go), so a slot costs a goroutine and
// a share of a batch, and as many slots as a batch holds (turnBatch) fill
// one (docs/BENCHMARKS.md §72).
const campaignSlots = turnBatch

func acquireSlot(ctx context.Context, slots chan struct{}) bool {
	select {
	case slots <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

// deposed stops ctl after a fence point refused its token: a newer holder
// has reached the device (I6), or the device holds a token from a past etcd
// (a token regression, told apart by recampaign). It is a lease change,
// logged as one line. The lock is let go, so that it can move on, and the
// device is campaigned for again after a backoff.
func (l *leases) deposed(d *device, ctl *controller, env *fence.Envelope, ack *fence.Ack) {
	reason := fmt.Sprintf("deposed: the fence point holds newer token %d", ack.MaxToken)
	if l.ignoresLoss() {
		reason += " (UNSAFE: the controller carries on)"
	}
	l.log.Warn("lease lost", "device", d.id, "token", env.Token, "reason", reason, "holder", l.gateway, "fence_token", ack.MaxToken)
	if l.ignoresLoss() {
		return
	}
	if ctl.lost.Swap(true) {
		return // another verdict, or the session's end, came first
	}
	// The first news of this lock's loss counts as one loss, unless the
	// session's end already counted it (autonomy).
	d.mu.Lock()
	counted := d.autonomy && d.ctl == ctl
	d.mu.Unlock()
	if !counted {
		l.stats.lost.Add(1)
	}
	l.setStateReason(d, ctl, StateLost, reason)
	l.recampaign(d, ctl.token, ctl.key, ctl.lease, true)
}

// setStateReason records a device state change if ctl is still the
// device's controller (or ctl is nil), with the reason the device entered
// it (lost, refused), which Status shows while the device stays in it.
func (l *leases) setStateReason(d *device, ctl *controller, state, reason string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if ctl != nil && d.ctl != ctl {
		return
	}
	d.setStateLocked(state, reason, l.now())
}
