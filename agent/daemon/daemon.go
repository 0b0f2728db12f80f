package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/bbolt"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/agent/bridge"
	"github.com/edgefence/edgefence/agent/images"
	"github.com/edgefence/edgefence/agent/jobs"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/fence/history"
	"github.com/edgefence/edgefence/internal/promtext"
	"github.com/edgefence/edgefence/offline"
	"github.com/edgefence/edgefence/shadow"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// ErrClosed is what Run returns once Run has returned or Close was called.
var ErrClosed = errors.New("daemon: closed")

// closeTimeout bounds the MQTT client's disconnect at shutdown.
const closeTimeout = 5 * time.Second

// Options are what the command line and the build add to the config. The
// zero value is a daemon with none of them.
type Options struct {
	Logger  *slog.Logger // nil: discard
	Version string       // logged at the start, served as edgefence_build_info

	// HistoryPath, if set, is a JSON-lines history (fence/history) of the
	// commands the outbox creates and ends; BridgeHistoryPath, of the
	// bridge's verdicts and applied commands. For fault-injection tests.
	HistoryPath, BridgeHistoryPath string

	// UnsafeIgnoreSessionLoss (agent.Options) and UnsafeNoFenceTable (the
	// bridge without its table) switch invariants off for tests and the
	// demo; only a build with -tags edgefence_unsafe sets them.
	UnsafeIgnoreSessionLoss, UnsafeNoFenceTable bool

	// OnHolding is agent.Options.OnHolding: acquisitions, for benchmarks.
	OnHolding func(device string, token fence.Token)

	// OnBurst is agent.Options.OnBurst: many devices' work begins at once
	// (edgefence run's processor governor, internal/procs).
	OnBurst func()

	// Notify sends one sd_notify(3) message; nil: to $NOTIFY_SOCKET (a
	// no-op without it).
	Notify func(state string) error

	// EtcdClient, if set, adjusts the etcd client's configuration before
	// the client is made (benchmarks add gRPC interceptors).
	EtcdClient func(*clientv3.Config)

	// Sender, if set, returns the agent's Sender built on the MQTT
	// commander (benchmarks observe acks or rewrite envelopes). It should
	// embed the commander: the agent asks its Sender for the link state.
	Sender func(*mqtt.Commander) agent.Sender
}

// Daemon is one running agent with everything it needs; see the package doc.
type Daemon struct {
	cfg *agent.Config
	o   Options
	log *slog.Logger

	api         net.Listener
	closeBridge func() // nil until openBridge succeeded
	br          *bridge.Bridge
	table       *fence.Table
	outbox      *offline.Outbox
	trustDB     *bbolt.DB // the agent's trust store (TrustFile); nil without auth.trust_root
	hist        *history.Writer
	cli         *clientv3.Client
	cmdr        *mqtt.Commander
	trust       *auth.Trust        // the operator's trust chain (gatewayTrust); nil without auth.trust_root
	mcancel     context.CancelFunc // the MQTT client's context
	twins       *shadow.Cache
	images      *images.Cache // the firmware image cache; nil with jobs off
	ag          *agent.Agent
	sd          *notifier
	listens     bool // a notification can reach systemd (notifyListens)
	brokerUp    chan struct{}

	ran       atomic.Bool
	closeOnce sync.Once
}

// New opens the daemon's state and clients for cfg and builds its agent; it
// starts nothing: Run does. It blocks for the etcd TLS check (at most
// etcd.dial_timeout) and, with etcd auth, until etcd answers or ctx ends.
// On an error everything opened is closed again.
func New(ctx context.Context, cfg *agent.Config, o Options) (_ *Daemon, err error) {
	c := *cfg
	c.ApplyDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	d := &Daemon{cfg: &c, o: o, log: o.Logger, brokerUp: make(chan struct{})}
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	d.listens = notifyListens(o)
	if d.o.Notify == nil {
		d.o.Notify = systemdNotify
	}
	defer func() {
		if err != nil {
			d.close()
		}
	}()
	ecfg, err := EtcdClientConfig(c.Etcd)
	if err != nil {
		return nil, err
	}
	if o.EtcdClient != nil {
		o.EtcdClient(&ecfg)
	}
	// A TLS handshake etcd refuses never heals by retrying: say which
	// files are wrong and stop, as for a refused password, before
	// anything is opened.
	if err := CheckEtcdTLS(ctx, ecfg); err != nil {
		return nil, err
	}
	if err := d.openLocal(); err != nil {
		return nil, err
	}
	if err := d.openClients(ctx, ecfg); err != nil {
		return nil, err
	}
	if err := d.newAgent(); err != nil {
		return nil, err
	}
	log := d.log
	log.Info("edgefence starting", "version", o.Version, "gateway", c.Gateway, "devices", len(c.Devices),
		"etcd", c.Etcd.Endpoints, "mqtt", c.MQTT.Brokers, "socket", c.API.Socket, "twins", c.Twins.Enabled, "jobs", c.Jobs.On())
	return d, nil
}

