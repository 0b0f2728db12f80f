// Package bridge is the home gateway's fence point for devices that cannot
// check tokens (`fence: gateway` in the agent config): PLCs, meters and
// drives on a serial line.
//
// A holder anywhere — another gateway, a central synchronizer, this
// gateway's own controller — publishes fenced envelopes to the device's
// command topic. The bridge takes each from the broker and:
//
//  1. decodes it and turns its kind and body into the device's request
//     (transport/modbus: Modbus PDUs); anything malformed is answered Invalid
//     and never reaches the table or the wire;
//  2. admits it through the gateway's fence.Table, committed with fsync,
//     inside the MQTT handler, so before the broker's PUBACK: stale and
//     duplicate commands are answered there and never written to the line;
//  3. hands admitted commands to the device's own worker, which sends them
//     over the serial link in admission order and acks each one.
//
// The gateway's own controller takes the same path through the broker:
// there is no shortcut around the table.
//
// The table's admit also stores the command as admitted but not yet
// applied, in the same fsynced commit; once the device answered, the
// worker marks it applied, and that mark is durable (riding along with the
// table's next commit) before the worker sends the device's next command. A bridge that dies in between delivers the device's unapplied
// commands first when it starts again, and a resend of a command still
// unapplied is answered only once the command was applied: a Duplicate ack
// always means "already applied" (see applied.go).
package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/bbolt"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/fence/history"
	"github.com/edgefence/edgefence/transport/modbus"
	"github.com/edgefence/edgefence/transport/modbus/profile"
	"github.com/edgefence/edgefence/transport/mqtt"
	"github.com/edgefence/edgefence/transport/serial"
)

// Defaults.
const (
	DefaultQueue          = 256
	DefaultCommandTimeout = 30 * time.Second
)

// ErrConfig means the bridge configuration is unusable.
var ErrConfig = errors.New("bridge: invalid config")

// ErrUnsafeBuild means a test or demo switch (NoTable) was asked for in a
// build without -tags edgefence_unsafe.
var ErrUnsafeBuild = errors.New("bridge: unsafe switch needs a build with -tags edgefence_unsafe")

// Device is one device the bridge fronts, on a serial line (Port) or, for
// a legacy device that speaks plain MQTT (Topic), on the broker.
type Device struct {
	ID   string
	Port serial.PortConfig
	// Topic, if set, makes the device an MQTT-link device: an admitted
	// command's body is published as JSON, QoS 1, on Topic/<kind>, and the
	// broker's PUBACK counts as delivery (the device acks nothing).
	Topic string
	// Modbus, if set, makes the device a unit on one of Config.Buses
	// (modbus.go): a PLC, meter or drive that speaks Modbus RTU or TCP.
	Modbus *ModbusUnit
	// AuthOff is the device's `auth: off`: with Config.Keys set, its
	// plain envelopes are taken still (counted in Stats.Unsigned); a
	// signed one is verified as for any device. Its epoch is its last
	// reset's only: the fleet epoch statement of Config.Keys is for the
	// devices whose commands must be signed.
	AuthOff bool
}

// Table is what the bridge needs of the gateway's fence table;
// *fence.Table is the one a gateway runs. (A build with -tags
// edgefence_unsafe also has NoTable, which admits everything, for the
// demo that shows what the table prevents.)
type Table interface {
	// AdmitAt decides env with fence.AdmitEpoch; floor is the bridge's own
	// epoch for the device (the fleet epoch of Config.Keys, for a device
	// whose commands must be signed).
	AdmitAt(ctx context.Context, env *fence.Envelope, floor uint64) (fence.Verdict, fence.State, error)
	MarkApplied(device string, m fence.Mark) (ticket uint64, err error)
	AwaitApplied(ctx context.Context, ticket uint64) error
	Unapplied(device string) ([]*fence.Envelope, error)
}

