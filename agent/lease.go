package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/internal/backoff"
)

// Run campaigns for every configured device until ctx ends. It opens one
// etcd session (one lease, one keep-alive stream) for all devices; when the
// session ends it stops that session's controllers at once, opens a new
// session and campaigns again. On return (ctx done) it has released every
// lock it held and revoked its lease. Run returns nil on a clean shutdown.
func (a *Agent) Run(ctx context.Context) error {
	defer a.startTails(ctx)() // tail.go: the lease-threat meters
	octx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.delivery.run(octx)
	}()
	// The workers stop when ctx ends (with the campaigns); Run returns
	// only once they have.
	defer func() { cancel(); <-done }()
	if a.twin != nil {
		tctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			a.twin.run(tctx) // twin.go
		}()
		defer func() { cancel(); <-done }()
	}
	// Jittered, so that the gateways that lost etcd together do not come
	// back to it in step.
	delay := backoff.Backoff{Min: 100 * time.Millisecond, Max: 5 * time.Second}
	for ctx.Err() == nil {
		a.beat() // systemd.go: the watchdog's liveness probe
		sess, err := a.openSession(ctx)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			d := delay.Next()
			a.log.Warn("etcd session", "err", err, "retry_in", d)
			if !a.sleepBeating(ctx, d) {
				break
			}
			continue
		}
		delay.Reset()
		a.runSession(ctx, sess)
	}
	return nil
}

// openSession grants a lease with a bounded wait (NewSession alone would wait
// for etcd forever) and starts its keep-alive.
func (a *Agent) openSession(ctx context.Context) (*concurrency.Session, error) {
	gctx, cancel := context.WithTimeout(ctx, a.cfg.Etcd.DialTimeout)
	defer cancel()
	if sess, err := a.reattach(gctx); sess != nil || err != nil {
		return sess, err
	}
	g, err := a.cli.Grant(gctx, a.sessionTTL())
	if err != nil {
		return nil, fmt.Errorf("grant lease: %w", err)
	}
	// Durable before any lock key exists under the lease: a run restarted
	// after a crash re-attaches to it (reattach).
	if err := a.outbox.SetLease(int64(g.ID)); err != nil {
		a.stats.outboxErr.Add(1)
		if _, rerr := a.cli.Revoke(gctx, g.ID); rerr != nil {
			a.log.Warn("revoke lease", "lease", fmt.Sprintf("%x", int64(g.ID)), "err", rerr)
		}
		return nil, fmt.Errorf("record lease: %w", err)
	}
	// The session's own context must outlive ctx, so that a clean shutdown
	// can still unlock and revoke; runSession closes the session.
	sess, err := concurrency.NewSession(a.cli, concurrency.WithLease(g.ID), concurrency.WithTTL(int(a.sessionTTL())))
	if err != nil {
		return nil, fmt.Errorf("start keep-alive: %w", err)
	}
	a.mu.Lock()
	a.lease, a.sessionUp = g.ID, true
	a.sessions++
	n := a.sessions
	a.mu.Unlock()
	a.log.Info("etcd session open", "lease", fmt.Sprintf("%x", int64(g.ID)), "ttl_s", a.sessionTTL(), "session", n)
	return sess, nil
}

