package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/shadow"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// Only the device speaks for itself (invariant I7): for an `auth: required`
// device, an ack resolves a command only if the device's enrolled key
// signed it (auth.VerifyAck) and it answers that very command (device,
// command id, token, seq: auth.BoundTo); a state report reaches the twin
// only if the device's key signed it and it is newer than the last one
// (mark and counter: auth.StateReport.After), and not older than the mark
// the device's last verified ack gave. Anything else is dropped, counted by
// reason (edgefence_acks_unauthenticated_total,
// edgefence_state_reports_unauthenticated_total) and logged at WARN, one
// line per device per malformedLogEvery. The check runs before the ack is
// matched to its command (mqtt.Commander.CheckAcksWith), so a forged ack
// racing the device's own is dropped and the device's resolves the
// command. `auth: off` devices keep plain acks and reports.
//
// Who speaks for a device: its device key (auth.RoleDevice), certified by
// the operator's root (auth.trust_root) and published at
// <etcd prefix>/trust/devices/<device> (`edgefence keys enrol`); for a
// `fence: gateway` device its home gateway's table answers, so a gateway
// key certified for the device (auth.GatewayAcks) — read from
// <etcd prefix>/trust/certs/ or auth.certificate. Certificates are read
// from etcd when a device's ack or report names a key not known yet (at
// most once per device per rereadEvery), so an enrolment or a renewal is
// picked up without a restart. etcd only holds root-signed statements:
// tampering with it can deny, never forge.

// rereadEvery bounds how often one device's certificates are re-read from
// etcd, so that forged acks under unknown key ids cannot flood etcd.
const rereadEvery = time.Second

// rereadTimeout bounds one re-read (it runs on the MQTT delivery goroutine).
const rereadTimeout = 2 * time.Second

// deviceAuthRefusals are the reasons an ack or a state report is refused,
// the metrics' reason label.
var deviceAuthRefusals = [...]string{"unsigned", "malformed", "algorithm", "unknown_key", "wrong_role", "not_authorised",
	"revoked", "expired", "bad_signature", "not_bound", "replayed", "no_trust_root"}

var (
	errReplayed    = errors.New("state report not newer than the last one")
	errNoTrustRoot = errors.New("auth.trust_root is not set: nothing a device signs can be verified")
)

// refusalIndex is the deviceAuthRefusals index of err.
func refusalIndex(err error) int {
	for i, e := range [...]error{auth.ErrUnsigned, auth.ErrMalformed, auth.ErrAlgorithm, auth.ErrUnknownKey, auth.ErrWrongRole,
		auth.ErrNotAuthorised, auth.ErrRevoked, auth.ErrExpired, auth.ErrBadSignature, auth.ErrNotBound, errReplayed, errNoTrustRoot} {
		if errors.Is(err, e) {
			return i
		}
	}
	return 1 // malformed
}

// deviceAuth checks acks and state reports of `auth: required` devices.
// Its methods are safe for concurrent use; mu is a leaf lock.
type deviceAuth struct {
	log      *slog.Logger
	now      func() time.Time
	trust    *auth.Trust // keep's; nil: no auth.trust_root
	keep     *keeper
	cli      *clientv3.Client
	prefix   string          // etcd prefix
	required map[string]bool // auth: required devices
	bridged  map[string]bool // fence: gateway devices: their home gateway's key signs their acks

	acksRefused, statesRefused [len(deviceAuthRefusals)]atomic.Uint64
	logs                       logLimit

	mu      sync.Mutex
	readAt  map[string]time.Time         // last etcd read per device
	noCert  map[string]bool              // required devices etcd had no certificate for at the last read
	reports map[string]*auth.StateReport // newest accepted per device
	marks   map[string]fence.State       // the epoch and mark of the device's last verified ack
	// unverified counts, per device, the acks refused for the command
	// it was last sent, until one verifies (untrusted.go).
	unverified map[string]unverifiedAcks
}

// unverifiedAcks are the refused acks of one command.
type unverifiedAcks struct {
	id   string
	n    int
	last error
}

// noteUnverified counts an ack for env that did not verify.
func (k *deviceAuth) noteUnverified(env *fence.Envelope, err error) {
	if errors.Is(err, auth.ErrNotBound) {
		return // an ack of another command (a replay): says nothing of this one
	}
	k.mu.Lock()
	u := k.unverified[env.Device]
	if u.id != env.ID {
		u = unverifiedAcks{id: env.ID}
	}
	u.n++
	u.last = err
	k.unverified[env.Device] = u
	k.mu.Unlock()
}

