package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/fence/history"
	"github.com/edgefence/edgefence/offline"
	"github.com/edgefence/edgefence/shadow"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// gcPercent is the agent's GOGC unless the environment sets one.
const gcPercent = 50

func cmdRun(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", defaultConfig, "config file (YAML)")
	etcdURL := fs.String("etcd", "", "override etcd.endpoints (comma-separated)")
	mqttURL := fs.String("mqtt", "", "override mqtt.brokers (comma-separated)")
	socket := fs.String("socket", "", "override api.socket")
	histPath := fs.String("history", "", "append a JSON-lines history of created and terminal commands to `file` (fault-injection tests)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `usage: edgefence run [flags]

Runs the agent: campaigns for the configured devices' leases in etcd, issues
fenced commands over MQTT (and serial, on a home gateway), serves the local
API on api.socket. Under systemd: Type=notify. SIGTERM or SIGINT stop it
cleanly (locks released, lease revoked). The config is validated first; every
problem is reported as FILE:LINE: KEY: MESSAGE (or --FLAG: MESSAGE) and the
exit status is 1. Secrets may come from the environment: %s,
%s, their _FILE variants, or $CREDENTIALS_DIRECTORY.

`, agent.EnvMQTTPassword, agent.EnvEtcdPassword)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	// Flag overrides are validated with the file; their problems name the flag.
	var overrides []agent.Override
	if *etcdURL != "" {
		overrides = append(overrides, agent.Override{Flag: "--etcd", Key: "etcd.endpoints",
			Apply: func(c *agent.Config) { c.Etcd.Endpoints = strings.Split(*etcdURL, ",") }})
	}
	if *mqttURL != "" {
		overrides = append(overrides, agent.Override{Flag: "--mqtt", Key: "mqtt.brokers",
			Apply: func(c *agent.Config) { c.MQTT.Brokers = strings.Split(*mqttURL, ",") }})
	}
	if *socket != "" {
		overrides = append(overrides, agent.Override{Flag: "--socket", Key: "api.socket",
			Apply: func(c *agent.Config) { c.API.Socket = *socket }})
	}
	cfg, err := agent.LoadConfig(*configPath, overrides...)
	if err != nil {
		return err
	}
	ecfg, err := etcdClientConfig(cfg.Etcd)
	if err != nil {
		return err
	}
	log := newLogger(cfg.Log, os.Stderr)
	if os.Getenv("GOGC") == "" {
		// A gateway agent allocates little: half the Go default keeps the
		// heap's floor at 2 MiB instead of 4, which keeps the agent within
		// its RSS budget (docs/BENCHMARKS.md §16), for GC cycles that cost
		// next to nothing at its allocation rate.
		// GOGC in the environment (e.g. a unit drop-in) wins.
		debug.SetGCPercent(gcPercent)
	}
	ctx, stop := signalContext()
	defer stop()
	// A TLS handshake etcd refuses never heals by retrying: say which
	// files are wrong and stop, as for a refused password.
	if err := checkEtcdTLS(ctx, ecfg); err != nil {
		return err
	}

	// Claim the API socket first: a second agent on the same config must
	// fail here, before it campaigns or takes over our MQTT client id.
	apiListener, err := agent.ListenAPI(cfg.API.Socket)
	if err != nil {
		return err
	}
	defer apiListener.Close() // closed by ServeAPIListener once it runs

	// On a home gateway, the fence table and the bridge for its
	// `fence: gateway` devices (the table is locked by one process).
	br, table, closeBridge, err := openBridge(cfg, log)
	if err != nil {
		return err
	}
	defer closeBridge()

	if err := os.MkdirAll(cfg.StateDir, 0o750); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	// The outbox: every command is stored (fsync) before it is sent and
	// ends in a recorded terminal state. One process holds it.
	ob, err := offline.Open(filepath.Join(cfg.StateDir, offline.File), &offline.Options{
		MaxPerDevice: cfg.Outbox.MaxPerDevice, MaxBytesPerDevice: cfg.Outbox.MaxBytesPerDevice,
		MaxTotal: cfg.Outbox.MaxTotal, MaxTotalBytes: cfg.Outbox.MaxTotalBytes,
		TTL: cfg.Outbox.TTL, Retention: cfg.Outbox.Retention,
		Logger: log.With("component", "outbox"),
	})
	if err != nil {
		return err
	}
	defer ob.Close()
	var hist *history.Writer
	if *histPath != "" {
		if hist, err = history.Create(*histPath, "outbox:"+cfg.Gateway); err != nil {
			return err
		}
		defer hist.Close()
	}

	// With etcd auth the client cannot exist before etcd answers (it
	// authenticates in clientv3.New), so the agent cannot start offline.
	// Tell systemd why the start takes long and keep it from timing the
	// start out (TimeoutStartSec) or killing us for silence (WatchdogSec):
	// a failed start would be retried and, after StartLimitBurst, given up.
	cli, err := newEtcdClient(ctx, ecfg, log, func(why string, next time.Duration) {
		if err := systemdNotify(startWaitNotice(why, next)); err != nil {
			log.Warn("systemd notify", "err", err)
		}
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped while waiting for etcd: nothing held, a clean exit
		}
		return err
	}
	defer cli.Close()

	devices := make([]string, len(cfg.Devices))
	for i, d := range cfg.Devices {
		devices[i] = d.ID
	}
	// The MQTT client lives until the agent has released its locks, so it
	// gets its own context, closed below.
	mctx, mcancel := context.WithCancel(context.Background())
	defer mcancel()
	mcfg := mqtt.Config{
		Brokers:       cfg.MQTT.Brokers,
		ClientID:      cfg.MQTT.ClientID,
		KeepAlive:     cfg.MQTT.KeepAlive,
		SessionExpiry: cfg.MQTT.SessionExpiry,
		MaxBackoff:    cfg.MQTT.ReconnectBackoffMax,
		Logger:        log.With("component", "mqtt"),
	}
	if err := mqttCredentials(cfg.MQTT, &mcfg); err != nil {
		return err
	}
	var opts agent.Options
	if br != nil {
		mcfg.Subscriptions = br.Subscriptions()
		opts.BridgeStatus = func() any { return br.Stats() }
		if table != nil {
			opts.FenceTable = table
		}
	}
	var twinAgent atomic.Pointer[agent.Agent] // set once the agent exists
	if cfg.Twins.Enabled {
		// Device state reports update reported (agent.DeviceState): only
		// while this agent holds the device, never a command by itself.
		topics := mqtt.Topics{Prefix: cfg.MQTT.Prefix}
		mcfg.Subscriptions = append(mcfg.Subscriptions, mqtt.Subscription{Filter: topics.State("+"), Handler: func(m mqtt.Message) {
			dev, leaf, ok := topics.Parse(m.Topic)
			ag := twinAgent.Load()
			if !ok || leaf != mqtt.LeafState || ag == nil {
				return
			}
			ag.DeviceStateReport(dev, m.Payload) // counts and logs (rate-limited) the malformed
		}})
	}
	cmdr, err := mqtt.NewCommander(mctx, mcfg, mqtt.Topics{Prefix: cfg.MQTT.Prefix}, devices)
	if err != nil {
		return fmt.Errorf("mqtt: %w", err)
	}
	if br != nil {
		if err := br.Start(mctx, cmdr.Client()); err != nil {
			return err
		}
	}

	if cfg.Twins.Enabled {
		// The twin reconciler: desired states in etcd become fenced
		// twin.set commands; reported writes are fenced by the lock (I5).
		tc, err := shadow.OpenCache(cfg.StateDir, nil)
		if err != nil {
			return err
		}
		defer tc.Close()
		opts.Twins = shadow.NewStore(cli, shadow.StoreConfig{Prefix: cfg.Etcd.Prefix, Writer: cfg.Gateway})
		opts.TwinCache = tc
	}
	opts.Logger = log
	opts.Outbox, opts.History = ob, hist
	opts.UnsafeIgnoreSessionLoss = failpoint("ignore-session-loss")
	ag, err := agent.New(cfg, cli, cmdr, opts)
	if err != nil {
		return err
	}
	twinAgent.Store(ag)
	log.Info("edgefence starting", "version", version, "gateway", cfg.Gateway, "devices", len(cfg.Devices),
		"etcd", cfg.Etcd.Endpoints, "mqtt", cfg.MQTT.Brokers, "socket", cfg.API.Socket, "twins", cfg.Twins.Enabled)

	// systemd (notify.go): READY, STATUS, WATCHDOG while healthy and
	// STOPPING; no-ops without NOTIFY_SOCKET. A signal (ctx) does not stop
	// the agent directly: shutdown says STOPPING=1 first, then cancels
	// actx, and the agent releases its locks.
	brokerUp := make(chan struct{})
	wd := watchdogInterval(log)
	sd := &notifier{send: systemdNotify, log: log.With("component", "systemd"),
		campaigning: ag.Campaigning(), brokerUp: brokerUp,
		status: ag.Summary, watchdog: wd,
		// A live Run loop beats every second, and at most
		// etcd.dial_timeout apart while it opens a session.
		healthy: func() error { return ag.Healthy(max(wd, cfg.Etcd.DialTimeout+2*time.Second)) },
	}
	nctx, ncancel := context.WithCancel(context.Background())
	ndone := make(chan struct{})
	go func() {
		defer close(ndone)
		sd.run(nctx)
	}()
	defer func() { ncancel(); <-ndone }()

	var wg sync.WaitGroup
	errc := make(chan error, 2)
	actx, cancel := context.WithCancel(context.Background())
	defer cancel()
	shutdown := func() {
		sd.stopping()
		cancel()
	}
	wg.Add(4)
	go func() {
		defer wg.Done()
		select {
		case <-ctx.Done(): // SIGTERM or SIGINT
			log.Info("shutting down", "cause", context.Cause(ctx))
			shutdown()
		case <-actx.Done():
		}
	}()
	go func() {
		defer wg.Done()
		if cmdr.AwaitConnection(actx) == nil {
			close(brokerUp)
		}
	}()
	go func() {
		defer wg.Done()
		errc <- ag.Run(actx)
	}()
	go func() {
		defer wg.Done()
		if err := ag.ServeAPIListener(actx, apiListener); err != nil {
			errc <- err
			shutdown() // the agent is unusable without its API
		}
	}()
	if cfg.Metrics.Listen != "" {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// /metrics, /healthz, /readyz; the agent runs on without them.
			var extra []prometheus.Collector
			if br != nil {
				extra = append(extra, br.Collector())
			}
			if err := agent.ServeMetrics(actx, cfg.Metrics.Listen, ag.MetricsHandler(version, extra...)); err != nil {
				log.Error("metrics endpoint", "listen", cfg.Metrics.Listen, "err", err)
			}
		}()
	}
	if br != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Say when the broker routes the devices' commands to us.
			if err := cmdr.Client().AwaitSubscribed(actx); err == nil {
				log.Info("bridge ready: serving commands for its devices", "devices", len(cfg.Bridged()))
			}
		}()
	}
	wg.Wait()
	close(errc)

	cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer ccancel()
	closeBridge() // before the MQTT client it acks through
	if err := cmdr.Close(cctx); err != nil && !errors.Is(err, mqtt.ErrClosed) {
		log.Warn("mqtt close", "err", err)
	}
	var first error
	for err := range errc {
		if err != nil && first == nil {
			first = err
		}
	}
	log.Info("edgefence stopped")
	return first
}