// reattach resumes the session lost last, if its lease is still alive: the
// client gives a session up when no keep-alive answer came for a TTL, but
// etcd may have kept the lease — it extends every lease when a member
// restarts or a new leader is elected. Our lock keys then still exist, so
// the devices are held under the same tokens and their controllers carry
// on. The same holds for the previous run's lease after a crash or a power
// cut (recorded in the outbox file): its lock keys would otherwise lock this
// run out until the TTL ran out, and its queue would be ended as superseded
// by a session that was our own. It returns nil, nil if there is nothing to
// reattach to.
func (a *Agent) reattach(ctx context.Context) (*concurrency.Session, error) {
	a.mu.Lock()
	old, fromDisk := a.lostLease, a.lostLease != 0 && a.lostLease == a.diskLease
	a.mu.Unlock()
	if old == 0 {
		return nil, nil
	}
	// The lease lives on for about a TTL after etcd returns: do not let
	// the gRPC reconnect backoff, grown during the outage, eat it.
	if cc := a.cli.ActiveConnection(); cc != nil {
		cc.ResetConnectBackoff()
	}
	var opts []clientv3.LeaseOption
	if fromDisk {
		opts = append(opts, clientv3.WithAttachedKeys())
	}
	ttl, err := a.cli.TimeToLive(ctx, old, opts...)
	if err != nil {
		return nil, fmt.Errorf("lease %x time to live: %w", int64(old), err)
	}
	a.mu.Lock()
	a.lostLease, a.diskLease = 0, 0
	a.mu.Unlock()
	lease := fmt.Sprintf("%x", int64(old))
	switch {
	case ttl.TTL <= 0:
		a.log.Info("lost lease expired; opening a new session", "lease", lease, "previous_run", fromDisk)
		return nil, nil
	case fromDisk && ttl.GrantedTTL != a.sessionTTL():
		// lease_ttl changed since: a lease keeps the TTL it was granted
		// with, so do not carry the old one on. Revoking frees its locks.
		if _, err := a.cli.Revoke(ctx, old); err != nil {
			return nil, fmt.Errorf("revoke the previous run's lease %s: %w", lease, err)
		}
		a.log.Info("previous run's lease revoked: lease_ttl changed", "lease", lease, "granted_ttl_s", ttl.GrantedTTL, "ttl_s", a.sessionTTL())
		return nil, nil
	}
	sess, err := concurrency.NewSession(a.cli, concurrency.WithLease(old), concurrency.WithTTL(int(a.sessionTTL())))
	if err != nil {
		return nil, fmt.Errorf("start keep-alive: %w", err)
	}
	if fromDisk {
		a.sweepKeys(ctx, old, ttl.Keys)
	}
	a.mu.Lock()
	a.lease, a.sessionUp = old, true
	a.sessions++
	n := a.sessions
	if fromDisk {
		a.resumed = old
	}
	a.mu.Unlock()
	a.stats.reattached.Add(1)
	msg := "etcd session resumed: the lease survived"
	if fromDisk {
		msg = "etcd session resumed: the previous run's lease survived"
	}
	a.log.Info(msg, "lease", lease, "ttl_left_s", ttl.TTL, "session", n, "keys", len(ttl.Keys))
	return sess, nil
}

// sweepKeys deletes the lock keys the previous run held under lease for
// devices no longer in the configuration: nothing would ever release them
// while this run keeps the lease alive.
func (a *Agent) sweepKeys(ctx context.Context, lease clientv3.LeaseID, keys [][]byte) {
	suffix := fmt.Sprintf("/lock/%x", int64(lease))
	pfx := a.cfg.Etcd.Prefix + "/devices/"
	for _, k := range keys {
		id, ok := strings.CutPrefix(string(k), pfx)
		if !ok {
			continue
		}
		if id, ok = strings.CutSuffix(id, suffix); !ok || a.devices[id] != nil {
			continue
		}
		if _, err := a.cli.Delete(ctx, string(k)); err != nil {
			a.log.Warn("cannot delete the lock key of a device no longer configured", "key", string(k), "err", err)
			continue
		}
		a.log.Info("lock released: the device is no longer configured", "device", id, "key", string(k))
	}
}

// sessionRun is what a device's later campaign under the same session
// needs: after a fence point refused our token, the lock is released and
// campaigned for again (recampaign).
type sessionRun struct {
	sess  *concurrency.Session
	ctx   context.Context // the session's campaigns' context
	slots chan struct{}
	wg    *sync.WaitGroup
	ended bool // guarded by Agent.mu; set before wg.Wait, so no Add races it
}

