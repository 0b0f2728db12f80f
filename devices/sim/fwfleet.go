package sim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/fence/history"
	"github.com/edgefence/edgefence/internal/backoff"
)

// DefaultStartParallel is FirmwareFleetConfig.StartParallel's default.
const DefaultStartParallel = 16

// FirmwareFleetConfig configures a FirmwareFleet.
type FirmwareFleetConfig struct {
	Devices []string // device ids, at least one, each once (fence.ValidateDeviceID)
	Dir     string   // device id's state is in Dir/<id> (FirmwareConfig.Dir)
	// Device is every device's configuration: Broker, Prefix, Window,
	// Tries, Security, Keys, Root, Logger, MQTT. Device, Dir, ClientID
	// (derived from the device's directory), Signer, PowerLoss and History
	// are set per device.
	Device FirmwareConfig
	// Signers, per device id, is the device's own key (FirmwareConfig.
	// Signer); a device without one sends plain acks and reports.
	Signers map[string]*auth.Signer
	// HistoryPath, if set, is the history file every device appends its
	// fence decisions to (history.Create, O_APPEND, one write per line),
	// each under its own source, HistorySource+":"+id: one source per fence
	// point, as history.Writer.Recover requires.
	HistoryPath, HistorySource string
	// StartParallel bounds the devices booting at once when the fleet
	// starts; zero means DefaultStartParallel.
	StartParallel int
	// RestartDelay is the wait before starting again a device whose start
	// failed (not one that rebooted); zero means a second.
	RestartDelay time.Duration
}

// FirmwareFleet runs many firmware devices (FirmwareDevice) in this one
// process, for scale benchmarks: each with its own directory, fence point,
// state reports and MQTT client (its own session, so that the commands
// sent while it reboots wait at the broker, as for a device process).
// The proofs run each device in a process of its own (edgefence-devsim
// --firmware), where a reboot and a power loss are real process deaths.
//
// Here a reboot is: the device's MQTT client and fence point closed,
// fwjob.Boot run on its directory (a trial's health check per the image's
// markers), the fence point opened and the client connected again, the
// retained report published. A HealthCrash image abandons the boot as a
// power loss would (the ctx of its StartFirmware cancelled) and the device
// boots again at once, each time spending a try, until the boot loader
// rolls back. Commands that arrive while a device reboots are queued by
// the broker in its session and decided when it is back, never refused; one
// decided as the device goes down may lose its ack with the connection,
// and the broker's redelivery is then acked duplicate (as for a device
// process).
//
// Each device runs in a goroutine the fleet owns; Close stops them all.
type FirmwareFleet struct {
	cfg    FirmwareFleetConfig
	log    *slog.Logger
	hist   map[string]*history.Writer
	cancel context.CancelFunc
	wg     sync.WaitGroup
	done   chan struct{}
	start  chan struct{} // a semaphore: the first boots in progress

	mu      sync.Mutex
	waiting map[string]bool // devices not yet ready once
	ready   chan struct{}   // closed when waiting is empty
	failed  chan error      // the first device whose first boot failed (buffered 1)
	totals  FleetStats      // of the devices' runs that ended

	reboots, powerLosses, restarts atomic.Uint64
}