// Config configures a Bridge.
type Config struct {
	Table   Table // the gateway's fence table (required)
	Topics  mqtt.Topics
	Devices []Device
	// Buses are the Modbus buses of the devices with Device.Modbus.
	Buses []Bus
	// CommandTimeout bounds one command on the serial link, retries and
	// waiting for an unplugged port included. Default 30s.
	CommandTimeout time.Duration
	// Queue is how many admitted commands may wait per device; when full,
	// new commands are refused (Invalid, "busy") before admission.
	Queue  int
	Logger *slog.Logger
	// Keys, if set, makes the gateway fence accept only signed envelopes
	// (invariant I7, fence/auth), verified before the table's admit rule:
	// anything else is refused invalid, the mark unchanged, counted in
	// Stats.Unauthenticated and logged. nil: plain envelopes, as before.
	// When Keys is an *auth.Trust the bridge also learns the trust
	// updates that arrive on its devices' command topics (trust.go), and
	// the epoch statement it holds is the lowest epoch of every device
	// but the AuthOff ones (fence.AdmitEpoch).
	Keys auth.Keys
	// TrustDB keeps what trust updates brought (bucket bridge.trust),
	// each committed before it takes effect, replayed by New: the fence
	// table's file (fence.Table.Bolt). nil: memory only.
	TrustDB *bbolt.DB
	// Root, if set, lets the operator reset a device's mark in the table
	// with a reset statement signed by the root key (fence/auth;
	// reset.go), whether or not commands must be signed. nil: Keys, if it
	// is an *auth.Trust; neither: every reset is refused.
	Root auth.ResetVerifier
	// Signer, if set, is the home gateway's key: the acks and read results
	// the bridge publishes for its devices go out signed (signed.go), so
	// that holders verify them as the devices' own (auth.GatewayAcks).
	Signer *auth.Signer
	// History, if set, records every refusal the bridge gives a command
	// (history.OpVerdict) and every command a device answered
	// (history.OpApplied). Accepts are the table's to record, before its
	// commit: give the table the same Writer (fence.TableOptions.History,
	// NoTable's argument).
	History *history.Writer

	// beforeWire, if set, runs in the device's worker just before an
	// admitted command is written to the device: the tests' failpoint for
	// a crash between the admit's commit and the wire.
	beforeWire func(env *fence.Envelope)
}

// Stats are the bridge's counters.
type Stats struct {
	Accepted  uint64 `json:"accepted"`
	Duplicate uint64 `json:"duplicate"`
	Stale     uint64 `json:"stale"`
	Invalid   uint64 `json:"invalid"`
	// Unknown: commands sent that the device never answered, ended
	// fence.Unknown (never repeated).
	Unknown      uint64 `json:"unknown"`
	Busy         uint64 `json:"busy"`
	TableErrors  uint64 `json:"table_errors"`
	SerialErrors uint64 `json:"serial_errors"`
	DeviceErrors uint64 `json:"device_exceptions"`
	AckErrors    uint64 `json:"ack_errors"`
	// Unauthenticated commands refused by Config.Keys (also in Invalid).
	Unauthenticated uint64 `json:"unauthenticated"`
	// Trust update statements taken in, already held, refused (trust.go).
	TrustApplied uint64 `json:"trust_applied"`
	TrustHeld    uint64 `json:"trust_held"`
	TrustRefused uint64 `json:"trust_refused"`
	// Operator resets applied to the table, and refused (also in Invalid).
	Resets        uint64 `json:"resets"`
	ResetsRefused uint64 `json:"resets_refused"`
	// Unsigned plain envelopes taken for Device.AuthOff devices.
	Unsigned uint64 `json:"unsigned"`
}

// Bridge forwards fenced commands to serial devices through the fence table.
type Bridge struct {
	cfg     Config
	log     *slog.Logger
	devices map[string]*port
	buses   map[string]*mbBus // by name (modbus.go)

	mu     sync.Mutex
	client *mqtt.Client
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	accepted, duplicate, stale, invalid, busy, tableErr, serialErr, devErr, ackErr atomic.Uint64
	unauth, unsigned, resets, resetsRefused, unknown                               atomic.Uint64

	trust   auth.LearnedCounters
	ledger  *auth.Ledger  // trust updates (trust.go); nil without a Trust
	reports atomic.Uint64 // signed read results' counter (signed.go)
}

