package sim

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/edgefence/edgefence/devices/shim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/fence/history"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// DBFile is the name of the bbolt file a Fleet keeps in its DataDir.
const DBFile = "devsim.db"

// publishTimeout bounds one ack or state publish from a handler.
const publishTimeout = 10 * time.Second

// FleetConfig configures a Fleet.
type FleetConfig struct {
	Devices  []string // device ids, at least one (fence.ValidateDeviceID)
	DataDir  string   // directory of the bbolt file (DBFile), created if missing
	Broker   string   // MQTT broker URL, e.g. mqtt://127.0.0.1:1883
	Prefix   string   // topic prefix; empty means mqtt.DefaultPrefix
	ClientID string   // MQTT client id; empty means one derived from the host name and DataDir

	// VerdictLog receives one JSON line per decision; nil means none.
	VerdictLog io.Writer
	// History, if not nil, gets every decision as a history event
	// (shim.Options.History). The Fleet does not close it.
	History *history.Writer
	// Kind is what the fleet's devices are (HostConfig.Kind); empty means
	// DeviceThermostat.
	Kind DeviceKind
	// Keys, if set, makes the devices accept only signed envelopes
	// (HostConfig.Keys).
	Keys auth.Keys
	// Root, if set, lets the operator reset the devices' marks
	// (HostConfig.Root).
	Root auth.ResetVerifier
	// Signers, per device id, is the device's own key (auth.RoleDevice):
	// its acks and state reports go out signed (signed.go). A device
	// without one sends plain ones.
	Signers map[string]*auth.Signer
	// Logger receives log lines (the MQTT client's too); nil means none.
	Logger *slog.Logger

	// Lanes is how many MQTT clients the devices are spread over (0 or
	// 1: one). With more, the commands that arrive on different lanes at
	// the same time are decided together and their marks committed in one
	// bbolt transaction (Host.HandleAll: one fsync), each acked only after
	// that commit, as devices with flash of their own answer in parallel
	// (lanes.go). Lane i > 0 connects as ClientID-i.
	Lanes int

	// MQTT overrides the client settings other than Brokers, ClientID and
	// Logger; the zero value means the transport's defaults (a persistent
	// session, so commands sent while the fleet is down wait at the broker;
	// mqtt.DefaultMaxPacketSize, which fits every envelope).
	MQTT mqtt.Config
}

// Fleet serves simulated devices over MQTT: one client for all of them,
// one Host (fence point and state) behind it.
//
// Each command is decided, and if admitted applied and committed, inside
// the MQTT handler, so before the PUBACK: a broker redelivery is a
// Duplicate, never a lost command. The ack is published from the handler
// too; if that fails, the command's own PUBACK is usually lost with the
// connection and the broker redelivers it, and a redelivery (or the agent's
// retry) is acknowledged again as Duplicate.
type Fleet struct {
	host    *Host
	clients []*mqtt.Client // one per lane (lanes.go)
	batches *batchLoop     // nil with one lane
	topics  mqtt.Topics
	devices []string
	member  map[string]bool
	log     *slog.Logger
	ctx     context.Context // cancelled by Close
	cancel  context.CancelFunc
	closed  atomic.Bool

	acks, ackErrors, states, stateErrors, badResponseTopics atomic.Uint64

	signers map[string]*auth.Signer
	reports atomic.Uint64 // the state reports' counter (signed.go)
}

