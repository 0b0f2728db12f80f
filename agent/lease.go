package agent

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/internal/backoff"
)

// leases are the agent's side of etcd: one session (one lease, one
// keep-alive) for all devices, a campaign per device for its lock
// (campaign.go), the token each lock gives and the regression guard
// against tokens not above one held or seen before, the release and new
// campaign after a refusal (recampaign.go), who else holds a lock
// (holder.go) and the lease-threat meters (tail.go). It tells the rest of
// the agent of lease changes through leaseHooks, and keeps the outbox's
// lease records through leaseStore; which device fields it writes is said
// on device.
//
// Its lock, mu, guards the session fields below and is never held with
// another lock. A device's lease state is under d.mu; install holds d.sem
// (the seq a resumed controller carries on with) around both, in turn.
type leases struct {
	cli     *clientv3.Client
	etcd    EtcdConfig
	gateway string // stamped on the lock keys this agent holds
	store   leaseStore
	hooks   leaseHooks
	// publishedReset returns the operator's fence reset of a device
	// published in etcd, verified (deviceAuth.publishedReset); nil: none.
	publishedReset func(ctx context.Context, dev string) (*auth.Reset, bool)
	log            *slog.Logger
	now            func() time.Time
	keep           *keeper            // the agent's trust; nil without auth.trust_root (untrusted.go)
	devices        map[string]*device // the agent's; read-only
	order          []string
	lossRule
	turns *turnWatch // the one watch the lock queues' waits share (turnwatch.go)

	// The turn writes waiting for a batch and the campaigns committing
	// batches (takeTurn, turn.go).
	turnMu      sync.Mutex
	turnQueue   []*turnReq
	turnLeaders int

	mu        sync.Mutex
	lease     clientv3.LeaseID // current session's lease, 0 if none
	lostLease clientv3.LeaseID // lease of the session last lost, to reattach to if it survived
	diskLease clientv3.LeaseID // lease of the previous run, from the outbox file; 0 once its fate is known
	resumed   clientv3.LeaseID // the previous run's lease, re-attached: its lock keys are ours again
	run       *sessionRun      // the session whose campaigns run now; nil between sessions
	sessions  uint64           // sessions opened so far
	sessionUp bool

	stats leaseCounters
	tails *tails // the lease-threat meters (tail.go)

	// Liveness and readiness for the service manager (systemd.go).
	beatAt       atomic.Int64  // now() in Unix ns at the session loop's last heartbeat; 0 before Run
	campaigning  chan struct{} // closed once the first session is open and its campaigns start
	campaignOnce sync.Once
}

// leaseCounters are the leases' running totals (Counters).
type leaseCounters struct {
	acquired, lost, regressions     atomic.Uint64
	outboxErr, reattached, released atomic.Uint64
	resets                          atomic.Uint64 // operator fence resets seen (reset.go)
	// untrusted counts the devices left because this gateway cannot
	// command them with trust, by reason (untrustReasons; untrusted.go).
	untrusted [untrustReasonsCount]atomic.Uint64
}

// leaseStore is the outbox's lease records (offline.Outbox): the session's
// lease, and per device the highest token held and the last seq issued
// under it, which survive a restart.
type leaseStore interface {
	SetLease(id int64) error
	Issued(device string) (fence.Token, uint64, error)
	SetHeld(device string, t fence.Token) error
	LowerHeld(device string, t fence.Token) error
}

// leaseHooks is what the leases tell the rest of the agent (Agent wires
// them to delivery and the twin reconciler).
type leaseHooks interface {
	// newToken: a controller under a new token (not a resumed lock key)
	// is about to become dev's; called before it is visible.
	newToken(dev string, token fence.Token)
	// acquired: d has a controller now.
	acquired(d *device)
	// heldElsewhere: another session holds d's lock; every token of ours
	// up to d.deposedAt is superseded.
	heldElsewhere(d *device)
	// raiseEpoch: d is at epoch e now (an operator's reset); false if it
	// was already, or could not be recorded (epoch.go).
	raiseEpoch(d *device, e uint64, why string, record bool) (bool, error)
}

