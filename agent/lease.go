package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/edgefence/edgefence/fence"
)

// Run campaigns for every configured device until ctx ends. It opens one
// etcd session (one lease, one keep-alive stream) for all devices; when the
// session ends it stops that session's controllers at once, opens a new
// session and campaigns again. On return (ctx done) it has released every
// lock it held and revoked its lease. Run returns nil on a clean shutdown.
func (a *Agent) Run(ctx context.Context) error {
	defer a.startTails(ctx)() // tail.go: the lease-threat meters
	if a.outbox != nil {
		octx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			a.runOutbox(octx)
		}()
		// The workers stop when ctx ends (with the campaigns); Run
		// returns only once they have.
		defer func() { cancel(); <-done }()
	}
	if a.twin != nil {
		tctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			a.runTwins(tctx) // twin.go
		}()
		defer func() { cancel(); <-done }()
	}
	backoff := newBackoff(100*time.Millisecond, 5*time.Second)
	for ctx.Err() == nil {
		a.beat() // systemd.go: the watchdog's liveness probe
		sess, err := a.openSession(ctx)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			d := backoff.next()
			a.log.Warn("etcd session", "err", err, "retry_in", d)
			if !a.sleepBeating(ctx, d) {
				break
			}
			continue
		}
		backoff.reset()
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
// on. It returns nil, nil if there is nothing to reattach to.
func (a *Agent) reattach(ctx context.Context) (*concurrency.Session, error) {
	a.mu.Lock()
	old := a.lostLease
	a.mu.Unlock()
	if old == 0 {
		return nil, nil
	}
	// The lease lives on for about a TTL after etcd returns: do not let
	// the gRPC reconnect backoff, grown during the outage, eat it.
	if cc := a.cli.ActiveConnection(); cc != nil {
		cc.ResetConnectBackoff()
	}
	ttl, err := a.cli.TimeToLive(ctx, old)
	if err != nil {
		return nil, fmt.Errorf("lease %x time to live: %w", int64(old), err)
	}
	a.mu.Lock()
	a.lostLease = 0
	a.mu.Unlock()
	if ttl.TTL <= 0 {
		a.log.Info("lost lease expired; opening a new session", "lease", fmt.Sprintf("%x", int64(old)))
		return nil, nil
	}
	sess, err := concurrency.NewSession(a.cli, concurrency.WithLease(old), concurrency.WithTTL(int(a.sessionTTL())))
	if err != nil {
		return nil, fmt.Errorf("start keep-alive: %w", err)
	}
	a.mu.Lock()
	a.lease, a.sessionUp = old, true
	a.sessions++
	n := a.sessions
	a.mu.Unlock()
	a.stats.reattached.Add(1)
	a.log.Info("etcd session resumed: the lease survived", "lease", fmt.Sprintf("%x", int64(old)), "ttl_left_s", ttl.TTL, "session", n)
	return sess, nil
}