type port struct {
	dev   Device
	queue chan *job
	conn  *serial.Conn
	link  *serial.Link
	mb    *mbDev // a Modbus device: its bus and profile (modbus.go)

	// recovered holds the commands a previous process admitted but did not
	// see applied, in admission order: the worker sends them before
	// anything from queue. Set in New, read by the worker only.
	recovered []*job

	// closed is the epoch of the device's last reset applied here: a
	// command of an earlier epoch admitted before it is never written to
	// the device after it (send).
	closed atomic.Uint64

	mu sync.Mutex
	// pending holds the admitted commands not yet answered by the device,
	// by mark: a resend of one of them waits for it (job.waiters).
	pending map[fence.Mark]*job
	// unsynced is the last settled command while its applied-mark is not
	// known durable (worker only).
	unsynced *unsynced
	// failed remembers the last commands the device refused or never
	// answered, so that their resends get that answer again rather than a
	// Duplicate (bounded by maxFailed; see settle).
	failed     map[fence.Mark]outcome
	failedList []fence.Mark
}

type job struct {
	env  *fence.Envelope
	req  *modbus.Request // serial devices
	ops  []profile.Op    // Modbus devices: the command's transactions
	json []byte          // MQTT-link devices: the body as JSON
	m    fence.Mark
	err  error // a recovered command that can no longer be built: answered Invalid

	// verify: the oldest command a previous process admitted but did not
	// see applied, the only one that may have reached the device.
	verify bool

	// Under port.mu: resends waiting for this command's outcome, and
	// whether it is known.
	waiters []*fence.Envelope
	settled bool
}

// New checks cfg and prepares the bridge. Register Subscriptions with the
// MQTT client before it connects, then call Start.
func New(cfg Config) (*Bridge, error) {
	if cfg.Table == nil {
		return nil, fmt.Errorf("%w: no fence table", ErrConfig)
	}
	if cfg.CommandTimeout <= 0 {
		cfg.CommandTimeout = DefaultCommandTimeout
	}
	if cfg.Queue <= 0 {
		cfg.Queue = DefaultQueue
	}
	b := &Bridge{cfg: cfg, log: cfg.Logger, devices: make(map[string]*port, len(cfg.Devices))}
	b.reports.Store(uint64(time.Now().UnixNano()))
	if b.log == nil {
		b.log = slog.New(slog.DiscardHandler)
	}
	for _, d := range cfg.Devices {
		if err := fence.ValidateDeviceID(d.ID); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrConfig, err)
		}
		if d.Modbus != nil {
			if d.Topic != "" || d.Port.Path != "" {
				return nil, fmt.Errorf("%w: device %s: a Modbus unit has no serial port or topic of its own", ErrConfig, d.ID)
			}
		} else if d.Topic != "" {
			if strings.ContainsAny(d.Topic, "+#") || strings.HasPrefix(d.Topic, cfg.Topics.Prefix+"/") {
				return nil, fmt.Errorf("%w: device %s: topic %q: no wildcards, and not under the fenced prefix", ErrConfig, d.ID, d.Topic)
			}
		} else if err := d.Port.Validate(); err != nil {
			return nil, fmt.Errorf("%w: device %s: %w", ErrConfig, d.ID, err)
		}
		b.devices[d.ID] = &port{dev: d, queue: make(chan *job, cfg.Queue),
			pending: make(map[fence.Mark]*job), failed: make(map[fence.Mark]outcome)}
	}
	if err := b.checkBuses(); err != nil {
		return nil, err
	}
	if err := b.recover(); err != nil {
		return nil, err
	}
	if err := b.openLedger(); err != nil {
		return nil, err
	}
	if _, ok := cfg.Table.(noTable); ok {
		b.log.Warn("UNSAFE: the fence table is off; every command reaches the devices (tests and demos only)")
	}
	return b, nil
}

// Subscriptions returns the command-topic subscriptions to register with
// the MQTT client (mqtt.Config.Subscriptions), so that commands the broker
// queued for a resumed session are not dropped before Start.
func (b *Bridge) Subscriptions() []mqtt.Subscription {
	subs := make([]mqtt.Subscription, 0, len(b.devices))
	for id := range b.devices {
		subs = append(subs, mqtt.Subscription{Filter: b.cfg.Topics.Cmd(id), Handler: b.onCommand})
	}
	return subs
}