// session returns the etcd session's state: whether one is open, its
// lease, and how many were opened.
func (l *leases) session() (up bool, lease clientv3.LeaseID, n uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sessionUp, l.lease, l.sessions
}

// lockPrefix is the etcd prefix of dev's lock (Agent.LockPrefix).
func (l *leases) lockPrefix(dev string) string {
	return l.etcd.Prefix + "/devices/" + dev + "/lock"
}

// holder returns the lock key and token of dev's current controller, if
// the agent holds dev (as Agent.Holding).
func (l *leases) holder(dev string) (key string, token fence.Token, ok bool) {
	d, ok := l.devices[dev]
	if !ok {
		return "", 0, false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if !l.usable(d.ctl) {
		return "", 0, false
	}
	return d.ctl.key, d.ctl.token, true
}

// runSessions is the session loop of Agent.Run: it opens a session, runs
// its campaigns until it ends, and opens the next, until ctx ends.
func (l *leases) runSessions(ctx context.Context) {
	// Jittered, so that the gateways that lost etcd together do not come
	// back to it in step.
	delay := backoff.Backoff{Min: 100 * time.Millisecond, Max: 5 * time.Second}
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		l.turns.run(ctx)
	}()
	defer func() { <-watched }()
	for ctx.Err() == nil {
		l.beat() // systemd.go: the watchdog's liveness probe
		sess, err := l.openSession(ctx)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			d := delay.Next()
			l.log.Warn("etcd session", "err", err, "retry_in", d)
			if !l.sleepBeating(ctx, d) {
				break
			}
			continue
		}
		delay.Reset()
		l.runSession(ctx, sess)
	}
}

