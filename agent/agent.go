package agent

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"go.etcd.io/bbolt"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgefence/edgefence/agent/jobs"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/history"
	"github.com/edgefence/edgefence/offline"
	"github.com/edgefence/edgefence/shadow"
)

// Sender delivers one envelope to its device's fence point and returns the
// fence point's Ack. It must return an error (and no Ack) when it cannot tell
// what happened, e.g. when no Ack arrived before ctx ended. The MQTT
// transport satisfies it.
type Sender interface {
	Send(ctx context.Context, env *fence.Envelope) (*fence.Ack, error)
}

// Options are the agent's optional knobs.
type Options struct {
	Logger *slog.Logger     // nil = discard
	Now    func() time.Time // nil = time.Now

	// UnsafeIgnoreSessionLoss switches off invariant I6: controllers keep
	// issuing commands under their old token after the session is lost,
	// like a process frozen before it could notice. Tests and the demo use
	// it to show that the fence points alone keep I1. Never in production.
	UnsafeIgnoreSessionLoss bool

	// BridgeStatus, if set, reports the gateway fence bridge's counters in
	// Status (the bridge runs beside the agent on a home gateway).
	BridgeStatus func() any

	// FenceTable, if set, is the gateway's fence table, served read-only
	// on the local API (GET /v1/fence, /v1/fence/{device}) for operators:
	// the agent holds the file's lock, so they cannot open it themselves.
	FenceTable FenceTable

	// OnHolding, if set, is called each time the agent starts holding a
	// device (a new lock, or a resumed one), with the token it commands
	// under: benchmarks and tests observe acquisitions through it, not
	// through log lines. It runs on the campaign's goroutine: keep it
	// quick.
	OnHolding func(device string, token fence.Token)

	// OnBurst, if set, is called when the agent starts work on many
	// devices at once (BurstDevices or more): a takeover's campaigns
	// resumed by one lease's expiry, a fan-out. edgefence run gives the
	// process every processor on it (internal/procs) instead of waiting
	// for its next look. It runs on the caller's goroutine: keep it quick.
	OnBurst func()

	// Outbox (required) makes every command durable before it is sent:
	// Send appends it, a per-device worker delivers the device's entries
	// in order (resending the same envelope until an ack comes), and the
	// ack is recorded as the entry's terminal state (invariant I4). A
	// caller whose Send times out gets ErrQueued: the command stays queued
	// and is delivered later. New fails with ErrNoOutbox without one.
	Outbox *offline.Outbox

	// History, if set, receives a "created" event for every command the
	// outbox accepts and a "terminal" event for every terminal state
	// (fault-injection tests check these against the fence points').
	History *history.Writer

	// Twins, if set, turns the twin reconciler on (twin.go): the agent
	// watches the desired states of its devices, sends each device it
	// holds its delta as a fenced twin.set command, and writes what the
	// device accepted to reported, fenced by its lock key (invariant I5).
	Twins *shadow.Store
	// TwinCache, if set (with Twins), keeps desired states for a start
	// without etcd and queues reported writes etcd could not take.
	TwinCache *shadow.Cache

	// TrustUpdates, if set, makes the agent publish trust updates (its
	// certificate, the newest revocation list) to its `auth: required`
	// devices: on acquiring each, before its first command, and to every
	// device it holds when the list changes (trustpush.go).
	TrustUpdates *TrustUpdates

	// TrustDB, if set, keeps the root-signed statements the agent learns
	// (certificates, revocation lists) durable, so that a restart — and
	// an etcd rebuilt without them — keeps them (trust.go). nil: memory
	// only. The agent does not close it.
	TrustDB *bbolt.DB

	// Jobs and Images, both set, turn the firmware job runner on
	// (fwjobs.go): the agent drives the firmware jobs of the devices it
	// holds, writing their executions in Jobs fenced by the lock key (I5)
	// and serving the images from Images (agent/images' cache).
	Jobs   jobs.Executions
	Images jobs.Images
}