// Start opens the serial ports (a missing port is logged and retried in the
// background: the other devices keep being served) and starts one worker per
// device, publishing acks through client. Close stops it.
func (b *Bridge) Start(ctx context.Context, client *mqtt.Client) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.client != nil {
		return errors.New("bridge: already started")
	}
	b.client = client
	b.ctx, b.cancel = context.WithCancel(ctx)
	if err := b.openBuses(); err != nil {
		b.cancel()
		return err
	}
	for _, p := range b.devices {
		if p.mb != nil && p.mb.prof != nil {
			b.wg.Add(1)
			go func() {
				defer b.wg.Done()
				b.poll(p)
			}()
		}
		if p.dev.Topic != "" || p.mb != nil {
			b.wg.Add(1)
			go func() {
				defer b.wg.Done()
				b.work(p)
			}()
			continue
		}
		conn, err := serial.OpenConn(serial.ConnConfig{Port: p.dev.Port, Logger: b.log.With("device", p.dev.ID)})
		if conn == nil {
			b.cancel()
			return fmt.Errorf("bridge: device %s: %w", p.dev.ID, err)
		}
		if err != nil {
			b.log.Warn("serial port not there; commands wait for it", "device", p.dev.ID, "port", p.dev.Port.Path, "err", err)
		}
		link, err := serial.NewLink(conn, serial.LinkConfig{Timeout: time.Second, Retries: 3, Logger: b.log.With("device", p.dev.ID)})
		if err != nil {
			conn.Close()
			b.cancel()
			return fmt.Errorf("bridge: device %s: %w", p.dev.ID, err)
		}
		p.conn, p.link = conn, link
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			b.work(p)
		}()
	}
	b.log.Info("bridge started", "devices", len(b.devices))
	return nil
}

// Close stops the workers and closes the ports. Commands still queued, or
// interrupted on the wire, are not answered (their senders got no ack):
// they stay unapplied in the fence table, and the next Start delivers them
// first.
func (b *Bridge) Close() error {
	b.mu.Lock()
	cancel := b.cancel
	b.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	b.wg.Wait()
	b.closeBuses()
	for _, p := range b.devices {
		if p.link != nil {
			p.link.Close()
			p.conn.Close()
		}
	}
	return nil
}

// Stats returns the counters.
func (b *Bridge) Stats() Stats {
	return Stats{Accepted: b.accepted.Load(), Duplicate: b.duplicate.Load(), Stale: b.stale.Load(),
		Invalid: b.invalid.Load(), Unknown: b.unknown.Load(), Busy: b.busy.Load(), TableErrors: b.tableErr.Load(),
		SerialErrors: b.serialErr.Load(), DeviceErrors: b.devErr.Load(), AckErrors: b.ackErr.Load(),
		Unauthenticated: b.unauth.Load(), TrustApplied: b.trust.Applied.Load(), TrustHeld: b.trust.Held.Load(),
		TrustRefused: b.trust.Refused.Load(), Resets: b.resets.Load(), ResetsRefused: b.resetsRefused.Load(),
		Unsigned: b.unsigned.Load()}
}

// decode returns the envelope in raw for p's device: signed and verified
// with Config.Keys, or plain without them or for an AuthOff device.
func (b *Bridge) decode(p *port, raw []byte) (*fence.Envelope, error) {
	if b.cfg.Keys == nil || p.dev.AuthOff && plainEnvelope(raw) {
		env, err := fence.UnmarshalEnvelope(raw)
		if err == nil && p.dev.AuthOff {
			b.unsigned.Add(1)
		}
		return env, err
	}
	v, err := auth.Verify(raw, b.cfg.Keys)
	if err != nil {
		b.unauth.Add(1)
		b.log.Warn("unauthenticated command refused", "err", err)
		return nil, err
	}
	return v.Envelope, nil
}

// plainEnvelope reports whether raw is a plain envelope: a CBOR map (first
// byte 0xa0–0xbf), where a signed one is a COSE_Sign1 (tag 18).
func plainEnvelope(raw []byte) bool { return len(raw) > 0 && raw[0]&0xe0 == 0xa0 }