// runSession campaigns for all devices under sess until the session ends or
// ctx is done.
func (a *Agent) runSession(ctx context.Context, sess *concurrency.Session) {
	sctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	slots := make(chan struct{}, campaignSlots)
	run := &sessionRun{sess: sess, ctx: sctx, slots: slots, wg: &wg}
	a.mu.Lock()
	a.run = run
	a.mu.Unlock()
	// Start a device's campaign only once it has a slot: at most
	// campaignSlots campaigns talk to etcd at once, and a campaign's
	// goroutine outlives its slot only while another agent holds the device.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for _, id := range a.order {
			if !acquireSlot(sctx, slots) {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				a.campaign(sctx, sess, a.devices[id], concurrency.NewMutex(sess, a.LockPrefix(id)), slots)
			}()
		}
	}()
	a.campaignOnce.Do(func() { close(a.campaigning) })
	// While the session lasts this goroutine beats every second
	// (systemd.go): the watchdog pings stop if it ever gets stuck.
	beat := time.NewTicker(heartbeatEvery)
	lost := false
wait:
	for {
		a.beat()
		select {
		case <-ctx.Done():
			break wait
		case <-sess.Done():
			lost = true
			break wait
		case <-beat.C:
		}
	}
	beat.Stop()
	if lost {
		// I6: stop this session's controllers before anything else.
		a.dropSession(sess.Lease())
	}
	a.mu.Lock()
	run.ended = true
	a.run = nil
	a.mu.Unlock()
	cancel()
	wg.Wait()

	a.mu.Lock()
	a.sessionUp = false
	a.mu.Unlock()
	if lost {
		a.log.Warn("etcd session lost; campaigning again", "lease", fmt.Sprintf("%x", int64(sess.Lease())))
		sess.Orphan()
		a.mu.Lock()
		a.lostLease = sess.Lease()
		a.mu.Unlock()
		return
	}
	a.release(sess)
}

// dropSession removes every controller that belongs to lease.
func (a *Agent) dropSession(lease clientv3.LeaseID) {
	for _, id := range a.order {
		d := a.devices[id]
		d.mu.Lock()
		if d.ctl != nil && d.ctl.lease == lease && d.ctl.lost.Load() && !a.ignoresLoss() {
			// Already stopped by a fence point's refusal, its lock let
			// go: the device keeps the state that refusal gave it.
			d.ctl = nil
		} else if d.ctl != nil && d.ctl.lease == lease {
			if a.ignoresLoss() {
				// Keep the controller: the demo's frozen holder that never
				// noticed. Fence points must refuse it.
				a.log.Warn("lease lost", "device", d.id, "token", d.ctl.token, "reason", "etcd session lost (UNSAFE: the controller carries on)",
					"holder", a.cfg.Gateway)
				d.mu.Unlock()
				continue
			}
			if !d.ctl.lost.Load() { // a stale verdict may have counted it
				a.stats.lost.Add(1)
			}
			if d.policy == PolicyAutonomous {
				// Keep commanding under the last token: the fence point
				// refuses it once a newer holder reaches the device.
				d.autonomy = true
				d.setStateLocked(StateAutonomous, "etcd session lost; autonomous policy: commands go on under the last token", a.now())
				a.log.Warn("lease lost", "device", d.id, "token", d.ctl.token,
					"reason", "etcd session lost; autonomous policy: commands go on under the last token", "holder", a.cfg.Gateway)
				d.mu.Unlock()
				continue
			}
			a.log.Warn("lease lost", "device", d.id, "token", d.ctl.token, "reason", "etcd session lost", "holder", a.cfg.Gateway)
			d.ctl.lost.Store(true)
			d.ctl = nil
			d.setStateLocked(StateLost, "etcd session lost", a.now())
		} else if d.ctl == nil {
			d.state, d.since = StateCampaigning, a.now()
		}
		d.mu.Unlock()
	}
}

