package agent

import (
	"fmt"
	"time"

	"github.com/edgefence/edgefence/agent/jobs"
	"github.com/edgefence/edgefence/fence"
)

// Status is a snapshot of the agent, as `edgefence status` shows it.
type Status struct {
	Gateway   string            `json:"gateway"`
	Etcd      EtcdStatus        `json:"etcd"`
	Transport map[string]any    `json:"transport,omitempty"`
	Bridge    any               `json:"bridge,omitempty"` // gateway fence bridge counters, on a home gateway
	Twins     *TwinStats        `json:"twins,omitempty"`  // the twin reconciler's counters, when it is on
	Jobs      *jobs.RunnerStats `json:"jobs,omitempty"`   // the firmware job runner's counters, when it is on
	Devices   []DeviceStatus    `json:"devices"`
	Counters  Counters          `json:"counters"`
	// LeaseTail: what threatens the lease, measured (tail.go).
	LeaseTail TailStatus `json:"lease_tail"`
	// DeviceAuth: the checks of signed acks and state reports, when a
	// device requires them (deviceauth.go).
	DeviceAuth *DeviceAuthStatus `json:"device_auth,omitempty"`
	// Trust: this gateway's own certificate and the trust it keeps, with
	// auth.trust_root (trust.go).
	Trust *TrustStatus `json:"trust,omitempty"`
}

// EtcdStatus describes the agent's session.
type EtcdStatus struct {
	Endpoints []string `json:"endpoints"`
	Session   bool     `json:"session"`         // a session is open
	Lease     string   `json:"lease,omitempty"` // its lease id, hex
	Sessions  uint64   `json:"sessions"`        // sessions opened since start
	TTL       string   `json:"ttl"`
}

// DeviceStatus describes one device.
type DeviceStatus struct {
	ID       string      `json:"id"`
	State    string      `json:"state"`
	Since    time.Time   `json:"since"`
	Reason   string      `json:"reason,omitempty"` // why the device entered its state (lost, refused, campaigning again); empty while holding
	Token    fence.Token `json:"token,omitempty"`  // current token while holding
	Seq      uint64      `json:"seq,omitempty"`    // last seq issued under it
	LockKey  string      `json:"lock_key,omitempty"`
	MaxToken fence.Token `json:"max_token_held,omitempty"`
	// FenceToken is the highest token a fence point of the device said it
	// holds (in a stale verdict): the figure the token regression runbook
	// needs.
	FenceToken fence.Token `json:"fence_token,omitempty"`
	// Epoch is the epoch its commands are stamped with (the fleet's, or
	// the one an operator's reset put the device in); tokens are
	// compared within it.
	Epoch uint64 `json:"epoch,omitempty"`
	// Holder is who holds the device's lock while another session does.
	Holder  *HolderStatus `json:"holder,omitempty"`
	LastAck *AckStatus    `json:"last_ack,omitempty"`
	Policy  string        `json:"policy"`
	Fence   string        `json:"fence"`            // fence point: device or gateway
	Home    string        `json:"home,omitempty"`   // home gateway of a fence: gateway device
	Queued  int           `json:"queued,omitempty"` // commands pending in the outbox
	Oldest  time.Time     `json:"oldest,omitzero"`  // creation time of the oldest pending command
	Auth    string        `json:"auth"`             // required (signed commands) or off (plain envelopes: warned, counted)
	// Verdicts counts the device's commands that ended, by verdict (the
	// per-device split of Counters' acks_*, commands_expired and
	// commands_superseded).
	Verdicts VerdictCounts `json:"verdicts"`
	// TwinDelta is the number of leaf fields in the device's twin delta
	// (desired not yet in reported) at the reconciler's last look; set
	// while twins are on and the agent holds the device.
	TwinDelta *int `json:"twin_delta_fields,omitempty"`
}

// HolderStatus is the owner of a device's lock, as a waiting agent last
// read it from etcd.
type HolderStatus struct {
	// Gateway is the gateway id on the lock key; empty for a holder that
	// writes none, such as `etcdctl lock` (maintenance).
	Gateway string      `json:"gateway"`
	Token   fence.Token `json:"token"` // the key's CreateRevision
	Key     string      `json:"key"`
	Since   time.Time   `json:"since"` // when this agent first saw it hold
}