// openSession grants a lease with a bounded wait (NewSession alone would wait
// for etcd forever) and starts its keep-alive.
func (l *leases) openSession(ctx context.Context) (*concurrency.Session, error) {
	gctx, cancel := context.WithTimeout(ctx, l.etcd.DialTimeout)
	defer cancel()
	if sess, err := l.reattach(gctx); sess != nil || err != nil {
		return sess, err
	}
	g, err := l.cli.Grant(gctx, l.sessionTTL())
	if err != nil {
		return nil, fmt.Errorf("grant lease: %w", err)
	}
	// Durable before any lock key exists under the lease: a run restarted
	// after a crash re-attaches to it (reattach).
	if err := l.store.SetLease(int64(g.ID)); err != nil {
		l.stats.outboxErr.Add(1)
		if _, rerr := l.cli.Revoke(gctx, g.ID); rerr != nil {
			l.log.Warn("revoke lease", "lease", fmt.Sprintf("%x", int64(g.ID)), "err", rerr)
		}
		return nil, fmt.Errorf("record lease: %w", err)
	}
	// The session's own context must outlive ctx, so that a clean shutdown
	// can still unlock and revoke; runSession closes the session.
	sess, err := concurrency.NewSession(l.cli, concurrency.WithLease(g.ID), concurrency.WithTTL(int(l.sessionTTL())))
	if err != nil {
		return nil, fmt.Errorf("start keep-alive: %w", err)
	}
	l.mu.Lock()
	l.lease, l.sessionUp = g.ID, true
	l.sessions++
	n := l.sessions
	l.mu.Unlock()
	l.log.Info("etcd session open", "lease", fmt.Sprintf("%x", int64(g.ID)), "ttl_s", l.sessionTTL(), "session", n)
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
func (l *leases) reattach(ctx context.Context) (*concurrency.Session, error) {
	l.mu.Lock()
	old, fromDisk := l.lostLease, l.lostLease != 0 && l.lostLease == l.diskLease
	l.mu.Unlock()
	if old == 0 {
		return nil, nil
	}
	// The lease lives on for about a TTL after etcd returns: do not let
	// the gRPC reconnect backoff, grown during the outage, eat it. Not at
	// the start of a run (fromDisk): there is no backoff yet, and gRPC's
	// ResetConnectBackoff reads the connection's map of subconnections
	// outside its lock while the balancer still fills it (a data race
	// the race detector reported in the chaos suite's kill-agent round).
	if cc := l.cli.ActiveConnection(); cc != nil && !fromDisk {
		cc.ResetConnectBackoff()
	}
	var opts []clientv3.LeaseOption
	if fromDisk {
		opts = append(opts, clientv3.WithAttachedKeys())
	}
	ttl, err := l.cli.TimeToLive(ctx, old, opts...)
	if err != nil {
		return nil, fmt.Errorf("lease %x time to live: %w", int64(old), err)
	}
	l.mu.Lock()
	l.lostLease, l.diskLease = 0, 0
	l.mu.Unlock()
	lease := fmt.Sprintf("%x", int64(old))
	switch {
	case ttl.TTL <= 0:
		l.log.Info("lost lease expired; opening a new session", "lease", lease, "previous_run", fromDisk)
		return nil, nil
	case fromDisk && ttl.GrantedTTL != l.sessionTTL():
		// lease_ttl changed since: a lease keeps the TTL it was granted
		// with, so do not carry the old one on. Revoking frees its locks.
		if _, err := l.cli.Revoke(ctx, old); err != nil {
			return nil, fmt.Errorf("revoke the previous run's lease %s: %w", lease, err)
		}
		l.log.Info("previous run's lease revoked: lease_ttl changed", "lease", lease, "granted_ttl_s", ttl.GrantedTTL, "ttl_s", l.sessionTTL())
		return nil, nil
	}
	sess, err := concurrency.NewSession(l.cli, concurrency.WithLease(old), concurrency.WithTTL(int(l.sessionTTL())))
	if err != nil {
		return nil, fmt.Errorf("start keep-alive: %w", err)
	}
	if fromDisk {
		l.sweepKeys(ctx, old, ttl.Keys)
	}
	l.mu.Lock()
	l.lease, l.sessionUp = old, true
	l.sessions++
	n := l.sessions
	if fromDisk {
		l.resumed = old
	}
	l.mu.Unlock()
	l.stats.reattached.Add(1)
	msg := "etcd session resumed: the lease survived"
	if fromDisk {
		msg = "etcd session resumed: the previous run's lease survived"
	}
	l.log.Info(msg, "lease", lease, "ttl_left_s", ttl.TTL, "session", n, "keys", len(ttl.Keys))
	return sess, nil
}

// sweepKeys deletes the lock keys the previous run held under lease for
// devices no longer in the configuration: nothing would ever release them
// while this run keeps the lease alive.
func (l *leases) sweepKeys(ctx context.Context, lease clientv3.LeaseID, keys [][]byte) {
	suffix := fmt.Sprintf("/lock/%x", int64(lease))
	pfx := l.etcd.Prefix + "/devices/"
	for _, k := range keys {
		id, ok := strings.CutPrefix(string(k), pfx)
		if !ok {
			continue
		}
		if id, ok = strings.CutSuffix(id, suffix); !ok || l.devices[id] != nil {
			continue
		}
		if _, err := l.cli.Delete(ctx, string(k)); err != nil {
			l.log.Warn("cannot delete the lock key of a device no longer configured", "key", string(k), "err", err)
			continue
		}
		l.log.Info("lock released: the device is no longer configured", "device", id, "key", string(k))
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
	ended bool // guarded by leases.mu; set before wg.Wait, so no Add races it
}

// runSession campaigns for all devices under sess until the session ends or
// ctx is done.
func (l *leases) runSession(ctx context.Context, sess *concurrency.Session) {
	sctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	slots := make(chan struct{}, campaignSlots)
	run := &sessionRun{sess: sess, ctx: sctx, slots: slots, wg: &wg}
	l.mu.Lock()
	l.run = run
	l.mu.Unlock()
	// Start a device's campaign only once it has a slot: at most
	// campaignSlots campaigns talk to etcd at once, and a campaign's
	// goroutine outlives its slot only while another agent holds the device.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for _, id := range l.order {
			if !acquireSlot(sctx, slots) {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				l.campaign(run, l.devices[id])
			}()
		}
	}()
	l.campaignOnce.Do(func() { close(l.campaigning) })
	// While the session lasts this goroutine beats every second
	// (systemd.go): the watchdog pings stop if it ever gets stuck.
	beat := time.NewTicker(heartbeatEvery)
	lost := false
wait:
	for {
		l.beat()
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
		l.dropSession(sess.Lease())
	}
	l.mu.Lock()
	run.ended = true
	l.run = nil
	l.mu.Unlock()
	cancel()
	l.turns.unpark(run) // the campaigns parked in a lock queue (turn.go)
	wg.Wait()

	l.mu.Lock()
	l.sessionUp = false
	l.mu.Unlock()
	if lost {
		l.log.Warn("etcd session lost; campaigning again", "lease", fmt.Sprintf("%x", int64(sess.Lease())))
		sess.Orphan()
		l.mu.Lock()
		l.lostLease = sess.Lease()
		l.mu.Unlock()
		return
	}
	l.release(sess)
}