// release revokes sess's lease, which deletes every device lock held under
// it, so that another gateway can take over at once instead of after the TTL.
func (a *Agent) release(sess *concurrency.Session) {
	held := 0
	for _, id := range a.order {
		d := a.devices[id]
		d.mu.Lock()
		if d.ctl != nil && !d.ctl.lost.Load() {
			held++
			a.log.Info("lease released", "device", d.id, "token", d.ctl.token, "reason", "shutdown", "holder", a.cfg.Gateway)
			d.ctl.lost.Store(true)
			d.ctl = nil
		}
		d.state, d.since = StateCampaigning, a.now()
		d.mu.Unlock()
	}
	// One revoke deletes every lock key of the lease in one revision: no
	// per-key Unlock, which took one round trip per device and made a large
	// fleet slow to exit (docs/BENCHMARKS.md §17).
	// Bounded by etcd.dial_timeout, as the unit's stop timeout expects.
	sess.Orphan() // stops the keep-alive
	ctx, cancel := context.WithTimeout(context.Background(), a.cfg.Etcd.DialTimeout)
	defer cancel()
	if _, err := a.cli.Revoke(ctx, sess.Lease()); err != nil {
		a.log.Warn("revoke lease on shutdown", "err", err)
	}
	a.log.Info("released locks", "keys", held, "lease", fmt.Sprintf("%x", int64(sess.Lease())))
}

