package agent

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

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
}

// FenceTable is the read side of fence.Table the local API needs.
type FenceTable interface {
	List() ([]fence.Record, error)
	Get(device string) (fence.Record, bool, error)
}

// Agent campaigns for its devices' locks and issues fenced commands for the
// devices it holds. Create it with New, run it with Run.
//
// Its parts, one file each: leases (lease.go, recampaign.go, holder.go:
// the session, campaigns, tokens, the regression guard; a.mu), delivery
// (outbox.go: the outbox workers, resend, settle; a.wmu, a.expireMu), the
// twin reconciler (twin.go: its own type, twins, with its own lock) and
// the local API (api.go). device.mu guards one device's lease state;
// device.sem orders its seqs.
//
// Lock order, where two nest: d.sem → a.expireMu → a.wmu → d.mu. a.mu is
// never held with another lock; twins.mu and stateReports.mu are leaves.
type Agent struct {
	cfg    Config
	cli    *clientv3.Client
	sender Sender
	log    *slog.Logger
	now    func() time.Time
	lossRule
	bridge   func() any
	outbox   *offline.Outbox // the durable queue; never nil
	delivery *delivery       // the outbox's workers (outbox.go, send.go)
	twin     *twins          // nil: no twin reconciler
	api      *apiServer      // the local API's handlers (api.go)

	devices map[string]*device // fixed at New; the map is read-only after
	order   []string

	mu        sync.Mutex
	lease     clientv3.LeaseID // current session's lease, 0 if none
	lostLease clientv3.LeaseID // lease of the session last lost, to reattach to if it survived
	diskLease clientv3.LeaseID // lease of the previous run, from the outbox file; 0 once its fate is known
	resumed   clientv3.LeaseID // the previous run's lease, re-attached: its lock keys are ours again
	run       *sessionRun      // the session whose campaigns run now; nil between sessions
	sessions  uint64           // sessions opened so far
	sessionUp bool

	stats   counters
	reports stateReports // malformed device state reports (statereport.go)
	tails   *tails       // the lease-threat meters (tail.go)

	// Liveness and readiness for the service manager (systemd.go).
	beatAt       atomic.Int64  // a.now() in Unix ns at the Run loop's last heartbeat; 0 before Run
	campaigning  chan struct{} // closed once the first session is open and its campaigns start
	campaignOnce sync.Once
}

type counters struct {
	acquired, lost, regressions     atomic.Uint64
	outboxErr, reattached, released atomic.Uint64
}

// device is the agent's view of one configured device.
type device struct {
	id      string
	sem     chan struct{} // serializes commands: seqs must reach the device in order
	policy  string        // PolicyStrict or PolicyAutonomous
	fence   string        // FenceDevice or FenceGateway
	home    string        // home gateway of a FenceGateway device
	reissue map[string]bool

	mu       sync.Mutex
	ctl      *controller // nil unless holding
	state    string      // campaigning, holding, lost, refused
	since    time.Time
	maxToken fence.Token // highest token this agent ever held for the device (durable with an outbox)
	lastAck  *fence.Ack
	reason   stateReason // why the device is in its state (lost, refused): setStateReason
	last     *controller // the last controller installed, kept after it is dropped
	autonomy bool        // the session is lost and ctl carries on under the autonomous policy

	// Outbox delivery (outbox.go).
	delivering, kicked bool
	inflight           string      // id of the entry the worker may have sent: never expired locally
	deposedAt          fence.Token // highest token of ours a fence point refused as stale

	// The lease's story for an operator (status.go).
	fenceMark fence.Token // highest token a fence point of the device said it holds (stale acks)
	refusals  int         // locks released after a refusal since the last accepted command: the backoff's exponent
	holder    holderInfo  // the lock's owner while another session holds it

	// verdicts counts the device's commands that ended, per verdict
	// (verdictNames order): edgefence_device_commands_total.
	verdicts [len(verdictNames)]atomic.Uint64
	// superseded counts the device's commands ended stale by the agent,
	// never sent (commands_superseded per device).
	superseded atomic.Uint64
}

// verdictNames are the terminal verdicts the agent counts, globally and
// per device, in the order of device.verdicts.
var verdictNames = [...]string{"accepted", "duplicate", "stale", "invalid", "expired"}

// verdictIndex is v's index in verdictNames; every verdict a fence point
// gives that is not accepted, duplicate or stale counts as invalid.
func verdictIndex(v fence.Verdict) int {
	switch v {
	case fence.Accepted:
		return 0
	case fence.Duplicate:
		return 1
	case fence.Stale:
		return 2
	case fence.Expired:
		return 4
	default:
		return 3
	}
}

// controller is the right to command one device under one token.
type controller struct {
	token fence.Token
	key   string
	lease clientv3.LeaseID
	seq   uint64 // last seq issued under token; guarded by device.sem
	lost  atomic.Bool
}