// VerdictCounts are one device's commands that ended, per verdict.
type VerdictCounts struct {
	Accepted  uint64 `json:"accepted,omitempty"`
	Duplicate uint64 `json:"duplicate,omitempty"`
	Stale     uint64 `json:"stale,omitempty"`
	Invalid   uint64 `json:"invalid,omitempty"`
	Expired   uint64 `json:"expired,omitempty"`
	// Unknown: a gateway fence sent the command and the device never
	// answered; not repeated (fence.Unknown).
	Unknown uint64 `json:"unknown,omitempty"`
	// Superseded are commands the agent ended stale itself, never sent
	// (strict devices, once another session held the lock); Stale counts
	// only the fence point's stale verdicts.
	Superseded uint64 `json:"superseded,omitempty"`
}

// AckStatus is an Ack in JSON form.
type AckStatus struct {
	ID       string        `json:"id"`
	Verdict  fence.Verdict `json:"verdict"`
	Token    fence.Token   `json:"token"`
	Seq      uint64        `json:"seq"`
	MaxToken fence.Token   `json:"max_token"`
	LastSeq  uint64        `json:"last_seq"`
	Reason   string        `json:"reason,omitempty"`
	// Unsent: the agent ended the command itself without sending it
	// (expired, superseded); no fence point answered, so MaxToken and
	// LastSeq say nothing about the device.
	Unsent bool `json:"unsent,omitempty"`
}

// NewAckStatus converts an Ack for JSON output.
func NewAckStatus(a *fence.Ack) *AckStatus {
	if a == nil {
		return nil
	}
	return &AckStatus{ID: a.ID, Verdict: a.Verdict, Token: a.Token, Seq: a.Seq, MaxToken: a.MaxToken, LastSeq: a.LastSeq, Reason: a.Reason,
		Unsent: EndedUnsent(a)}
}

// EndedUnsent reports whether ack is one the agent made for a command it
// ended itself, without sending it: expired (its time to live passed in
// the outbox) or stale because another session's lock superseded it. No
// fence point gives either: fence.Admit answers stale only with a mark
// above the command's token (which is at least 1), so a stale ack with
// MaxToken 0 is the agent's, and expired is never a fence point's verdict.
func EndedUnsent(ack *fence.Ack) bool {
	return ack.Verdict == fence.Expired || (ack.Verdict == fence.Stale && ack.MaxToken == 0)
}

// Counters are the agent's running totals (they double as metrics).
type Counters struct {
	Sent        uint64 `json:"commands_sent"`
	NoAck       uint64 `json:"commands_no_ack"`
	SendErrors  uint64 `json:"send_errors"`
	Accepted    uint64 `json:"acks_accepted"`
	Duplicate   uint64 `json:"acks_duplicate"`
	Stale       uint64 `json:"acks_stale"`
	Invalid     uint64 `json:"acks_invalid"`
	Unknown     uint64 `json:"acks_unknown"` // a gateway fence's device never answered a command that may not be repeated
	Acquired    uint64 `json:"locks_acquired"`
	Lost        uint64 `json:"locks_lost"`
	Regressions uint64 `json:"token_regressions"`
	Released    uint64 `json:"locks_released"` // let go after a fence point or the regression guard refused the token
	Resets      uint64 `json:"fence_resets"`   // acks of operator fence resets seen (FenceResetAck)
	// With an outbox:
	Queued     uint64 `json:"commands_queued"`     // appended to the outbox
	Resent     uint64 `json:"commands_resent"`     // sent again after no ack (or after a restart)
	Expired    uint64 `json:"commands_expired"`    // ended as expired, never sent
	Full       uint64 `json:"outbox_full"`         // refused: an outbox limit was reached
	Reissued   uint64 `json:"commands_reissued"`   // re-queued under a newer token (reissue_kinds)
	Superseded uint64 `json:"commands_superseded"` // strict devices: never sent, ended stale once another session held the lock
	// TrustResent counts commands sent again after their fence point
	// refused them for want of this gateway's trust update.
	TrustResent uint64 `json:"commands_resent_after_trust"`
	OutboxErr   uint64 `json:"outbox_errors"`       // outbox reads or writes that failed
	Reattached  uint64 `json:"sessions_reattached"` // lost sessions resumed because the lease survived
	// APIRefused counts local API requests refused as bad input (oversized,
	// malformed, a body CBOR cannot carry, an unknown device); by reason in
	// edgefence_api_requests_refused_total.
	APIRefused uint64 `json:"api_requests_refused"`
	// Device state reports (MQTT state topic, twins on) that did not
	// decode and were dropped.
	StateMalformed uint64 `json:"state_reports_malformed"`
	// StateUnread: signed state reports nothing reads (twins off, no
	// firmware field), dropped without a verify.
	StateUnread uint64 `json:"state_reports_unread"`
}

// transportStatus is implemented by senders that can describe themselves.
type transportStatus interface {
	Status() map[string]any
}