// openLocal claims the API socket and opens the local state: the fence
// table and bridge, the outbox, the history.
func (d *Daemon) openLocal() error {
	cfg, log := d.cfg, d.log
	// Claim the API socket first: a second agent on the same config must
	// fail here, before it campaigns or takes over our MQTT client id.
	var err error
	if d.api, err = agent.ListenAPI(cfg.API.Socket); err != nil {
		return err
	}
	if d.trust, err = gatewayTrust(cfg.Auth); err != nil {
		return err
	}
	// On a home gateway, the fence table and the bridge for its
	// `fence: gateway` devices (the table is locked by one process),
	// verifying their commands against the trust.
	if d.br, d.table, d.closeBridge, err = openBridge(cfg, log, d.o, d.trust); err != nil {
		d.closeBridge = nil
		return err
	}
	if err := os.MkdirAll(cfg.StateDir, 0o750); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	// The outbox: every command is stored (fsync) before it is sent and
	// ends in a recorded terminal state. One process holds it.
	if d.outbox, err = offline.Open(filepath.Join(cfg.StateDir, offline.File), &offline.Options{
		MaxPerDevice: cfg.Outbox.MaxPerDevice, MaxBytesPerDevice: cfg.Outbox.MaxBytesPerDevice,
		MaxTotal: cfg.Outbox.MaxTotal, MaxTotalBytes: cfg.Outbox.MaxTotalBytes,
		TTL: cfg.Outbox.TTL, Retention: cfg.Outbox.Retention, MaxEnded: cfg.Outbox.MaxEnded,
		VerdictDelay: verdictDelay(cfg.Outbox.VerdictDelay),
		Logger:       log.With("component", "outbox"),
	}); err != nil {
		return err
	}
	if cfg.Auth.TrustRoot != "" {
		// The root-signed statements the agent verifies, kept across
		// restarts and etcd rebuilds (agent.Options.TrustDB).
		if d.trustDB, err = bbolt.Open(filepath.Join(cfg.StateDir, TrustFile), 0o600, &bbolt.Options{Timeout: offline.DefaultTimeout}); err != nil {
			return fmt.Errorf("trust store %s: %w", filepath.Join(cfg.StateDir, TrustFile), err)
		}
	}
	if d.o.HistoryPath != "" {
		if d.hist, err = history.Create(d.o.HistoryPath, "outbox:"+cfg.Gateway); err != nil {
			return err
		}
	}
	if cfg.Twins.Enabled {
		// Desired states for a start without etcd, reported writes etcd
		// could not take yet.
		if d.twins, err = shadow.OpenCache(cfg.StateDir, nil); err != nil {
			return err
		}
	}
	return d.openImages() // jobs.go
}

// openClients makes the etcd client (of ecfg) and the MQTT commander, and
// starts the bridge on the commander's client.
func (d *Daemon) openClients(ctx context.Context, ecfg clientv3.Config) error {
	cfg, log := d.cfg, d.log
	var err error
	// With etcd auth the client cannot exist before etcd answers (it
	// authenticates in clientv3.New), so the agent cannot start offline.
	// Tell systemd why the start takes long and keep it from timing the
	// start out (TimeoutStartSec) or killing us for silence (WatchdogSec):
	// a failed start would be retried and, after StartLimitBurst, given up.
	if d.cli, err = newEtcdClient(ctx, ecfg, log, func(why string, next time.Duration) {
		if err := d.o.Notify(startWaitNotice(why, next)); err != nil {
			log.Warn("systemd notify", "err", err)
		}
	}); err != nil {
		return err
	}

	mcfg, err := mqttConfig(cfg.MQTT, log.With("component", "mqtt"))
	if err != nil {
		return err
	}
	if d.br != nil {
		mcfg.Subscriptions = d.br.Subscriptions()
	}
	devices := make([]string, len(cfg.Devices))
	for i, dc := range cfg.Devices {
		devices[i] = dc.ID
	}
	// The MQTT client lives until the agent has released its locks: its
	// own context, cancelled by close.
	mctx, mcancel := context.WithCancel(context.Background())
	d.mcancel = mcancel
	signer, err := gatewaySigner(cfg.Auth)
	if err != nil {
		return err
	}
	if d.cmdr, err = mqtt.NewCommander(mctx, mcfg, mqtt.Topics{Prefix: cfg.MQTT.Prefix}, devices); err != nil {
		return fmt.Errorf("mqtt: %w", err)
	}
	signCommands(d.cmdr, signer, cfg, d.log) // per device: auth required or off (trust.go)
	if d.br != nil {
		if err := d.br.Start(mctx, d.cmdr.Client()); err != nil {
			return err
		}
	}
	return nil
}