// addressable returns the envelope a refused signed command claims to be,
// unverified, if it names dev: only to address the refusal's ack.
func (b *Bridge) addressable(dev string, raw []byte) *fence.Envelope {
	if b.cfg.Keys == nil {
		return nil
	}
	env, err := auth.Claimed(raw)
	if err != nil || env.Device != dev {
		return nil
	}
	return env
}

// onCommand runs on the MQTT client's delivery goroutine: decide and
// persist here (before the PUBACK), queue the wire work for the device.
func (b *Bridge) onCommand(msg mqtt.Message) {
	dev, leaf, ok := b.cfg.Topics.Parse(msg.Topic)
	p := b.devices[dev]
	if !ok || leaf != mqtt.LeafCmd || p == nil {
		b.invalid.Add(1)
		b.log.Warn("command on a topic this bridge does not serve", "topic", msg.Topic)
		return
	}
	if b.ledger != nil && auth.IsUpdate(msg.Payload) {
		b.learn(dev, msg.Payload) // trust.go: not a command, no ack
		return
	}
	if auth.IsReset(msg.Payload) { // the operator's reset, not a command (reset.go)
		b.onReset(p, msg.Payload)
		return
	}
	env, err := b.decode(p, msg.Payload)
	if err != nil {
		// auth.Reason: the wording of a refusal a trust update cures is
		// every fence point's (auth.NeedsTrust).
		b.refuse(dev, b.addressable(dev, msg.Payload), fence.Invalid, fence.State{}, auth.Reason(err))
		return
	}
	if env.Device != dev {
		b.refuse(dev, env, fence.Invalid, fence.State{}, fmt.Sprintf("envelope for %q on %q's topic", env.Device, dev))
		return
	}
	j := &job{env: env}
	if err := p.prepare(j); err != nil {
		b.refuse(dev, env, fence.Invalid, fence.State{}, err.Error())
		return
	}
	if len(p.queue) == cap(p.queue) {
		b.busy.Add(1)
		b.refuse(dev, env, fence.Invalid, fence.State{}, "busy: too many commands waiting for the device; not admitted")
		return
	}
	v, st, err := b.cfg.Table.AdmitAt(context.Background(), env, b.floor(p))
	switch {
	case v == fence.Invalid, v == fence.Stale && err != nil: // invalid, or of a closed epoch (fence.EpochError)
		b.refuse(dev, env, v, st, err.Error())
		return
	case err != nil:
		b.tableErr.Add(1)
		b.log.Error("fence table", "device", dev, "err", err)
		b.refuse(dev, env, fence.Invalid, st, "fence table: "+err.Error())
		return
	case v == fence.Duplicate && b.resent(p, env):
		return // answered with the outcome of the command it repeats
	case v != fence.Accepted:
		b.refuse(dev, env, v, st, "")
		return
	}
	// The accept itself is in the history already: the table records it
	// before its commit (fence.TableOptions.History).
	j.m = st.Mark
	p.mu.Lock()
	p.pending[j.m] = j
	p.mu.Unlock()
	p.queue <- j // a free slot was checked above; only this goroutine adds
}

// floor is the bridge's own epoch for p's device: the fleet epoch of
// Config.Keys (auth.Trust.Epoch), but for an AuthOff device, whose epoch
// is its last reset's only.
func (b *Bridge) floor(p *port) uint64 {
	if k, ok := b.cfg.Keys.(interface{ Epoch() uint64 }); ok && !p.dev.AuthOff {
		return k.Epoch()
	}
	return 0
}

// refuse answers a command that will not reach the device; st is the
// device's state at the table.
func (b *Bridge) refuse(dev string, env *fence.Envelope, v fence.Verdict, st fence.State, reason string) {
	m := st.Mark
	switch v {
	case fence.Duplicate:
		b.duplicate.Add(1)
		if reason == "" {
			reason = "duplicate: admitted before; not applied again"
		}
	case fence.Stale:
		b.stale.Add(1)
		if reason == "" {
			reason = fmt.Sprintf("token below the gateway fence table's %d", m.Token)
		}
	default:
		b.invalid.Add(1)
	}
	// One line per refusal, keyed like the agent's ("command refused"):
	// device, token, reason, verdict; fence_token is the table's mark.
	var tok fence.Token
	var seq uint64
	var id string
	if env != nil {
		tok, seq, id = env.Token, env.Seq, env.ID
	}
	lvl := slog.LevelWarn
	if v == fence.Duplicate {
		lvl = slog.LevelInfo // a resend, answered again: not a refusal
	}
	b.log.Log(context.Background(), lvl, "command refused", "device", dev, "token", tok, "reason", reason, "verdict", v,
		"seq", seq, "id", id, "fence_token", m.Token, "fence_epoch", st.Epoch, "by", "fence table")
	if env == nil {
		env = &fence.Envelope{Device: dev}
	} else {
		b.record(history.OpVerdict, env, v, reason)
	}
	b.ack(dev, env, v, st, reason)
}

