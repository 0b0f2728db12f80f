package sim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgefence/edgefence/devices/fwjob"
	"github.com/edgefence/edgefence/devices/shim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/fence/history"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// FirmwareConfig configures a FirmwareDevice.
type FirmwareConfig struct {
	Device   string // the device id (fence.ValidateDeviceID)
	Dir      string // the device's directory (fwjob: device.db, slot-a, slot-b), created if missing
	Broker   string // MQTT broker URL
	Prefix   string // topic prefix; empty means mqtt.DefaultPrefix
	ClientID string // MQTT client id; empty means one derived from the host name and Dir

	// Window bounds a trial boot's health check (fwjob.BootConfig.Window);
	// zero means fwjob.DefaultHealthWindow.
	Window time.Duration
	// Tries is the trial boots fw.activate arms (fwjob.Config.BootTries);
	// zero means fwjob.DefaultBootTries.
	Tries uint8
	// Security is the factory image's security version (first boot only).
	Security uint64
	// PowerLoss is what an image marked HealthCrash does during its health
	// check: kill the process at once (edgefence-devsim sends itself
	// SIGKILL), or, for a device run in-process (FirmwareFleet), cancel
	// the ctx given to StartFirmware, which abandons the boot as a power
	// loss would (the try it spent stays spent). nil makes such an image
	// hang instead.
	PowerLoss func()
	// History, if not nil, gets every fence decision of the device as a
	// history event (shim.Options.History), firmware steps with their job
	// (fwjob.NoteHistory). Its source must name this device's fence point
	// only. The device does not close it.
	History *history.Writer

	// Keys, Root: as HostConfig's. Signer, if set, is the device's own
	// key: its acks and state reports go out signed.
	Keys   auth.Keys
	Root   auth.ResetVerifier
	Signer *auth.Signer
	// Manifests, if set, is the operator's root that signs image
	// manifests (fwjob.Config.Manifests): fw.begin must carry one it
	// verifies. nil: the Keys or the Root, whichever checks manifests
	// (a device provisioned with the operator's root installs only
	// images the operator signed); neither: no manifest is checked.
	Manifests auth.ManifestVerifier
	// Logger receives log lines (the MQTT client's too); nil means none.
	Logger *slog.Logger
	// MQTT overrides the client settings other than Brokers, ClientID and
	// Logger, as FleetConfig.MQTT.
	MQTT mqtt.Config
}

// FirmwareDevice is one simulated device that takes firmware jobs
// (package fwjob) and thermostat commands behind one fence point, on MQTT.
// StartFirmware boots it: the boot loader (fwjob.Boot, the running image's
// markers deciding a trial's health check), then the fence point and the
// broker. A reboot is the process's business: when a command asks for one
// (fwjob.Outcome.Reboot) the device acks it, publishes its state report and
// closes RebootRequested; the caller exits and starts again on the same
// directory.
//
// Commands are decided, applied and committed inside the MQTT handler,
// before the PUBACK, and acked from there, as a Fleet's. The state report
// — the thermostat's State fields, "fw" (fwjob.Status.Report) and
// "firmware" (the running image's VersionMarker, if any) — is published
// RETAINED on <prefix>/dev/<id>/state once the device is ready and after
// every command, so that whoever subscribes later (a gateway taking the
// device over) reads its firmware state at once.
type FirmwareDevice struct {
	cfg     FirmwareConfig
	shim    *shim.Shim
	dev     *fwjob.Device
	client  *mqtt.Client
	topics  mqtt.Topics
	boot    fwjob.BootInfo
	version string // the running image's VersionMarker
	log     *slog.Logger
	ctx     context.Context // cancelled by Close
	cancel  context.CancelFunc
	closed  atomic.Bool

	reboot     chan struct{}
	rebootOnce sync.Once
	dialed     chan struct{} // closed once client is set: a resumed session's command may come first

	reports                                                 atomic.Uint64 // signed reports' counter
	acks, ackErrors, states, stateErrors, badResponseTopics atomic.Uint64
}