// unverifiedFor returns how many acks for command id of dev were refused
// since the device's last verified ack, and the last reason (nil-safe).
func (k *deviceAuth) unverifiedFor(dev, id string) (int, error) {
	if k == nil {
		return 0, nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if u := k.unverified[dev]; u.id == id {
		return u.n, u.last
	}
	return 0, nil
}

// newDeviceAuth returns the checks for cfg's devices, with the agent's
// trust (nil: no auth.trust_root).
func newDeviceAuth(cfg *Config, keep *keeper, cli *clientv3.Client, log *slog.Logger, now func() time.Time) *deviceAuth {
	k := &deviceAuth{log: log, now: now, cli: cli, prefix: cfg.Etcd.Prefix, required: map[string]bool{}, bridged: map[string]bool{},
		readAt: map[string]time.Time{}, noCert: map[string]bool{}, reports: map[string]*auth.StateReport{},
		marks: map[string]fence.State{}, unverified: map[string]unverifiedAcks{}}
	var required []string
	for _, d := range cfg.Devices {
		if d.Auth == AuthRequired {
			k.required[d.ID] = true
			required = append(required, d.ID)
		}
		k.bridged[d.ID] = d.Fence == FenceGateway
	}
	if keep == nil {
		if len(required) > 0 {
			log.Error("auth: required devices' acks and state reports cannot be verified without auth.trust_root: their commands will never resolve",
				"devices", required)
		}
		return k
	}
	k.keep, k.trust = keep, keep.t
	return k
}

// ackChecker is implemented by senders that let the agent check each ack
// before it may resolve a command (mqtt.Commander).
type ackChecker interface {
	CheckAcksWith(check mqtt.AckCheck)
}

// install makes s check every ack with checkAck. A sender that cannot
// (an in-process one) resolves commands with whatever it returns: an
// `auth: required` device's acks then go unchecked, which is logged.
func (k *deviceAuth) install(s Sender) {
	if c, ok := s.(ackChecker); ok {
		c.CheckAcksWith(k.checkAck)
		return
	}
	if len(k.required) > 0 {
		k.log.Warn("auth: this sender cannot check acks before they resolve commands; acks of auth: required devices go unverified")
	}
}

// keysFor returns who may speak for dev.
func (k *deviceAuth) keysFor(dev string) (auth.DeviceKeys, error) {
	if k.trust == nil {
		return nil, fmt.Errorf("%w: %w", fence.ErrInvalid, errNoTrustRoot)
	}
	if k.bridged[dev] {
		return auth.GatewayAcks{Keys: k.trust}, nil
	}
	return k.trust, nil
}

// verify runs check with dev's keys; if it fails for a key not known (or
// no longer valid) it re-reads dev's certificates from etcd once and runs
// it again.
func (k *deviceAuth) verify(dev string, check func(auth.DeviceKeys) error) error {
	keys, err := k.keysFor(dev)
	if err != nil {
		return err
	}
	err = check(keys)
	if (errors.Is(err, auth.ErrUnknownKey) || errors.Is(err, auth.ErrExpired)) && k.reread(dev) {
		err = check(keys)
	}
	return err
}

// checkAck is the mqtt.AckCheck: the ack in raw, if it may resolve env.
func (k *deviceAuth) checkAck(env *fence.Envelope, raw []byte) (*fence.Ack, error) {
	if !k.required[env.Device] {
		return auth.ClaimedAck(raw)
	}
	var v *auth.VerifiedAck
	err := k.verify(env.Device, func(keys auth.DeviceKeys) (err error) {
		v, err = auth.VerifyAck(raw, keys)
		return err
	})
	if err == nil {
		err = auth.BoundTo(v.Ack, env)
	}
	if err != nil {
		k.refused(&k.acksRefused, "ack", env.Device, err, "id", env.ID, "token", env.Token, "seq", env.Seq)
		k.noteUnverified(env, err)
		return nil, err
	}
	k.mu.Lock()
	if m := v.Ack.State(); stateBelow(k.marks[env.Device], m) {
		k.marks[env.Device] = m
	}
	delete(k.unverified, env.Device)
	k.mu.Unlock()
	return v.Ack, nil
}

// checkReset is checkAck for the ack of an operator's fence reset, which
// answers no command of ours: signed by a key that speaks for dev, naming
// dev and the reset id the unverified ack claimed.
func (k *deviceAuth) checkReset(dev, id string, raw []byte) (*fence.Ack, error) {
	var v *auth.VerifiedAck
	err := k.verify(dev, func(keys auth.DeviceKeys) (err error) {
		v, err = auth.VerifyAck(raw, keys)
		return err
	})
	if err == nil && (v.Ack.Device != dev || v.Ack.ID != id) {
		err = fmt.Errorf("%w: %w: reset ack names %s/%s, arrived for %s/%s", fence.ErrInvalid, auth.ErrNotBound, v.Ack.Device, v.Ack.ID, dev, id)
	}
	if err != nil {
		k.refused(&k.acksRefused, "reset ack", dev, err, "id", id)
		return nil, err
	}
	return v.Ack, nil
}

// publishedReset returns the operator's fence reset of dev that `edgefence
// fence reset` published at <prefix>/trust/resets/<dev>, if it verifies
// against the trust root (none without auth.trust_root).
func (k *deviceAuth) publishedReset(ctx context.Context, dev string) (*auth.Reset, bool) {
	if k.trust == nil || k.cli == nil {
		return nil, false
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	key := TrustResetKey(k.prefix, dev)
	resp, err := k.cli.Get(ctx, key)
	if err != nil || len(resp.Kvs) == 0 {
		return nil, false
	}
	r, err := k.trust.VerifyReset(resp.Kvs[0].Value, dev)
	if err != nil {
		k.log.Warn("fence reset in etcd refused: not the operator root's for this device", "device", dev, "key", key, "err", err)
		return nil, false
	}
	return r, true
}

// checkState returns the state of the signed report payload from dev if
// dev's key signed it and it is newer than what was accepted before. ok
// is false if dev's reports are not checked (auth: off, unknown devices).
func (k *deviceAuth) checkState(dev string, payload []byte) (fields map[string]any, ok bool, err error) {
	if !k.required[dev] {
		return nil, false, nil
	}
	var v *auth.VerifiedState
	err = k.verify(dev, func(keys auth.DeviceKeys) (err error) {
		v, err = auth.VerifyState(payload, keys)
		return err
	})
	if err == nil && v.Report.Device != dev {
		err = fmt.Errorf("%w: %w: report of %s on %s's topic", fence.ErrInvalid, auth.ErrNotBound, v.Report.Device, dev)
	}
	if err == nil {
		err = k.newer(v.Report)
	}
	if err == nil {
		fields, err = shadow.DecodeCBOR(v.Report.State, shadow.Limits{})
		if err != nil {
			err = fmt.Errorf("%w: %w", auth.ErrMalformed, err)
		}
	}
	if err != nil {
		k.refused(&k.statesRefused, "state report", dev, err, "bytes", len(payload))
		return nil, true, err
	}
	return fields, true, nil
}

// newer takes r as dev's newest report if it is newer than the last one
// accepted and not below the mark of the device's last verified ack.
func (k *deviceAuth) newer(r *auth.StateReport) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if last := k.reports[r.Device]; last != nil && !r.After(last) {
		return fmt.Errorf("%w: %w: mark %v counter %d, last %v counter %d", fence.ErrInvalid, errReplayed, r.Mark(), r.Counter, last.Mark(), last.Counter)
	}
	if m := k.marks[r.Device]; stateBelow(r.FenceState(), m) {
		return fmt.Errorf("%w: %w: mark %v in epoch %d below the device's last acked mark %v in epoch %d", fence.ErrInvalid, errReplayed,
			r.Mark(), r.Epoch, m.Mark, m.Epoch)
	}
	k.reports[r.Device] = r
	return nil
}

// markBelow reports whether mark a is below b.
// stateBelow reports whether a is below b: a lower epoch, or the same
// epoch and a lower mark.
func stateBelow(a, b fence.State) bool {
	if a.Epoch != b.Epoch {
		return a.Epoch < b.Epoch
	}
	return a.Mark.Token < b.Mark.Token || a.Mark.Token == b.Mark.Token && a.Mark.Seq < b.Mark.Seq
}

// refused counts and logs (rate-limited per device) a refused ack or report.
func (k *deviceAuth) refused(counts *[len(deviceAuthRefusals)]atomic.Uint64, what, dev string, err error, args ...any) {
	i := refusalIndex(err)
	counts[i].Add(1)
	suppressed, ok := k.logs.allow(what+"\x00"+dev, k.now())
	if !ok {
		return
	}
	k.log.Warn("unauthenticated "+what+" dropped: it resolves nothing", append([]any{"device", dev, "reason", deviceAuthRefusals[i],
		"err", err, "suppressed", suppressed}, args...)...)
}

// reread reads dev's certificates from etcd (the device's own; for a
// `fence: gateway` device the gateways'; the revocation list), at most
// once per rereadEvery. It reports whether it read anything new.
func (k *deviceAuth) reread(dev string) bool {
	if k.cli == nil || k.trust == nil {
		return false
	}
	now := k.now()
	k.mu.Lock()
	if now.Sub(k.readAt[dev]) < rereadEvery {
		k.mu.Unlock()
		return false
	}
	k.readAt[dev] = now
	k.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), rereadTimeout)
	defer cancel()
	key := TrustDeviceKey(k.prefix, dev)
	ops := []clientv3.Op{clientv3.OpGet(key), clientv3.OpGet(TrustRevocationsKey(k.prefix))}
	if k.bridged[dev] {
		ops = append(ops, clientv3.OpGet(TrustCertKey(k.prefix, ""), clientv3.WithPrefix(), clientv3.WithLimit(1024)))
	}
	resp, err := k.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		k.log.Warn("auth: cannot read device certificates from etcd", "device", dev, "key", key, "err", err)
		return false
	}
	added := 0
	for _, r := range resp.Responses {
		for _, kv := range r.GetResponseRange().Kvs {
			st, news, err := k.keep.learn(kv.Value, "etcd "+string(kv.Key))
			switch {
			case err != nil:
				k.log.Warn("auth: trust statement in etcd refused", "key", string(kv.Key), "err", err)
			case news && st.Certificate != nil:
				added++
			}
		}
	}
	missing := !k.bridged[dev] && len(resp.Responses[0].GetResponseRange().Kvs) == 0
	k.mu.Lock()
	was := k.noCert[dev]
	k.noCert[dev] = missing
	k.mu.Unlock()
	if missing && !was {
		k.log.Error("auth: required device has no device certificate: its acks and state reports cannot be verified and never resolve a command; enrol it (edgefence keys enrol)",
			"device", dev, "key", key)
	}
	return added > 0
}