func (b *Bridge) ack(dev string, env *fence.Envelope, v fence.Verdict, st fence.State, reason string) {
	a := fence.NewEpochAck(env, v, st, reason)
	a.Device = dev
	payload, err := b.encodeAck(&a)
	if err != nil {
		b.ackErr.Add(1)
		b.log.Error("encode ack", "device", dev, "err", err)
		return
	}
	b.mu.Lock()
	client, ctx := b.client, b.ctx
	b.mu.Unlock()
	if client == nil {
		b.ackErr.Add(1)
		return
	}
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := client.Publish(actx, mqtt.Message{Topic: b.cfg.Topics.Ack(dev), Payload: payload, CorrelationData: []byte(env.ID)}); err != nil {
		b.ackErr.Add(1)
		b.log.Warn("publish ack", "device", dev, "id", env.ID, "err", err)
	}
}

// work sends one device's admitted commands over its link, in order: first
// those a previous process admitted but did not see applied, then the new
// ones.
func (b *Bridge) work(p *port) {
	defer b.finish(p) // on Close: commit and record the last applied-mark
	for _, j := range p.recovered {
		if b.ctx.Err() != nil || !b.finish(p) {
			return
		}
		b.send(p, j)
	}
	p.recovered = nil
	for {
		var idle <-chan time.Time
		if p.unsynced != nil {
			idle = time.After(idleFlush)
		}
		select {
		case <-b.ctx.Done():
			return
		case j := <-p.queue:
			if !b.finish(p) { // the previous command's mark, durable before this one's wire
				return
			}
			b.send(p, j)
		case <-idle:
			if !b.finish(p) {
				return
			}
		}
	}
}

// result is what became of one admitted command at its device.
type result int

const (
	resApplied result = iota // the device answered and applied it
	resFound                 // applied before a restart: the read-back found it (not written again)
	resRefused               // nothing applied: the device answered with an error, or the command could not be built
	resUnknown               // no answer in time: the bridge gave up, fate unknown
	resStopped               // the bridge is closing: left unapplied for the next start
	resClosed                // not sent: its epoch was closed (a reset, a fleet epoch) after its admit
)

func (b *Bridge) send(p *port, j *job) {
	if j.err != nil {
		b.settle(p, j, resRefused, j.err.Error(), nil)
		return
	}
	// A command admitted before a reset or a fleet epoch statement closed
	// its epoch never reaches the device after it.
	if e := max(p.closed.Load(), b.floor(p)); j.env.Epoch < e {
		b.settle(p, j, resClosed, (&fence.EpochError{Command: j.env.Epoch, FencePoint: e}).Error(), nil)
		return
	}
	if b.cfg.beforeWire != nil {
		b.cfg.beforeWire(j.env)
	}
	var (
		res    result
		reason string
		r      *modbus.Response
	)
	switch {
	case p.dev.Topic != "":
		res, reason = b.publish(p, j)
	case p.mb != nil:
		res, reason, r = b.transactBus(p, j)
	default:
		res, reason, r = b.transact(p, j)
	}
	b.settle(p, j, res, reason, r)
}

// prepare builds what j's device is sent: JSON for an MQTT-link device,
// the transactions of a Modbus device, a PDU for a serial one. Errors wrap
// fence.ErrInvalid.
func (p *port) prepare(j *job) (err error) {
	switch {
	case p.dev.Topic != "":
		j.json, err = bodyJSON(j.env)
	case p.mb != nil:
		j.ops, err = p.mb.plan(j.env)
	default:
		j.req, err = modbus.CommandPDU(j.env)
	}
	return err
}