// StartFirmwareFleet validates cfg, opens the history and starts every
// device in the background; AwaitReady waits for them. The devices run
// until Close.
func StartFirmwareFleet(cfg FirmwareFleetConfig) (*FirmwareFleet, error) {
	if len(cfg.Devices) == 0 || cfg.Dir == "" || cfg.Device.Broker == "" {
		return nil, errors.New("sim: firmware fleet: Devices, Dir and Device.Broker are required")
	}
	seen := make(map[string]bool, len(cfg.Devices))
	for _, id := range cfg.Devices {
		if err := fence.ValidateDeviceID(id); err != nil {
			return nil, fmt.Errorf("sim: firmware fleet: %w", err)
		}
		if seen[id] {
			return nil, fmt.Errorf("sim: firmware fleet: device %q listed twice", id)
		}
		seen[id] = true
	}
	if cfg.StartParallel <= 0 {
		cfg.StartParallel = DefaultStartParallel
	}
	if cfg.RestartDelay <= 0 {
		cfg.RestartDelay = time.Second
	}
	if cfg.Device.Logger == nil {
		cfg.Device.Logger = slog.New(slog.DiscardHandler)
	}
	f := &FirmwareFleet{cfg: cfg, log: cfg.Device.Logger, hist: map[string]*history.Writer{}, done: make(chan struct{}),
		start: make(chan struct{}, cfg.StartParallel), waiting: seen, ready: make(chan struct{}), failed: make(chan error, 1)}
	if err := f.openHistory(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	for _, id := range cfg.Devices {
		f.wg.Add(1)
		go func() { // owned: Close cancels ctx and waits
			defer f.wg.Done()
			f.keep(ctx, id)
		}()
	}
	go func() { // owned: ends when the devices have
		f.wg.Wait()
		close(f.done)
	}()
	return f, nil
}

// openHistory opens one history Writer per device on cfg.HistoryPath.
func (f *FirmwareFleet) openHistory() error {
	if f.cfg.HistoryPath == "" {
		return nil
	}
	for _, id := range f.cfg.Devices {
		w, err := history.Create(f.cfg.HistoryPath, f.cfg.HistorySource+":"+id)
		if err != nil {
			f.closeHistory()
			return fmt.Errorf("sim: firmware fleet: %w", err)
		}
		f.hist[id] = w
	}
	return nil
}

func (f *FirmwareFleet) closeHistory() error {
	var errs []error
	for _, w := range f.hist {
		errs = append(errs, w.Close())
	}
	return errors.Join(errs...)
}

// AwaitReady waits until every device has booted and published its first
// report once. It returns the error of a device whose first start failed
// (its directory, say; it is tried again after RestartDelay) or ctx's.
func (f *FirmwareFleet) AwaitReady(ctx context.Context) error {
	select {
	case <-f.ready:
		return nil
	case err := <-f.failed:
		return err
	case <-ctx.Done():
		return fmt.Errorf("sim: firmware fleet: %w", ctx.Err())
	}
}

// Close stops every device (its MQTT client, then its fence point) and
// closes the history; ctx bounds the wait.
func (f *FirmwareFleet) Close(ctx context.Context) error {
	f.cancel()
	select {
	case <-f.done:
	case <-ctx.Done():
		return fmt.Errorf("sim: firmware fleet: close: %w", ctx.Err())
	}
	return f.closeHistory()
}

// FirmwareFleetStats are a FirmwareFleet's counters: the FleetStats of its
// devices' runs that ended (each reboot ends one), and the reboots.
type FirmwareFleetStats struct {
	FleetStats
	Reboots     uint64 // a command asked a device to restart
	PowerLosses uint64 // boots abandoned by a HealthCrash image
	Restarts    uint64 // starts that failed and were tried again
}

// Stats returns the counters.
func (f *FirmwareFleet) Stats() FirmwareFleetStats {
	f.mu.Lock()
	defer f.mu.Unlock()
	return FirmwareFleetStats{FleetStats: f.totals, Reboots: f.reboots.Load(), PowerLosses: f.powerLosses.Load(),
		Restarts: f.restarts.Load()}
}

// keep runs device id, booting it again after every reboot, until ctx
// ends.
func (f *FirmwareFleet) keep(ctx context.Context, id string) {
	log := f.log.With("device", id)
	for first := true; ctx.Err() == nil; first = false {
		d, powerLoss, err := f.boot(ctx, id, first)
		switch {
		case ctx.Err() != nil:
			if d != nil {
				f.stop(d, log)
			}
			return
		case powerLoss:
			f.powerLosses.Add(1)
			log.Warn("image crashed the device during its health check (power loss): booting again")
			continue
		case err != nil:
			if first {
				select {
				case f.failed <- fmt.Errorf("sim: firmware fleet: device %s: %w", id, err):
				default:
				}
			}
			f.restarts.Add(1)
			log.Error("device did not start; trying again", "err", err, "after", f.cfg.RestartDelay)
			if !backoff.Sleep(ctx, f.cfg.RestartDelay) {
				return
			}
			continue
		}
		if err := d.AwaitReady(ctx); err == nil {
			f.deviceReady(id)
			select {
			case <-ctx.Done():
			case <-d.RebootRequested():
				f.reboots.Add(1)
				log.Info("device rebooting")
			}
		} else if ctx.Err() == nil {
			log.Error("await broker", "err", err)
		}
		f.stop(d, log)
	}
}

// boot starts device id: fwjob.Boot, its fence point, its client. The
// first boots of the fleet take a turn (StartParallel). powerLoss says a
// HealthCrash image abandoned the boot.
func (f *FirmwareFleet) boot(ctx context.Context, id string, first bool) (d *FirmwareDevice, powerLoss bool, err error) {
	if first {
		select {
		case f.start <- struct{}{}:
			defer func() { <-f.start }()
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
	}
	bctx, lost := context.WithCancel(ctx)
	defer lost()
	var crashed atomic.Bool
	cfg := f.cfg.Device
	cfg.Device, cfg.Dir, cfg.ClientID = id, filepath.Join(f.cfg.Dir, id), ""
	cfg.Signer, cfg.History = f.cfg.Signers[id], f.hist[id]
	cfg.PowerLoss = func() { crashed.Store(true); lost() }
	d, err = StartFirmware(bctx, cfg)
	if err != nil {
		return nil, crashed.Load() && ctx.Err() == nil, err
	}
	return d, false, nil
}

// stop closes one run of a device and adds its counters to the totals.
func (f *FirmwareFleet) stop(d *FirmwareDevice, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := d.Close(ctx); err != nil {
		log.Warn("device close", "err", err)
	}
	st := d.Stats()
	f.mu.Lock()
	defer f.mu.Unlock()
	t := &f.totals
	t.Accepted += st.Accepted
	t.Duplicate += st.Duplicate
	t.Stale += st.Stale
	t.Invalid += st.Invalid
	t.AcksPublished += st.AcksPublished
	t.AckErrors += st.AckErrors
	t.StatesPublished += st.StatesPublished
	t.StateErrors += st.StateErrors
	t.BadResponseTopics += st.BadResponseTopics
	t.PacketsOversize += st.PacketsOversize
}

func (f *FirmwareFleet) deviceReady(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.waiting[id] {
		return
	}
	delete(f.waiting, id)
	if len(f.waiting) == 0 {
		close(f.ready)
	}
}