// Device states reported by Status.
const (
	StateCampaigning = "campaigning" // waiting for the lock (another holder, or starting)
	StateHolding     = "holding"     // holds the lock; commands are issued under its token
	StateLost        = "lost"        // the session ended; no commands until re-acquired
	StateRefused     = "refused"     // token regression: etcd granted a token not above one the device or this agent saw before
	StateAutonomous  = "autonomous"  // session lost; commands go on under the last token (policy autonomous)
)

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
	a := &Agent{cfg: *cfg, cli: cli, sender: s, log: o.Logger, now: o.Now, lossRule: lossRule{o.UnsafeIgnoreSessionLoss}, bridge: o.BridgeStatus, outbox: o.Outbox,
		devices: make(map[string]*device, len(cfg.Devices)), campaigning: make(chan struct{})}
	if a.log == nil {
		a.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	a.tails = newTails()
	if !a.outbox.ReadOnly() {
		a.tails.fsyncOn = true
		a.outbox.ObserveCommits(a.tails.observeFsync)
	}
	if a.now == nil {
		a.now = time.Now
	}
	for _, d := range cfg.Devices {
		dev := &device{id: d.ID, sem: make(chan struct{}, 1), state: StateCampaigning, since: a.now(), policy: d.Policy, fence: d.Fence, home: d.Home}
		if len(d.ReissueKinds) > 0 {
			dev.reissue = make(map[string]bool, len(d.ReissueKinds))
			for _, k := range d.ReissueKinds {
				dev.reissue[k] = true
			}
		}
		// The durable regression guard: the highest token any run of
		// this agent held for the device.
		t, err := a.outbox.Held(d.ID)
		if err != nil {
			return nil, fmt.Errorf("agent: %w", err)
		}
		dev.maxToken = t
		a.devices[d.ID] = dev
		a.order = append(a.order, d.ID)
	}
	// The previous run's lease: Run re-attaches to it while it lives, so
	// that the lock keys that run held do not lock this one out.
	id, err := a.outbox.Lease()
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	a.diskLease = clientv3.LeaseID(id)
	a.lostLease = a.diskLease
	if o.UnsafeIgnoreSessionLoss && !unsafeBuild {
		return nil, fmt.Errorf("agent: UnsafeIgnoreSessionLoss: %w", ErrUnsafeBuild)
	}
	if o.Twins != nil {
		a.twin = newTwins(a, o.Twins, o.TwinCache)
	}
	a.delivery = &delivery{outbox: a.outbox, sender: s, hist: o.History, log: a.log, now: a.now, timeout: a.cfg.Command.Timeout,
		gateway: a.cfg.Gateway, devices: a.devices, leases: a, lossRule: a.lossRule, waiters: make(map[string]chan *fence.Ack)}
	a.api = &apiServer{host: a, outbox: a.outbox, table: o.FenceTable, log: a.log}
	if a.ignoresLoss() {
		a.log.Warn("UNSAFE: session loss is ignored (I6 off); only for tests and demos")
	}
	return a, nil
}

// LockPrefix is the etcd prefix of the device's lock: the concurrency.Mutex
// keys live under it, one per campaigning session.
func (a *Agent) LockPrefix(dev string) string {
	return a.cfg.Etcd.Prefix + "/devices/" + dev + "/lock"
}

// Send issues one command to dev under the current token and returns the
// fence point's Ack. When an Ack arrived the error is ack.Err(), so callers
// can test errors.Is(err, fence.ErrStale) and still read the Ack. Without the
// lease it fails with ErrNotHolder and sends nothing. A command with no ack
// within the command timeout stays queued: the error wraps ErrNoAck and
// ErrQueued.
func (a *Agent) Send(ctx context.Context, dev, kind string, body []byte) (*fence.Ack, error) {
	ack, _, err := a.delivery.submit(ctx, dev, kind, body, true)
	return ack, err
}

// Enqueue issues one command to dev under the current token, stores it in
// the outbox (durably) and returns its envelope without waiting for the
// device: its terminal state is recorded in the outbox (`edgefence outbox
// show ID`).
func (a *Agent) Enqueue(ctx context.Context, dev, kind string, body []byte) (*fence.Envelope, error) {
	_, env, err := a.delivery.submit(ctx, dev, kind, body, false)
	return env, err
}

// setStateReason records a device state change if ctl is still the
// device's controller (or ctl is nil), with the reason the device entered
// it (lost, refused), which Status shows while the device stays in it.
func (a *Agent) setStateReason(d *device, ctl *controller, state, reason string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if ctl != nil && d.ctl != ctl {
		return
	}
	d.setStateLocked(state, reason, a.now())
}

// setStateLocked moves d to state, giving the reason; d.mu is held. A
// reason belongs to the state and the moment it was given (stateReason),
// so the places that set d.state directly need not clear it.
func (d *device) setStateLocked(state, reason string, now time.Time) {
	if d.state != state {
		d.state, d.since = state, now
	}
	d.reason = stateReason{state: state, since: d.since, text: reason}
}

// stateReason is why a device entered a state.
type stateReason struct {
	state string
	since time.Time
	text  string
}

// current returns the reason if it was given for d's current state.
func (r stateReason) current(d *device) string {
	if r.state != d.state || !r.since.Equal(d.since) {
		return ""
	}
	return r.text
}

// sessionTTL is the lease TTL in whole seconds.
func (a *Agent) sessionTTL() int64 { return int64(a.cfg.Etcd.LeaseTTL / time.Second) }