// DeviceAuthStatus describes the checks of acks and state reports.
type DeviceAuthStatus struct {
	TrustRoot bool `json:"trust_root"` // auth.trust_root set: signed acks and reports can be verified
	// Required devices whose certificate etcd did not have at the last read.
	WithoutCertificate []string          `json:"devices_without_certificate,omitempty"`
	AcksRefused        map[string]uint64 `json:"acks_refused,omitempty"`
	StatesRefused      map[string]uint64 `json:"state_reports_refused,omitempty"`
}

// status returns the checks' status, nil if no device requires them.
func (k *deviceAuth) status() *DeviceAuthStatus {
	if len(k.required) == 0 {
		return nil
	}
	s := &DeviceAuthStatus{TrustRoot: k.trust != nil, AcksRefused: refusalCounts(&k.acksRefused), StatesRefused: refusalCounts(&k.statesRefused)}
	k.mu.Lock()
	for dev, missing := range k.noCert {
		if missing {
			s.WithoutCertificate = append(s.WithoutCertificate, dev)
		}
	}
	k.mu.Unlock()
	slices.Sort(s.WithoutCertificate)
	return s
}

func refusalCounts(c *[len(deviceAuthRefusals)]atomic.Uint64) map[string]uint64 {
	var m map[string]uint64
	for i := range c {
		if n := c[i].Load(); n > 0 {
			if m == nil {
				m = map[string]uint64{}
			}
			m[deviceAuthRefusals[i]] = n
		}
	}
	return m
}

// logLimit allows one log line per key per every (zero:
// malformedLogEvery), and counts the lines it left out meanwhile.
type logLimit struct {
	every time.Duration

	mu   sync.Mutex
	last map[string]*reportLog
}

// allow reports whether a line about key may be logged at now, and how
// many were left out since the last one.
func (l *logLimit) allow(key string, now time.Time) (suppressed uint64, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last == nil {
		l.last = make(map[string]*reportLog)
	}
	r := l.last[key]
	if r == nil {
		r = &reportLog{}
		l.last[key] = r
	} else if now.Sub(r.at) < cmp.Or(l.every, malformedLogEvery) {
		r.suppressed++
		return 0, false
	}
	suppressed = r.suppressed
	r.at, r.suppressed = now, 0
	return suppressed, true
}