// runSession campaigns for all devices under sess until the session ends or
// ctx is done.
func (a *Agent) runSession(ctx context.Context, sess *concurrency.Session) {
	sctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	slots := make(chan struct{}, campaignSlots)
	mutexes := make([]*concurrency.Mutex, len(a.order))
	for i, id := range a.order {
		mutexes[i] = concurrency.NewMutex(sess, a.LockPrefix(id))
	}
	// Start a device's campaign only once it has a slot: at most
	// campaignSlots campaigns talk to etcd at once, and a campaign's
	// goroutine outlives its slot only while another agent holds the device.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i, id := range a.order {
			if !acquireSlot(sctx, slots) {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				a.campaign(sctx, sess, a.devices[id], mutexes[i], slots)
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
	a.release(sess, mutexes)
}

// dropSession removes every controller that belongs to lease.
func (a *Agent) dropSession(lease clientv3.LeaseID) {
	for _, id := range a.order {
		d := a.devices[id]
		d.mu.Lock()
		if d.ctl != nil && d.ctl.lease == lease {
			if a.unsafe {
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
				d.state, d.since = StateAutonomous, a.now()
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
func (a *Agent) release(sess *concurrency.Session, mutexes []*concurrency.Mutex) {
	for _, id := range a.order {
		d := a.devices[id]
		d.mu.Lock()
		if d.ctl != nil {
			a.log.Info("lease released", "device", d.id, "token", d.ctl.token, "reason", "shutdown", "holder", a.cfg.Gateway)
			d.ctl.lost.Store(true)
			d.ctl = nil
		}
		d.state, d.since = StateCampaigning, a.now()
		d.mu.Unlock()
	}
	held := 0
	for _, m := range mutexes {
		if m.Key() != "" && m.Key() != "\x00" {
			held++
		}
	}
	// One revoke deletes every lock key of the lease in one revision: no
	// per-key Unlock, which took one round trip per device (1,000 devices:
	// 0.5–2 s to exit on a busy 2-core box, docs/BENCHMARKS.md §17).
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
	backoff := newBackoff(50*time.Millisecond, 2*time.Second)
	d.mu.Lock()
	if d.ctl == nil && d.state != StateRefused {
		d.state, d.since = StateCampaigning, a.now()
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
		wait := backoff.next()
		a.log.Warn("lock", "device", d.id, "err", err, "retry_in", wait)
		if !sleepCtx(ctx, wait) {
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
		if !sleepCtx(ctx, backoff.next()) {
			return
		}
	}
	release()
	if ok, _ := a.install(ctx, d, token, m.Key(), sess.Lease()); ok {
		if a.outbox != nil {
			a.kick(d)
		}
		a.twinKick(d.id) // twin.go: reconcile under the new token
	}
}

// install makes token the device's controller and reports whether it did,
// and whether it resumed the same lock key (a reattached session).
// It refuses a token below the highest ever held for the device (etcd was
// rebuilt from an old snapshot), and one equal to it unless it is the same
// lock key — the same lease, resumed (reattach) — in which case the
// controller carries on with its seq.
func (a *Agent) install(ctx context.Context, d *device, token fence.Token, key string, lease clientv3.LeaseID) (ok, resumed bool) {
	// d.sem guards the seq a resumed controller carries on with.
	select {
	case d.sem <- struct{}{}:
	case <-ctx.Done():
		return false, false
	}
	defer func() { <-d.sem }()
	d.mu.Lock()
	same := d.last != nil && d.last.token == token && d.last.key == key
	maxToken := d.maxToken
	d.mu.Unlock()
	if token < maxToken || (token == maxToken && !same) {
		// etcd handed out a revision not above one we held before: the
		// cluster was rebuilt from an old snapshot. Commanding would be
		// refused at best; say why and hold off (README: recovery).
		a.stats.regressions.Add(1)
		a.setStateReason(d, nil, StateRefused, fmt.Sprintf("token regression: etcd granted token %d, not above %d held before (README, token regression)", token, maxToken))
		a.log.Error("lease refused", "device", d.id, "token", token,
			"reason", "token regression: etcd granted a token not above one held before; not commanding this device (see README, token regression)",
			"holder", a.cfg.Gateway, "max_held", maxToken, "key", key)
		return false, false
	}
	if !same {
		// Before the controller is visible: no twin worker may push
		// reported patches queued under an older token with this one.
		a.twinNewToken(d.id, token)
	}
	if a.outbox != nil && !same {
		// Durable before the first command under it can leave.
		if err := a.outbox.SetHeld(d.id, token); err != nil {
			a.stats.outboxErr.Add(1)
			a.log.Error("lease refused", "device", d.id, "token", token, "reason", "cannot record the held token durably; not commanding the device",
				"holder", a.cfg.Gateway, "err", err)
			return false, false
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	switch old := d.ctl; {
	case same && old == d.last && old != nil:
		// An autonomous controller whose lease survived: it simply
		// carries on.
		old.lease = lease
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
	d.state, d.since = StateHolding, a.now()
	a.stats.acquired.Add(1)
	reason := "acquired"
	if same {
		reason = "resumed: the session's lease survived"
	}
	// The message stays "holding device": benchmarks count these lines.
	a.log.Info("holding device", "device", d.id, "token", token, "reason", reason, "holder", a.cfg.Gateway, "key", key, "resumed", same)
	return true, same
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
	if superseded && a.outbox != nil {
		if n, _ := a.outbox.Pending(d.id); n > 0 {
			a.kick(d)
		}
	}
}

// campaignSlots bounds how many campaigns talk to etcd at once. A thousand
// devices campaigning at the same moment otherwise peak at ~50 MiB RSS (a
// goroutine, an in-flight RPC and its buffers each); with 16 slots the agent
// peaks at ~24 MiB and still acquires 1,000 devices in ~0.2 s
// (docs/BENCHMARKS.md, `edgefence-bench rss` and `locks`).
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
// revision than the key's.
func (a *Agent) readToken(ctx context.Context, m *concurrency.Mutex, lease clientv3.LeaseID) (fence.Token, error) {
	resp, err := a.cli.Get(ctx, m.Key())
	if err != nil {
		return 0, fmt.Errorf("get %s: %w", m.Key(), err)
	}
	if len(resp.Kvs) == 0 || clientv3.LeaseID(resp.Kvs[0].Lease) != lease {
		return 0, concurrency.ErrSessionExpired
	}
	return fence.Token(resp.Kvs[0].CreateRevision), nil
}

type backoff struct{ cur, min, max time.Duration }

func newBackoff(min, max time.Duration) *backoff { return &backoff{min: min, max: max} }

func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	} else if b.cur *= 2; b.cur > b.max {
		b.cur = b.max
	}
	return b.cur
}

func (b *backoff) reset() { b.cur = 0 }

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