// NewFleet opens the fleet's database, dials the broker and subscribes to
// every device's command topic. It does not wait for the broker: use
// AwaitReady. ctx is only checked here; the fleet runs until Close.
func NewFleet(ctx context.Context, cfg FleetConfig) (*Fleet, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("sim: fleet: %w", err)
	}
	if len(cfg.Devices) == 0 {
		return nil, errors.New("sim: fleet: no devices")
	}
	member := make(map[string]bool, len(cfg.Devices))
	for _, d := range cfg.Devices {
		if err := fence.ValidateDeviceID(d); err != nil {
			return nil, fmt.Errorf("sim: fleet: %w", err)
		}
		if member[d] {
			return nil, fmt.Errorf("sim: fleet: device %q listed twice", d)
		}
		member[d] = true
	}
	if cfg.DataDir == "" || cfg.Broker == "" {
		return nil, errors.New("sim: fleet: DataDir and Broker are required")
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("sim: fleet: %w", err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	host, err := OpenHost(filepath.Join(cfg.DataDir, DBFile),
		HostConfig{VerdictLog: cfg.VerdictLog, Kind: cfg.Kind, Logger: cfg.Logger, History: cfg.History, Keys: cfg.Keys, Root: cfg.Root})
	if err != nil {
		return nil, fmt.Errorf("sim: fleet: %w", err)
	}
	mc := cfg.MQTT
	mc.Brokers = []string{cfg.Broker}
	mc.ClientID = cfg.ClientID
	if mc.ClientID == "" {
		mc.ClientID = defaultClientID(cfg.DataDir)
	}
	mc.Logger = cfg.Logger
	fctx, cancel := context.WithCancel(context.Background())
	clients, err := dialLanes(fctx, mc, cfg.Lanes)
	if err != nil {
		cancel()
		host.Close()
		return nil, fmt.Errorf("sim: fleet: %w", err)
	}
	topics := mqtt.Topics{Prefix: cfg.Prefix}
	f := &Fleet{host: host, clients: clients, topics: topics,
		devices: append([]string(nil), cfg.Devices...), member: member, log: log, ctx: fctx, cancel: cancel, signers: cfg.Signers}
	f.reports.Store(uint64(time.Now().UnixNano()))
	if len(clients) > 1 {
		f.batches = startBatchLoop(host)
	}
	for i, d := range f.devices {
		c := clients[i%len(clients)]
		c.Subscribe(f.topics.Cmd(d), func(m mqtt.Message) { f.handle(c, d, m) })
	}
	log.Info("device fleet starting", "devices", len(f.devices), "lanes", len(clients), "broker", cfg.Broker,
		"client_id", mc.ClientID, "db", filepath.Join(cfg.DataDir, DBFile), "kind", cmp.Or(cfg.Kind, DeviceThermostat))
	return f, nil
}

// defaultClientID is stable for a data directory (so the broker session,
// with the commands queued while the fleet was down, survives a restart) and
// unique per host and directory (a directory is used by one process at a
// time: the bbolt file is locked).
func defaultClientID(dir string) string {
	host, _ := os.Hostname()
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	sum := sha256.Sum256([]byte(host + "\x00" + dir))
	return "edgefence-devsim-" + hex.EncodeToString(sum[:6])
}

// AwaitReady waits until the broker connection is up and every command
// topic is subscribed.
func (f *Fleet) AwaitReady(ctx context.Context) error {
	for _, c := range f.clients {
		if err := c.AwaitSubscribed(ctx); err != nil {
			return fmt.Errorf("sim: fleet: %w", err)
		}
	}
	return nil
}

// Close disconnects from the broker (waiting for a handler in progress) and
// closes the database. It returns ctx's error if the MQTT client does not
// stop in time.
func (f *Fleet) Close(ctx context.Context) error {
	if f.closed.Swap(true) {
		return nil
	}
	f.cancel()
	var errs []error
	for _, c := range f.clients {
		errs = append(errs, c.Close(ctx))
	}
	f.batches.stop() // after the clients: no handler is waiting for a batch
	return errors.Join(append(errs, f.host.Close())...)
}

// Devices returns the fleet's device ids.
func (f *Fleet) Devices() []string { return append([]string(nil), f.devices...) }

// Topics returns the fleet's topic names.
func (f *Fleet) Topics() mqtt.Topics { return f.topics }

// State returns a device's current state.
func (f *Fleet) State(device string) (State, error) {
	if !f.member[device] {
		return State{}, fmt.Errorf("sim: fleet has no device %q", device)
	}
	return f.host.State(device)
}

// Mark returns a device's fence mark.
func (f *Fleet) Mark(device string) (fence.Mark, error) {
	if !f.member[device] {
		return fence.Mark{}, fmt.Errorf("sim: fleet has no device %q", device)
	}
	return f.host.Mark(device)
}

// FleetStats are a fleet's counters since NewFleet.
type FleetStats struct {
	shim.Stats               // verdicts; Invalid counts bad input
	AcksPublished     uint64 // acks the broker acknowledged
	AckErrors         uint64 // acks that could not be published (the command is acked again on redelivery)
	StatesPublished   uint64
	StateErrors       uint64
	BadResponseTopics uint64 // response topics refused (acks went to the ack topic instead)
	PacketsOversize   uint64 // MQTT packets over the client's MaxPacketSize, dropped unread (mqtt.Stats)
	// Batches counts the transactions the lanes' commands were decided in
	// (FleetConfig.Lanes > 1; 0 with one lane): commands ÷ Batches is
	// how many shared a commit.
	Batches uint64
}

// Stats returns a snapshot of the counters.
func (f *Fleet) Stats() FleetStats {
	return FleetStats{Stats: f.host.Stats(), AcksPublished: f.acks.Load(), AckErrors: f.ackErrors.Load(),
		StatesPublished: f.states.Load(), StateErrors: f.stateErrors.Load(), BadResponseTopics: f.badResponseTopics.Load(),
		PacketsOversize: f.oversize(), Batches: f.batchCount()}
}

// handle runs on the MQTT client's delivery goroutine, one message at a
// time; the command's PUBACK goes out when it returns.
func (f *Fleet) handle(c *mqtt.Client, device string, m mqtt.Message) {
	out := f.decide(device, m.Payload) // committed (fsync) before we return
	if out.Update != nil {
		return // a trust update: taken in (or refused, logged and counted), nothing to ack
	}
	ack, err := f.encodeAck(device, &out.Ack)
	if err != nil { // the shim builds valid acks; this would be a bug
		f.log.Error("ack does not encode", "device", device, "err", err)
		return
	}
	topic, refused := ackTopic(f.topics, device, m.ResponseTopic)
	if refused {
		f.badResponseTopics.Add(1)
		f.log.Warn("response topic refused; acking on the ack topic", "device", device, "response_topic", shorten(m.ResponseTopic))
	}
	ctx, cancel := context.WithTimeout(f.ctx, publishTimeout)
	defer cancel()
	if err := c.Publish(ctx, mqtt.Message{Topic: topic, Payload: ack, CorrelationData: m.CorrelationData}); err != nil {
		f.ackErrors.Add(1)
		f.log.Warn("ack not published; a redelivery will be acked as duplicate", "device", device,
			"id", out.Ack.ID, "verdict", out.Ack.Verdict.String(), "err", err)
		return
	}
	f.acks.Add(1)
	if !out.Applied || out.Record.State == nil {
		return
	}
	st, err := f.encodeState(device, out.Ack.State(), *out.Record.State)
	if err == nil {
		err = c.Publish(ctx, mqtt.Message{Topic: f.topics.State(device), Payload: st})
	}
	if err != nil {
		f.stateErrors.Add(1)
		f.log.Warn("state not published", "device", device, "err", err)
		return
	}
	f.states.Add(1)
}

func shorten(s string) string {
	if len(s) > 80 {
		return strings.ToValidUTF8(s[:80], "?") + "..."
	}
	return strings.ToValidUTF8(s, "?")
}