// FenceTable is the read side of fence.Table the local API needs.
type FenceTable interface {
	List() ([]fence.Record, error)
	Get(device string) (fence.Record, bool, error)
}

// BurstDevices is how many devices at once make work a burst for
// Options.OnBurst: a fan-out to this many, or a takeover that resumes this
// many campaigns together. Below it the work is tens of ms of CPU (≈ 190
// µs a device in a fan-out, docs/BENCHMARKS.md §75): the governor's next
// look catches anything longer (§81).
const BurstDevices = 100

// Agent campaigns for its devices' locks and issues fenced commands for the
// devices it holds. Create it with New, run it with Run.
//
// It is a thin composition of parts, each with its own fields and lock,
// wired in New:
//
//   - leases (lease.go, campaign.go, recampaign.go, holder.go, tail.go,
//     systemd.go): the session, campaigns, tokens, the regression guard;
//     lock leases.mu. It tells delivery and the twins of lease changes
//     through leaseHooks (Agent implements them).
//   - delivery (send.go, outbox.go): issuing, the outbox workers, resend,
//     settle, expiry; locks delivery.expireMu, delivery.mu.
//     It tells the leases of a deposition through deposer.
//   - twins (twin.go): the twin reconciler, over twinHost; lock twins.mu.
//   - apiServer (api.go): the local API's handlers, over apiHost; no lock.
//   - stateReports (statereport.go): malformed report counts; a leaf lock.
//   - deviceAuth (deviceauth.go): the checks of acks and state reports of
//     `auth: required` devices; a leaf lock.
//   - jobs (fwjobs.go, agent/jobs): the firmware job runner, over jobHost
//     (holder, Send); started by the acquired hook, fed the devices' fw
//     reports; its locks are its own.
//
// They share the devices (device.go): device.mu guards one device's state,
// device.sem orders its seqs; device says which part writes which field.
//
// Lock order, where two nest: d.sem → delivery.expireMu → delivery.mu →
// d.mu. leases.mu is never held with another mutex (install takes it, and
// d.mu, in turn while it holds d.sem); twins.mu and stateReports.mu are
// leaves.
type Agent struct {
	cfg    Config
	cli    *clientv3.Client
	sender Sender
	log    *slog.Logger
	now    func() time.Time
	lossRule
	bridge func() any
	outbox *offline.Outbox // the durable queue; never nil
	onHold func(device string, token fence.Token)
	burst  func() // Options.OnBurst, or a no-op

	devices map[string]*device // fixed at New; the map is read-only after
	order   []string

	leases   *leases
	delivery *delivery
	twin     *twins     // nil: no twin reconciler
	api      *apiServer // the local API's handlers
	reports  stateReports
	keep     *keeper      // the operator's trust as this agent knows it; nil without auth.trust_root (trust.go)
	epochs   epochs       // the devices' epochs, kept in TrustDB (epoch.go)
	fleetAt  uint64       // the fleet's epoch the auth: required devices were moved to, at New
	repub    *republisher // puts keep's statements back into etcd; nil without keep (republish.go)
	trust    *trustPush   // nil: no trust updates (trustpush.go)
	devauth  *deviceAuth  // who speaks for a device: acks and state reports (deviceauth.go)
	jobs     *jobs.Runner // nil: no firmware jobs (fwjobs.go)
	fanout   fanoutStats  // fanout.go's counters
}