// campaign acquires dev's lock under sess (waiting while another holder has
// it), reads the token and installs a controller. It is called holding one
// of slots and gives it back.
func (a *Agent) campaign(ctx context.Context, sess *concurrency.Session, d *device, m *concurrency.Mutex, slots chan struct{}) {
	// Jittered: the gateways retrying one lock do not retry in step.
	delay := backoff.Backoff{Min: 50 * time.Millisecond, Max: 2 * time.Second}
	d.mu.Lock()
	if (d.ctl == nil || d.ctl.lost.Load()) && d.state != StateRefused && d.state != StateCampaigning {
		// Keep saying why the device is campaigning again (deposed,
		// session lost).
		d.setStateLocked(StateCampaigning, d.reason.current(d), a.now())
	}
	d.mu.Unlock()
	// The campaign starts holding one of the session's slots; it gives the
	// slot back while it waits for a device another agent holds.
	held := true
	release := func() {
		if held {
			held = false
			<-slots
		}
	}
	defer release()
	for {
		err := m.TryLock(ctx)
		if errors.Is(err, concurrency.ErrLocked) {
			// Another agent holds the device: an autonomous controller
			// from a lost session stops here (I6) — the fence would
			// refuse it anyway once the holder reaches the device.
			a.heldElsewhere(d)
			a.noteHolder(ctx, d)
			release()
			if err = m.Lock(ctx); err == nil {
				if !acquireSlot(ctx, slots) {
					return
				}
				held = true
			}
		}
		if err == nil {
			break
		}
		if ctx.Err() != nil || errors.Is(err, concurrency.ErrSessionExpired) {
			return
		}
		wait := delay.Next()
		a.log.Warn("lock", "device", d.id, "err", err, "retry_in", wait)
		if !backoff.Sleep(ctx, wait) {
			return
		}
		if !held {
			if !acquireSlot(ctx, slots) {
				return
			}
			held = true
		}
	}
	var token fence.Token
	for {
		t, err := a.readToken(ctx, m, sess.Lease())
		if err == nil {
			token = t
			break
		}
		if ctx.Err() != nil || errors.Is(err, concurrency.ErrSessionExpired) {
			return
		}
		a.log.Warn("read token", "device", d.id, "err", err)
		if !backoff.Sleep(ctx, delay.Next()) {
			return
		}
	}
	release()
	ok, _, refused := a.install(ctx, d, token, m.Key(), sess.Lease())
	if ok {
		a.delivery.kick(d)
		a.twin.kick(d.id) // twin.go: reconcile under the new token
		return
	}
	if refused {
		// Not ours to command: let the lock move on, and try again later.
		a.recampaign(d, token, m.Key(), sess.Lease(), false)
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
func (a *Agent) install(ctx context.Context, d *device, token fence.Token, key string, lease clientv3.LeaseID) (ok, resumed, refused bool) {
	// d.sem guards the seq a resumed controller carries on with.
	select {
	case d.sem <- struct{}{}:
	case <-ctx.Done():
		return false, false, false
	}
	defer func() { <-d.sem }()
	d.mu.Lock()
	same := d.last != nil && d.last.token == token && d.last.key == key
	maxToken, mark := d.maxToken, d.fenceMark
	d.mu.Unlock()
	a.mu.Lock()
	// The previous run's lease, re-attached (reattach): its lock key,
	// and the token recorded durably as held, are ours.
	fromDisk := !same && lease == a.resumed && token == maxToken
	a.mu.Unlock()
	var seq uint64
	if fromDisk {
		t, s, err := a.outbox.Issued(d.id)
		if err != nil {
			a.stats.outboxErr.Add(1)
			a.refuse(d, token, "cannot read the last seq issued under the token; not commanding the device: "+err.Error(), false)
			return false, false, true
		}
		if t == token {
			seq = s // carry on above every seq the previous run issued
		}
		same = true
	}
	switch {
	case token < maxToken || (token == maxToken && !same):
		// etcd handed out a revision not above one we held before: the
		// cluster was rebuilt from an old snapshot. Commanding would be
		// refused at best; say why and hold off (README: recovery).
		a.refuse(d, token, fmt.Sprintf("token regression: etcd granted token %d, not above token %d this gateway held before; "+
			"not commanding the device (README: Token regression: recovery runbook)", token, maxToken), true)
		return false, false, true
	case token <= mark:
		a.refuse(d, token, regressionReason(token, mark), true)
		return false, false, true
	}
	if !same {
		// Before the controller is visible: no twin worker may push
		// reported patches queued under an older token with this one.
		a.twin.newToken(d.id, token)
	}
	if !same {
		// Durable before the first command under it can leave.
		if err := a.outbox.SetHeld(d.id, token); err != nil {
			a.stats.outboxErr.Add(1)
			a.refuse(d, token, "cannot record the held token durably; not commanding the device: "+err.Error(), false)
			return false, false, true
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	switch old := d.ctl; {
	case same && old == d.last && old != nil:
		// An autonomous controller whose lease survived: it simply
		// carries on.
		old.lease = lease
	case fromDisk:
		d.ctl = &controller{token: token, key: key, lease: lease, seq: seq}
	case same:
		d.ctl = &controller{token: token, key: key, lease: lease, seq: d.last.seq}
	default:
		if old != nil {
			old.lost.Store(true)
		}
		d.ctl = &controller{token: token, key: key, lease: lease}
	}
	d.last, d.autonomy = d.ctl, false
	d.maxToken = token
	d.setStateLocked(StateHolding, "", a.now())
	d.holder = holderInfo{}
	a.stats.acquired.Add(1)
	reason := "acquired"
	switch {
	case fromDisk:
		reason = "resumed: the previous run's lease survived"
	case same:
		reason = "resumed: the session's lease survived"
	}
	// The message stays "holding device": benchmarks count these lines.
	a.log.Info("holding device", "device", d.id, "token", token, "reason", reason, "holder", a.cfg.Gateway, "key", key, "resumed", same, "seq", d.ctl.seq)
	return true, same, false
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
func (a *Agent) refuse(d *device, token fence.Token, reason string, regression bool) {
	state := StateCampaigning
	if regression {
		state = StateRefused
	}
	d.mu.Lock()
	again := regression && d.state == StateRefused
	d.setStateLocked(state, reason, a.now())
	maxHeld, mark, n := d.maxToken, d.fenceMark, d.refusals
	d.mu.Unlock()
	msg, level := "lease refused", slog.LevelError
	if again {
		msg, level = "lease refused again", slog.LevelWarn
	} else if regression {
		a.stats.regressions.Add(1)
	}
	a.log.Log(context.Background(), level, msg, "device", d.id, "token", token, "reason", reason, "holder", a.cfg.Gateway,
		"max_held", maxHeld, "fence_token", mark, "releases", n)
}

// heldElsewhere is called when another session holds d's lock: every
// token of ours up to the last one is superseded. An autonomous controller
// left from a lost session stops (I6; the fence would refuse it anyway once
// the holder reaches the device), and queued commands of those tokens are
// let out of the queue to be ended as stale (deliver).
func (a *Agent) heldElsewhere(d *device) {
	d.mu.Lock()
	if d.autonomy && d.ctl != nil {
		a.log.Warn("lease lost", "device", d.id, "token", d.ctl.token, "reason", "superseded: another session holds the lock; autonomy ends",
			"holder", a.cfg.Gateway)
		d.ctl.lost.Store(true)
		d.ctl, d.autonomy = nil, false
		d.state, d.since = StateCampaigning, a.now()
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
		a.delivery.kickPending(d)
	}
}

// campaignSlots bounds how many campaigns talk to etcd at once. A thousand
// devices campaigning at the same moment otherwise double the agent's peak
// RSS (a goroutine, an in-flight RPC and its buffers each); with 16 slots
// 1,000 devices are still acquired well within the lock target
// (docs/BENCHMARKS.md §2 and §3).
const campaignSlots = 16

func acquireSlot(ctx context.Context, slots chan struct{}) bool {
	select {
	case slots <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

// readToken returns the CreateRevision of our own lock key: the fencing
// token. Not Header().Revision — after a contended acquisition that is a later
// revision than the key's. In the same transaction it writes the gateway id
// as the key's value (a Put keeps the CreateRevision), so that waiting
// gateways, and `etcdctl get`, can tell who holds the device.
func (a *Agent) readToken(ctx context.Context, m *concurrency.Mutex, lease clientv3.LeaseID) (fence.Token, error) {
	resp, err := a.cli.Txn(ctx).If(m.IsOwner()).
		Then(clientv3.OpPut(m.Key(), a.cfg.Gateway, clientv3.WithLease(lease)), clientv3.OpGet(m.Key())).
		Commit()
	if err != nil {
		return 0, fmt.Errorf("get %s: %w", m.Key(), err)
	}
	if !resp.Succeeded {
		return 0, concurrency.ErrSessionExpired
	}
	kvs := resp.Responses[1].GetResponseRange().Kvs
	if len(kvs) == 0 || clientv3.LeaseID(kvs[0].Lease) != lease {
		return 0, concurrency.ErrSessionExpired
	}
	return fence.Token(kvs[0].CreateRevision), nil
}

// deposed stops ctl after a fence point refused its token: a newer holder
// has reached the device (I6), or the device holds a token from a past etcd
// (a token regression, told apart by recampaign). It is a lease change,
// logged as one line. The lock is let go, so that it can move on, and the
// device is campaigned for again after a backoff.
func (a *Agent) deposed(d *device, ctl *controller, env *fence.Envelope, ack *fence.Ack) {
	reason := fmt.Sprintf("deposed: the fence point holds newer token %d", ack.MaxToken)
	if a.ignoresLoss() {
		reason += " (UNSAFE: the controller carries on)"
	}
	a.log.Warn("lease lost", "device", d.id, "token", env.Token, "reason", reason, "holder", a.cfg.Gateway, "fence_token", ack.MaxToken)
	if a.ignoresLoss() {
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
		a.stats.lost.Add(1)
	}
	a.setStateReason(d, ctl, StateLost, reason)
	a.recampaign(d, ctl.token, ctl.key, ctl.lease, true)
}