// transact runs one admitted command on a serial device. For a write
// already applied before a restart (the one command that can have been) the
// reason says so.
func (b *Bridge) transact(p *port, j *job) (result, string, *modbus.Response) {
	ctx, cancel := context.WithTimeout(b.ctx, b.cfg.CommandTimeout)
	defer cancel()
	if j.verify && j.req.Func != modbus.FuncReadHolding {
		done, err := b.holds(ctx, p, j.req)
		switch {
		case err != nil:
			b.log.Warn("could not read back a command admitted before the restart; writing it", "device", p.dev.ID, "id", j.env.ID, "err", err)
		case done:
			b.log.Info("command admitted before the restart was already applied", "device", p.dev.ID, "id", j.env.ID)
			return resFound, "", nil
		}
	}
	pdu, err := j.req.Encode()
	if err != nil { // CommandPDU validated it
		return resRefused, err.Error(), nil
	}
	resp, err := p.link.Do(ctx, pdu)
	if err != nil {
		if b.ctx.Err() != nil {
			return resStopped, "", nil
		}
		b.serialErr.Add(1)
		b.log.Warn("device did not answer", "device", p.dev.ID, "id", j.env.ID, "err", err)
		return resUnknown, "admitted, but the device did not answer (fate unknown): " + err.Error(), nil
	}
	r, err := modbus.DecodeResponse(j.req, resp)
	if err == nil {
		err = r.Err()
	}
	if err != nil {
		b.devErr.Add(1)
		return resRefused, "device: " + err.Error(), nil
	}
	return resApplied, "", r
}

// ReadResult is what a read_registers command yields, published (CBOR) on
// the device's state topic before the command's ack.
type ReadResult struct {
	ID     string   `cbor:"id"`
	Addr   uint16   `cbor:"addr"`
	Values []uint16 `cbor:"values"`
}

func (b *Bridge) publishRead(dev string, env *fence.Envelope, r *modbus.Response) {
	payload, err := b.encodeRead(dev, env, ReadResult{ID: env.ID, Addr: r.Addr, Values: r.Values})
	if err == nil {
		ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
		defer cancel()
		err = b.client.Publish(ctx, mqtt.Message{Topic: b.cfg.Topics.State(dev), Payload: payload, CorrelationData: []byte(env.ID)})
	}
	if err != nil {
		b.ackErr.Add(1)
		b.log.Warn("publish read result", "device", dev, "id", env.ID, "err", err)
	}
}

// publish delivers an admitted command to an MQTT-link device.
func (b *Bridge) publish(p *port, j *job) (result, string) {
	ctx, cancel := context.WithTimeout(b.ctx, b.cfg.CommandTimeout)
	defer cancel()
	topic := p.dev.Topic + "/" + j.env.Kind
	for {
		err := b.client.Publish(ctx, mqtt.Message{Topic: topic, Payload: j.json})
		if err == nil {
			return resApplied, ""
		}
		if errors.Is(err, mqtt.ErrNotConnected) && b.client.AwaitConnection(ctx) == nil {
			continue // not sent, or outcome unknown: send again (a legacy write is a value, not a delta)
		}
		if b.ctx.Err() != nil {
			return resStopped, ""
		}
		b.serialErr.Add(1)
		b.log.Warn("device topic publish failed", "device", p.dev.ID, "topic", topic, "err", err)
		return resUnknown, "admitted, but not delivered to the device topic (fate unknown): " + err.Error()
	}
}

// bodyJSON turns a command body into the JSON an MQTT-link device gets.
func bodyJSON(env *fence.Envelope) ([]byte, error) {
	if strings.ContainsAny(env.Kind, "/:") {
		return nil, fmt.Errorf("%w: kind %q must be one topic level", fence.ErrInvalid, env.Kind)
	}
	var v any
	if len(env.Body) > 0 {
		if err := fence.DecodeBody(env.Body, &v); err != nil {
			return nil, err
		}
	}
	out, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("%w: body has no JSON form: %v", fence.ErrInvalid, err)
	}
	return out, nil
}