// Status returns a snapshot of the agent.
func (a *Agent) Status() Status {
	s := Status{Gateway: a.cfg.Gateway}
	up, lease, n := a.leases.session()
	s.Etcd = EtcdStatus{Endpoints: a.cfg.Etcd.Endpoints, Session: up, Sessions: n, TTL: a.cfg.Etcd.LeaseTTL.String()}
	if up {
		s.Etcd.Lease = fmt.Sprintf("%x", int64(lease))
	}
	s.LeaseTail = a.leases.tails.status(a.cfg.Etcd.LeaseTTL, time.Now())
	if ts, ok := a.sender.(transportStatus); ok {
		s.Transport = ts.Status()
	}
	if a.bridge != nil {
		s.Bridge = a.bridge()
	}
	if a.twin != nil {
		ts := a.TwinStats()
		s.Twins = &ts
	}
	if js, ok := a.JobStats(); ok {
		s.Jobs = &js
	}
	s.DeviceAuth = a.devauth.status()
	s.Trust = a.trustStatus()
	var oldest map[string]time.Time // of each device's pending commands
	if sum, err := a.outbox.Summary(""); err == nil {
		oldest = make(map[string]time.Time, len(sum.Devices))
		for _, ds := range sum.Devices {
			oldest[ds.Device] = ds.Oldest
		}
	}
	for _, id := range a.order {
		d := a.devices[id]
		d.mu.Lock()
		ds := DeviceStatus{ID: id, State: d.state, Since: d.since, Reason: d.reason.current(d), MaxToken: d.maxToken, LastAck: NewAckStatus(d.lastAck),
			Policy: d.policy, Fence: d.fence, Home: d.home, Auth: d.auth, FenceToken: d.fenceMark, Epoch: d.epoch}
		if h := d.holder; h.key != "" && (d.ctl == nil || d.ctl.lost.Load()) {
			ds.Holder = &HolderStatus{Gateway: h.gateway, Token: h.token, Key: h.key, Since: h.since}
		}
		if d.ctl != nil {
			ds.Token, ds.LockKey = d.ctl.token, d.ctl.key
		}
		ctl := d.ctl
		d.mu.Unlock()
		if ctl != nil {
			// seq is guarded by the device's command semaphore; take it
			// briefly if free, else leave Seq out rather than block.
			select {
			case d.sem <- struct{}{}:
				ds.Seq = ctl.seq
				<-d.sem
			default:
			}
		}
		ds.Queued, _ = a.outbox.Pending(id)
		ds.Oldest = oldest[id]
		v := &d.verdicts
		ds.Verdicts = VerdictCounts{Accepted: v[0].Load(), Duplicate: v[1].Load(), Stale: v[2].Load(), Invalid: v[3].Load(), Expired: v[4].Load(), Unknown: v[5].Load(),
			Superseded: d.superseded.Load()}
		if a.twin != nil && a.usable(ctl) {
			n := a.twin.deltaFields(id)
			ds.TwinDelta = &n
		}
		s.Devices = append(s.Devices, ds)
	}
	a.leases.stats.fill(&s.Counters)
	a.delivery.stats.fill(&s.Counters)
	s.Counters.StateMalformed = a.reports.malformed.Load()
	s.Counters.StateUnread = a.reports.unread.Load()
	for _, n := range a.api.refusedCounts() {
		s.Counters.APIRefused += n
	}
	return s
}

// Holding reports the device's current token, if the agent holds it.
func (a *Agent) Holding(dev string) (fence.Token, bool) {
	_, token, ok := a.leases.holder(dev)
	return token, ok
}

// fill adds the leases' totals to n.
func (c *leaseCounters) fill(n *Counters) {
	n.Acquired, n.Lost, n.Regressions = c.acquired.Load(), c.lost.Load(), c.regressions.Load()
	n.Released, n.Reattached, n.Resets = c.released.Load(), c.reattached.Load(), c.resets.Load()
	n.OutboxErr += c.outboxErr.Load()
}

// fill adds delivery's totals to n.
func (c *deliveryCounters) fill(n *Counters) {
	n.Sent, n.NoAck, n.SendErrors = c.sent.Load(), c.noAck.Load(), c.sendErr.Load()
	n.Accepted, n.Duplicate, n.Stale, n.Invalid, n.Unknown = c.accepted.Load(), c.duplicate.Load(), c.stale.Load(), c.inv.Load(), c.unknown.Load()
	n.Queued, n.Resent, n.Expired, n.Full = c.queued.Load(), c.resent.Load(), c.expired.Load(), c.full.Load()
	n.Reissued, n.Superseded, n.TrustResent = c.reissued.Load(), c.superseded.Load(), c.trustRetried.Load()
	n.OutboxErr += c.outboxErr.Load()
}