// dropSession removes every controller that belongs to lease.
func (l *leases) dropSession(lease clientv3.LeaseID) {
	for _, id := range l.order {
		d := l.devices[id]
		d.mu.Lock()
		if d.ctl != nil && d.ctl.lease == lease && d.ctl.lost.Load() && !l.ignoresLoss() {
			// Already stopped by a fence point's refusal, its lock let
			// go: the device keeps the state that refusal gave it.
			d.ctl = nil
		} else if d.ctl != nil && d.ctl.lease == lease {
			if l.ignoresLoss() {
				// Keep the controller: the demo's frozen holder that never
				// noticed. Fence points must refuse it.
				l.log.Warn("lease lost", "device", d.id, "token", d.ctl.token, "reason", "etcd session lost (UNSAFE: the controller carries on)",
					"holder", l.gateway)
				d.mu.Unlock()
				continue
			}
			if !d.ctl.lost.Load() { // a stale verdict may have counted it
				l.stats.lost.Add(1)
			}
			if d.policy == PolicyAutonomous {
				// Keep commanding under the last token: the fence point
				// refuses it once a newer holder reaches the device.
				d.autonomy = true
				d.setStateLocked(StateAutonomous, "etcd session lost; autonomous policy: commands go on under the last token", l.now())
				l.log.Warn("lease lost", "device", d.id, "token", d.ctl.token,
					"reason", "etcd session lost; autonomous policy: commands go on under the last token", "holder", l.gateway)
				d.mu.Unlock()
				continue
			}
			l.log.Warn("lease lost", "device", d.id, "token", d.ctl.token, "reason", "etcd session lost", "holder", l.gateway)
			d.ctl.lost.Store(true)
			d.ctl = nil
			d.setStateLocked(StateLost, "etcd session lost", l.now())
		} else if d.ctl == nil {
			d.state, d.since = StateCampaigning, l.now()
		}
		d.mu.Unlock()
	}
}

// release revokes sess's lease, which deletes every device lock held under
// it, so that another gateway can take over at once instead of after the TTL.
func (l *leases) release(sess *concurrency.Session) {
	held := 0
	for _, id := range l.order {
		d := l.devices[id]
		d.mu.Lock()
		if d.ctl != nil && !d.ctl.lost.Load() {
			held++
			l.log.Info("lease released", "device", d.id, "token", d.ctl.token, "reason", "shutdown", "holder", l.gateway)
			d.ctl.lost.Store(true)
			d.ctl = nil
		}
		d.state, d.since = StateCampaigning, l.now()
		d.mu.Unlock()
	}
	// One revoke deletes every lock key of the lease in one revision: no
	// per-key Unlock, which took one round trip per device and made a large
	// fleet slow to exit (docs/BENCHMARKS.md §17).
	// Bounded by etcd.dial_timeout, as the unit's stop timeout expects.
	sess.Orphan() // stops the keep-alive
	ctx, cancel := context.WithTimeout(context.Background(), l.etcd.DialTimeout)
	defer cancel()
	if _, err := l.cli.Revoke(ctx, sess.Lease()); err != nil {
		l.log.Warn("revoke lease on shutdown", "err", err)
	}
	l.log.Info("released locks", "keys", held, "lease", fmt.Sprintf("%x", int64(sess.Lease())))
}

// sessionTTL is the lease TTL in whole seconds.
func (l *leases) sessionTTL() int64 { return int64(l.etcd.LeaseTTL / time.Second) }