// newAgent builds the agent on the opened state and clients, then wires
// what needs it: the device state reports and the systemd notifier.
func (d *Daemon) newAgent() error {
	cfg, log := d.cfg, d.log
	opts := agent.Options{Logger: log, Outbox: d.outbox, TrustDB: d.trustDB, History: d.hist, OnHolding: d.o.OnHolding, OnBurst: d.o.OnBurst,
		UnsafeIgnoreSessionLoss: d.o.UnsafeIgnoreSessionLoss}
	if br := d.br; br != nil {
		opts.BridgeStatus = func() any { return br.Status() }
		if d.table != nil {
			opts.FenceTable = d.table
		}
	}
	if cfg.Twins.Enabled {
		// The twin reconciler: desired states in etcd become fenced
		// twin.set commands; reported writes are fenced by the lock (I5).
		// Only with twins on: the firmware job runner needs the devices'
		// state reports (subscribed below), not their reported twin —
		// it keeps each device's last "fw" report in memory, a new holder
		// gets it from the broker's retained report, and its durable
		// record is the execution in etcd. With jobs on and twins off, a
		// state report costs no etcd request.
		opts.Twins = shadow.NewStore(d.cli, shadow.StoreConfig{Prefix: cfg.Etcd.Prefix, Writer: cfg.Gateway})
		opts.TwinCache = d.twins
	}
	tu, err := trustUpdates(cfg.Auth, d.cmdr) // trust.go
	if err != nil {
		return err
	}
	opts.TrustUpdates = tu
	if d.images != nil {
		// The firmware job runner: executions fenced by the lock (I5),
		// images from the cache (jobs.go).
		opts.Jobs, opts.Images = jobs.NewStore(d.cli, cfg.Etcd.Prefix), cacheImages(d.images)
	}
	var s agent.Sender = d.cmdr
	if d.o.Sender != nil {
		s = d.o.Sender(d.cmdr)
	}
	ag, err := agent.New(cfg, d.cli, s, opts)
	if err != nil {
		return err
	}
	d.ag = ag
	d.cmdr.OnUnmatched(ag.FenceResetAck) // an operator's fence reset (agent/reset.go)
	if cfg.Twins.Enabled || cfg.Jobs.On() {
		subscribeStateReports(d.cmdr.Client(), mqtt.Topics{Prefix: cfg.MQTT.Prefix}, ag)
	}
	wd := watchdogInterval(log)
	d.sd = &notifier{send: d.o.Notify, log: log.With("component", "systemd"),
		campaigning: ag.Campaigning(), brokerUp: d.brokerUp,
		status: ag.Summary, noStatus: !d.listens, watchdog: wd,
		// A live Run loop beats every second, and at most
		// etcd.dial_timeout apart while it opens a session.
		healthy: func() error { return ag.Healthy(max(wd, cfg.Etcd.DialTimeout+2*time.Second)) },
	}
	return nil
}

// Agent returns the daemon's agent (for tests and benchmarks that call it
// in process).
func (d *Daemon) Agent() *agent.Agent { return d.ag }