// New returns an agent for cfg (which must pass Validate; New fills in its
// defaults), using cli for locks and s to deliver commands.
func New(cfg *Config, cli *clientv3.Client, s Sender, o Options) (*Agent, error) {
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if o.Outbox == nil {
		return nil, fmt.Errorf("agent: %w", ErrNoOutbox)
	}
	a := &Agent{cfg: *cfg, cli: cli, sender: s, log: o.Logger, now: o.Now, lossRule: lossRule{o.UnsafeIgnoreSessionLoss}, bridge: o.BridgeStatus, outbox: o.Outbox, onHold: o.OnHolding, burst: o.OnBurst}
	if a.burst == nil {
		a.burst = func() {}
	}
	if a.log == nil {
		a.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if a.now == nil {
		a.now = time.Now
	}
	var err error
	if a.devices, a.order, err = newDevices(cfg.Devices, a.outbox, a.now); err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	if a.leases, err = a.newLeases(); err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	if o.UnsafeIgnoreSessionLoss && !unsafeBuild {
		return nil, fmt.Errorf("agent: UnsafeIgnoreSessionLoss: %w", ErrUnsafeBuild)
	}
	if o.Twins != nil {
		a.twin = newTwins(a, o.Twins, o.TwinCache)
	}
	a.jobs = a.newJobs(o)
	if a.keep, err = newKeeper(&a.cfg, o.TrustDB, a.log, a.now); err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	a.epochs.db = o.TrustDB
	if a.fleetAt, err = a.loadEpochs(); err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	a.devauth = newDeviceAuth(&a.cfg, a.keep, cli, a.log, a.now)
	a.leases.keep = a.keep
	if a.keep != nil && cli != nil {
		a.repub = &republisher{keep: a.keep, cli: cli, prefix: a.cfg.Etcd.Prefix, marker: republishedKey(a.cfg.Etcd.Prefix, a.cfg.Gateway),
			every: republishEvery}
	}
	a.devauth.install(s) // the transport itself: it checks acks before they resolve commands
	a.leases.publishedReset = a.devauth.publishedReset
	if s, err = a.withTrustUpdates(o.TrustUpdates, s); err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	a.delivery = &delivery{outbox: a.outbox, sender: s, hist: o.History, log: a.log, now: a.now, timeout: a.cfg.Command.Timeout,
		later:   a.cfg.Outbox.VerdictDelay == nil || *a.cfg.Outbox.VerdictDelay > 0,
		gateway: a.cfg.Gateway, devices: a.devices, leases: a.leases, lossRule: a.lossRule, waiters: make(map[string]chan *fence.Ack)}
	a.delivery.trust, a.delivery.auth, a.delivery.learnEpoch = a.trust, a.devauth, a.ackEpoch
	a.delivery.post, _ = s.(poster)
	a.delivery.postAbove = postAbove
	a.api = &apiServer{host: a, outbox: a.outbox, table: o.FenceTable, log: a.log}
	if a.ignoresLoss() {
		a.log.Warn("UNSAFE: session loss is ignored (I6 off); only for tests and demos")
	}
	return a, nil
}

// newLeases returns the agent's leases, with the lease-threat meters and
// the previous run's lease: Run re-attaches to it while it lives, so that
// the lock keys that run held do not lock this one out.
func (a *Agent) newLeases() (*leases, error) {
	l := &leases{cli: a.cli, etcd: a.cfg.Etcd, gateway: a.cfg.Gateway, store: a.outbox, hooks: a, log: a.log, now: a.now,
		devices: a.devices, order: a.order, lossRule: a.lossRule, tails: newTails(), campaigning: make(chan struct{}),
		turns: newTurnWatch(a.cli, a.cfg.Etcd.Prefix+"/devices/", a.log, a.burst)}
	if !a.outbox.ReadOnly() {
		l.tails.fsyncOn = true
		a.outbox.ObserveCommits(l.tails.observeFsync)
	}
	id, err := a.outbox.Lease()
	if err != nil {
		return nil, err
	}
	l.diskLease = clientv3.LeaseID(id)
	l.lostLease = l.diskLease
	return l, nil
}

// Run campaigns for every configured device until ctx ends. It opens one
// etcd session (one lease, one keep-alive stream) for all devices; when the
// session ends it stops that session's controllers at once, opens a new
// session and campaigns again. On return (ctx done) it has released every
// lock it held and revoked its lease. Run returns nil on a clean shutdown.
func (a *Agent) Run(ctx context.Context) error {
	defer a.leases.startTails(ctx)() // tail.go: the lease-threat meters
	defer a.startTrust(ctx)()        // trust.go
	// The workers stop when ctx ends (with the campaigns); Run returns
	// only once they have.
	defer goUnder(ctx, a.delivery.run)()
	if a.twin != nil {
		defer goUnder(ctx, a.twin.run)() // twin.go
	}
	if a.jobs != nil {
		defer goUnder(ctx, func(ctx context.Context) { _ = a.jobs.Run(ctx) })() // fwjobs.go; nil once ctx ends
	}
	a.leases.runSessions(ctx)
	return nil
}

// LockPrefix is the etcd prefix of the device's lock: its queue's keys
// live under it, one per campaigning session (the keys of
// concurrency.Mutex; turn.go).
func (a *Agent) LockPrefix(dev string) string { return a.leases.lockPrefix(dev) }

// Send issues one command to dev under the current token and returns the
// fence point's Ack. When an Ack arrived the error is ack.Err(), so callers
// can test errors.Is(err, fence.ErrStale) and still read the Ack. Without the
// lease it fails with ErrNotHolder and sends nothing. A command with no ack
// within the command timeout stays queued: the error wraps ErrNoAck and
// ErrQueued.
func (a *Agent) Send(ctx context.Context, dev, kind string, body []byte) (*fence.Ack, error) {
	p, err := a.Issue(ctx, dev, kind, body)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	return p.Wait(ctx)
}

// Issue issues one command to dev under the current token and stores it in
// the outbox (durably), as Send does, and returns without waiting for the
// device: p.Wait waits for its ack. A caller may issue several commands and
// then wait for their acks in order (the firmware runner's window of
// chunks): the device's worker still delivers them one at a time, in the
// order issued, each resent as the same envelope until it has a verdict;
// after a stale verdict the ones behind it end stale too (never applied).
// Without the lease it fails with ErrNotHolder and stores nothing.
func (a *Agent) Issue(ctx context.Context, dev, kind string, body []byte) (*Pending, error) {
	p, _, err := a.delivery.submit(ctx, dev, kind, body, true)
	return p, err
}

// IssueAll is Issue of several commands of one kind to dev: consecutive
// seqs under the current token, stored in one commit (one fsync), all or
// none; ps[i] waits for the ack of bodies[i]'s command.
func (a *Agent) IssueAll(ctx context.Context, dev, kind string, bodies [][]byte) ([]*Pending, error) {
	ps, _, err := a.delivery.submitAll(ctx, dev, kind, bodies, true)
	return ps, err
}

// Enqueue issues one command to dev under the current token, stores it in
// the outbox (durably) and returns its envelope without waiting for the
// device: its terminal state is recorded in the outbox (`edgefence outbox
// show ID`).
func (a *Agent) Enqueue(ctx context.Context, dev, kind string, body []byte) (*fence.Envelope, error) {
	_, env, err := a.delivery.submit(ctx, dev, kind, body, false)
	return env, err
}

// The leases' hooks (leaseHooks): the rest of the agent acts on a lease
// change.

// newToken: twins must not push what they queued under an older token.
func (a *Agent) newToken(dev string, token fence.Token) { a.twin.newToken(dev, token) }

// acquired: deliver d's queue and reconcile its twin under the new token,
// the trust update it is owed first.
func (a *Agent) acquired(d *device) {
	a.trust.acquired(d.id)
	a.delivery.kick(d)
	a.twin.kick(d.id)
	if a.jobs != nil {
		a.jobs.Acquired(d.id)
	}
	if a.onHold != nil {
		if _, token, ok := a.leases.holder(d.id); ok {
			a.onHold(d.id, token)
		}
	}
}

// heldElsewhere: d's queued commands of superseded tokens are let out to be
// ended as stale (delivery).
func (a *Agent) heldElsewhere(d *device) { a.delivery.kickPending(d) }

// holder returns the lock key and token of dev's current controller, if
// the agent holds dev (twinHost).
func (a *Agent) holder(dev string) (key string, token fence.Token, ok bool) {
	return a.leases.holder(dev)
}

// goUnder runs f on a goroutine of its own under a context derived from
// ctx; the func returned cancels it and waits for f to return.
func goUnder(ctx context.Context, f func(context.Context)) func() {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(ctx)
	}()
	return func() { cancel(); <-done }
}