// StartFirmware boots the device in cfg.Dir and dials the broker; it does
// not wait for the broker (AwaitReady). ctx bounds the boot (a trial's
// health check); the device runs until Close.
func StartFirmware(ctx context.Context, cfg FirmwareConfig) (*FirmwareDevice, error) {
	if err := fence.ValidateDeviceID(cfg.Device); err != nil {
		return nil, fmt.Errorf("sim: firmware device: %w", err)
	}
	if cfg.Dir == "" || cfg.Broker == "" {
		return nil, errors.New("sim: firmware device: Dir and Broker are required")
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("sim: firmware device: %w", err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	log := cfg.Logger.With("device", cfg.Device)
	boot, err := fwjob.Boot(ctx, cfg.Dir, fwjob.BootConfig{Health: ImageHealth(cfg.PowerLoss), Window: cfg.Window,
		Security: cfg.Security, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("sim: firmware device: %w", err)
	}
	markers, err := ReadMarkers(boot.Path)
	if err != nil {
		log.Warn("running image unreadable; no version to report", "slot", boot.Slot, "err", err)
	}
	d := &FirmwareDevice{cfg: cfg, boot: boot, version: markers.Version, log: log, reboot: make(chan struct{}),
		topics: mqtt.Topics{Prefix: cfg.Prefix}}
	d.reports.Store(uint64(time.Now().UnixNano()))
	if err := d.open(); err != nil {
		return nil, fmt.Errorf("sim: firmware device: %w", err)
	}
	return d, nil
}

// open opens the fence point and dials the broker.
func (d *FirmwareDevice) open() error {
	cfg := d.cfg
	s, err := shim.Open(fwjob.DBPath(cfg.Dir), &shim.Options{Logger: cfg.Logger, Keys: cfg.Keys, Root: cfg.Root,
		History: cfg.History, HistoryNote: fwjob.NoteHistory})
	if err != nil {
		return err
	}
	d.dev, err = fwjob.New(fwjob.Config{Dir: cfg.Dir, Device: cfg.Device, BootTries: cfg.Tries, Logger: cfg.Logger, Other: Thermostat{},
		Manifests: cfg.manifests()})
	if err != nil {
		s.Close()
		return err
	}
	mc := cfg.MQTT
	mc.Brokers, mc.ClientID, mc.Logger = []string{cfg.Broker}, cfg.ClientID, cfg.Logger
	if mc.ClientID == "" {
		mc.ClientID = defaultClientID(cfg.Dir)
	}
	// Registered before the first connection: the commands the broker
	// queued while the device rebooted are delivered the moment the
	// session resumes, and must find their handler.
	mc.Subscriptions = append(append([]mqtt.Subscription(nil), mc.Subscriptions...),
		mqtt.Subscription{Filter: d.topics.Cmd(cfg.Device), Handler: d.handle})
	d.shim = s
	d.ctx, d.cancel = context.WithCancel(context.Background())
	d.dialed = make(chan struct{})
	if d.client, err = mqtt.Dial(d.ctx, mc); err != nil {
		d.cancel()
		s.Close()
		return err
	}
	close(d.dialed)
	d.log.Info("firmware device starting", "broker", cfg.Broker, "client_id", mc.ClientID,
		"dir", cfg.Dir, "slot", d.boot.Slot, "trial", d.boot.Trial, "fw_state", d.boot.Status.State,
		"reason", d.boot.Status.Reason, "firmware", d.version)
	return nil
}

// AwaitReady waits until the command topic is subscribed, then publishes
// the state report after the boot (retained): the boot's outcome.
func (d *FirmwareDevice) AwaitReady(ctx context.Context) error {
	if err := d.client.AwaitSubscribed(ctx); err != nil {
		return fmt.Errorf("sim: firmware device: %w", err)
	}
	m, err := d.shim.State(d.cfg.Device)
	if err != nil {
		return fmt.Errorf("sim: firmware device: %w", err)
	}
	if err := d.publishState(ctx, m); err != nil {
		return fmt.Errorf("sim: firmware device: boot report: %w", err)
	}
	return nil
}

// RebootRequested is closed once a command has asked the device to
// restart (fw.activate, or fw.cancel of the trial it runs), after its ack
// and state report went out.
func (d *FirmwareDevice) RebootRequested() <-chan struct{} { return d.reboot }

// Boot returns what the boot loader started.
func (d *FirmwareDevice) Boot() fwjob.BootInfo { return d.boot }

// Status reads the device's firmware state.
func (d *FirmwareDevice) Status() (fwjob.Status, error) { return d.dev.Status(d.shim) }

// Stats returns the device's counters, as a Fleet's.
func (d *FirmwareDevice) Stats() FleetStats {
	return FleetStats{Stats: d.shim.Stats(), AcksPublished: d.acks.Load(), AckErrors: d.ackErrors.Load(),
		StatesPublished: d.states.Load(), StateErrors: d.stateErrors.Load(), BadResponseTopics: d.badResponseTopics.Load(),
		PacketsOversize: d.client.Stats().PacketsOversize}
}

// Close disconnects from the broker (waiting for a handler in progress)
// and closes the fence point.
func (d *FirmwareDevice) Close(ctx context.Context) error {
	if d.closed.Swap(true) {
		return nil
	}
	d.cancel()
	cerr := d.client.Close(ctx)
	return errors.Join(cerr, d.shim.Close())
}

// handle runs on the MQTT client's delivery goroutine, one command at a
// time; the command's PUBACK goes out when it returns.
func (d *FirmwareDevice) handle(m mqtt.Message) {
	<-d.dialed
	dev := d.cfg.Device
	o := d.dev.Handle(d.shim, m.Payload) // committed (fsync) before we return
	if o.Update != nil {
		return // a trust update: taken in (or refused, logged and counted)
	}
	if o.Reboot {
		defer d.rebootOnce.Do(func() { close(d.reboot) }) // after the ack and the report
	}
	ack, err := signAck(d.cfg.Signer, &o.Ack)
	if err != nil {
		d.log.Error("ack does not encode", "err", err)
		return
	}
	topic, refused := ackTopic(d.topics, dev, m.ResponseTopic)
	if refused {
		d.badResponseTopics.Add(1)
		d.log.Warn("response topic refused; acking on the ack topic", "response_topic", shorten(m.ResponseTopic))
	}
	ctx, cancel := context.WithTimeout(d.ctx, publishTimeout)
	defer cancel()
	if err := d.publish(ctx, mqtt.Message{Topic: topic, Payload: ack, CorrelationData: m.CorrelationData}); err != nil {
		d.ackErrors.Add(1)
		d.log.Warn("ack not published; a redelivery will be acked as duplicate",
			"id", o.Ack.ID, "verdict", o.Ack.Verdict.String(), "err", err)
	} else {
		d.acks.Add(1)
	}
	mark, err := d.shim.State(dev) // the device's own mark: an ack of a refused command may carry none
	if err != nil {
		d.log.Error("fence mark unreadable; state not published", "err", err)
		d.stateErrors.Add(1)
	} else if err := d.publishState(ctx, mark); err != nil {
		d.log.Warn("state not published", "err", err)
	}
	if o.Reboot {
		d.log.Info("reboot requested", "fw_state", o.Status.State, "next_slot", nextSlot(o.Status))
	}
}

// publish publishes m once the client counts its connection up: the
// broker delivers the commands it queued for a resumed session (sent while
// the device rebooted) as soon as the CONNACK is out, which can be before
// the client's own bookkeeping has the link, and an ack published then
// would fail "not connected" and be lost.
func (d *FirmwareDevice) publish(ctx context.Context, m mqtt.Message) error {
	if err := d.client.AwaitConnection(ctx); err != nil {
		return err
	}
	return d.client.Publish(ctx, m)
}

// nextSlot is the slot the boot loader boots next.
func nextSlot(s fwjob.Status) string {
	if s.Trial != "" {
		return s.Trial
	}
	return s.Active
}

// publishState publishes the device's state report, retained, under
// fence state m (the epoch and mark after the command, for a signed
// report).
func (d *FirmwareDevice) publishState(ctx context.Context, m fence.State) error {
	raw, err := d.report()
	if err == nil {
		raw, err = signState(d.cfg.Signer, &d.reports, d.cfg.Device, m, raw)
	}
	if err == nil {
		err = d.publish(ctx, mqtt.Message{Topic: d.topics.State(d.cfg.Device), Payload: raw, Retain: true})
	}
	if err != nil {
		d.stateErrors.Add(1)
		return err
	}
	d.states.Add(1)
	return nil
}

// FirmwareState is a FirmwareDevice's state report (CBOR map, text keys):
// the thermostat's State fields, "fw" (fwjob.Status.Report: job, state,
// bytes, size, slot, version, reason, token, image) and "firmware" (the
// running image's VersionMarker; absent without one).
type FirmwareState struct {
	State
	FW       map[string]any `cbor:"fw"`
	Firmware string         `cbor:"firmware,omitempty"`
}

// report encodes the device's state report.
func (d *FirmwareDevice) report() ([]byte, error) {
	st, err := readState(d.shim, d.cfg.Device)
	if err != nil {
		return nil, err
	}
	fw, err := d.dev.Status(d.shim)
	if err != nil {
		return nil, err
	}
	return stateEnc.Marshal(FirmwareState{State: st, FW: fw.Report(), Firmware: d.version})
}

// manifests returns who checks the device's image manifests
// (FirmwareConfig.Manifests).
func (cfg *FirmwareConfig) manifests() auth.ManifestVerifier {
	if cfg.Manifests != nil {
		return cfg.Manifests
	}
	if v, ok := cfg.Keys.(auth.ManifestVerifier); ok && v != nil {
		return v
	}
	if v, ok := cfg.Root.(auth.ManifestVerifier); ok && v != nil {
		return v
	}
	return nil
}