// Run runs the daemon until ctx ends or a part of it fails, then shuts it
// down in the order the package doc gives and closes everything New
// opened. It returns the first failure: the agent's or the API's (a
// failing metrics endpoint is logged, the agent runs on without it); nil
// after a shutdown by ctx.
func (d *Daemon) Run(ctx context.Context) error {
	if !d.ran.CompareAndSwap(false, true) {
		return ErrClosed
	}
	defer d.close()
	cfg, log, ag := d.cfg, d.log, d.ag

	// agentCtx ends when the shutdown begins; serveCtx once the agent has
	// stopped (the API and metrics answer while it releases its locks).
	agentCtx, stopAgent := context.WithCancel(context.Background())
	defer stopAgent()
	serveCtx, stopServing := context.WithCancel(context.Background())
	defer stopServing()
	shutdown := sync.OnceFunc(func() {
		d.sd.stopping() // STOPPING=1 before the locks are released
		stopAgent()
	})

	var g errgroup.Group
	g.Go(func() error {
		select {
		case <-ctx.Done(): // SIGTERM or SIGINT
			log.Info("shutting down", "cause", context.Cause(ctx))
			shutdown()
		case <-agentCtx.Done(): // a failure began it
		}
		return nil
	})
	g.Go(func() error {
		defer stopServing()
		defer shutdown() // the agent ended by itself: so does the rest
		return ag.Run(agentCtx)
	})
	g.Go(func() error {
		if err := ag.ServeAPIListener(serveCtx, d.api); err != nil {
			shutdown() // the agent is unusable without its API
			return err
		}
		return nil
	})
	g.Go(func() error {
		d.sd.run(serveCtx) // READY, STATUS, WATCHDOG
		return nil
	})
	g.Go(func() error {
		if d.cmdr.AwaitConnection(agentCtx) == nil {
			close(d.brokerUp)
		}
		return nil
	})
	if cfg.Metrics.Listen != "" {
		var extra []promtext.Collector
		if d.br != nil {
			extra = append(extra, d.br.Collector()) // the bridge's series
		}
		g.Go(func() error {
			// /metrics, /healthz, /readyz; the agent runs on without them.
			if err := agent.ServeMetrics(serveCtx, cfg.Metrics.Listen, ag.MetricsHandler(d.o.Version, extra...)); err != nil {
				log.Error("metrics endpoint", "listen", cfg.Metrics.Listen, "err", err)
			}
			return nil
		})
	}
	if d.br != nil {
		g.Go(func() error {
			// Say when the broker routes the devices' commands to us.
			if err := d.cmdr.Client().AwaitSubscribed(agentCtx); err == nil {
				log.Info("bridge ready: serving commands for its devices", "devices", len(cfg.Bridged()))
			}
			return nil
		})
	}
	err := g.Wait()
	d.close()
	log.Info("edgefence stopped")
	return err
}

// Close closes what New opened, in the shutdown order, for a daemon whose
// Run was never called; after Run it does nothing. Safe to call twice.
func (d *Daemon) Close() {
	d.ran.Store(true)
	d.close()
}

// close closes everything opened, in the shutdown order (the package doc),
// skipping what was not: the API socket (if Run did not serve it), the
// bridge and its table, the MQTT client, the etcd client, then the twin
// cache, the outbox and the history.
func (d *Daemon) close() {
	d.closeOnce.Do(func() {
		if d.api != nil {
			_ = d.api.Close() // already closed if Run served it
		}
		if d.closeBridge != nil {
			d.closeBridge() // before the MQTT client it acks through
		}
		if d.cmdr != nil {
			ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
			if err := d.cmdr.Close(ctx); err != nil && !errors.Is(err, mqtt.ErrClosed) {
				d.log.Warn("mqtt close", "err", err)
			}
			cancel()
		}
		if d.mcancel != nil {
			d.mcancel()
		}
		if d.cli != nil {
			_ = d.cli.Close()
		}
		if d.twins != nil {
			_ = d.twins.Close()
		}
		if d.outbox != nil {
			_ = d.outbox.Close()
		}
		if d.trustDB != nil {
			_ = d.trustDB.Close()
		}
		_ = d.hist.Close() // nil-safe
	})
}

// gatewaySigner returns the signer of auth.key_file, or nil without one.
func gatewaySigner(a agent.AuthConfig) (*auth.Signer, error) {
	if a.KeyFile == "" {
		return nil, nil
	}
	key, err := auth.ReadKey(a.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("auth.key_file: %w (a single site makes its keys with `%s`)", err, agent.KeysInitCommand)
	}
	s, err := auth.NewSigner([]byte(a.KeyID), key)
	if err != nil {
		return nil, fmt.Errorf("auth.key_id: %w", err)
	}
	return s, nil
}

// verdictDelay is outbox.verdict_delay for offline.Options (0, strict,
// leaves the outbox's default: the agent then waits for every record).
func verdictDelay(d *time.Duration) time.Duration {
	if d == nil {
		return 0
	}
	return *d
}
