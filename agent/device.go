package agent

import (
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/offline"
)

// device is the agent's view of one configured device, shared by the
// agent's parts. The fields in the first group are fixed at New; the
// others are guarded by mu (the counters are atomics) and written as
// their groups say: leases own the lease state, delivery the queue state,
// and both write the fence points' news (settle, as verdicts arrive;
// heldElsewhere, when another session holds the lock). Status reads all.
type device struct {
	id      string
	sem     chan struct{} // serializes commands: seqs must reach the device in order (controller.seq)
	retry   chan struct{} // cuts a refusal's backoff short: what refused the device changed (cap 1; recampaign)
	policy  string        // PolicyStrict or PolicyAutonomous
	fence   string        // FenceDevice or FenceGateway
	home    string        // home gateway of a FenceGateway device
	auth    string        // AuthRequired or AuthOff
	reissue map[string]bool

	mu sync.Mutex

	// Lease state, written by leases only (campaign.go, lease.go).
	ctl      *controller // nil unless holding
	state    string      // campaigning, holding, lost, refused
	since    time.Time
	maxToken fence.Token // highest token this agent ever held for the device (durable in the outbox)
	reason   stateReason // why the device is in its state (lost, refused): setStateReason
	last     *controller // the last controller installed, kept after it is dropped
	autonomy bool        // the session is lost and ctl carries on under the autonomous policy
	holder   holderInfo  // the lock's owner while another session holds it (holder.go)

	// Queue state, written by delivery only (outbox.go).
	delivering, kicked bool
	inflight           string              // id of the entry the worker may have sent: never expired locally
	recording          map[string]struct{} // ids of the entries whose verdicts the worker is recording: never expired locally
	lastAck            *fence.Ack          // the verdict of the command that ended last
	fresh              *offline.Entry      // stored as the device's only pending entry, not yet handed to its worker (hint.go)
	handed             uint64              // the highest queue position next has handed the worker (hint.go)

	// The fence points' news, written by both.
	epoch     uint64      // the epoch its commands are stamped with (epoch.go; Agent.raiseEpoch)
	untrusted string      // why this gateway's own certificate does not let it command the device, while it does not (untrusted.go; leases)
	deposedAt fence.Token // highest token of ours refused as stale (delivery) or superseded by another session (leases)
	fenceMark fence.Token // highest token a fence point of the device said it holds (stale acks; delivery)
	refusals  int         // locks released after a refusal (leases) since the last accepted command (delivery): the backoff's exponent

	// verdicts counts the device's commands that ended, per verdict
	// (verdictNames order): edgefence_device_commands_total. Delivery.
	verdicts [len(verdictNames)]atomic.Uint64
	// superseded counts the device's commands ended stale by the agent,
	// never sent (commands_superseded per device). Delivery.
	superseded atomic.Uint64
}

// verdictNames are the terminal verdicts the agent counts, globally and
// per device, in the order of device.verdicts.
var verdictNames = [...]string{"accepted", "duplicate", "stale", "invalid", "expired", "unknown"}

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
	case fence.Unknown:
		return 5
	default:
		return 3
	}
}

// controller is the right to command one device under one token. Leases
// make it and mark it lost; delivery issues its seqs.
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
	StateUntrusted   = "untrusted"   // this gateway cannot command the device with trust: the lock is let go (untrusted.go)
)

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

// heldTokens is where the durable regression guard is read: the highest
// token any run of this agent held for a device (offline.Outbox).
type heldTokens interface {
	Held(device string) (fence.Token, error)
}

// newDevices returns the configured devices, keyed by id, and their ids in
// configuration order, each campaigning since now and with the highest
// token any run of this agent held for it.
func newDevices(cfgs []DeviceConfig, held heldTokens, now func() time.Time) (map[string]*device, []string, error) {
	devices := make(map[string]*device, len(cfgs))
	order := make([]string, 0, len(cfgs))
	for _, d := range cfgs {
		dev := &device{id: d.ID, sem: make(chan struct{}, 1), retry: make(chan struct{}, 1), state: StateCampaigning, since: now(), policy: d.Policy, fence: d.Fence, home: d.Home, auth: d.Auth}
		if len(d.ReissueKinds) > 0 {
			dev.reissue = make(map[string]bool, len(d.ReissueKinds))
			for _, k := range d.ReissueKinds {
				dev.reissue[k] = true
			}
		}
		t, err := held.Held(d.ID)
		if err != nil {
			return nil, nil, err
		}
		dev.maxToken = t
		devices[d.ID] = dev
		order = append(order, d.ID)
	}
	return devices, order, nil
}
