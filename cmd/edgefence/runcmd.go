package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/agent/daemon"
	"github.com/edgefence/edgefence/internal/procs"
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
	log := newLogger(cfg.Log, os.Stderr)
	ctx, stop := signalContext()
	defer stop()
	burst, stopGov := tuneRuntime(ctx, cfg, log)
	defer stopGov()
	d, err := daemon.New(ctx, cfg, daemon.Options{
		Logger: log, Version: version, OnBurst: burst,
		HistoryPath: *histPath, BridgeHistoryPath: os.Getenv(historyEnv),
		UnsafeIgnoreSessionLoss: failpoint("ignore-session-loss"), UnsafeNoFenceTable: failpoint("no-fence-table"),
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped while waiting for etcd: nothing held, a clean exit
		}
		return err
	}
	return d.Run(ctx)
}

// tuneRuntime sets the Go runtime for the agent: its GC percent, no heap
// profile sampling without a profiler, and the processor governor until
// ctx ends or stop is called (which waits for it; burst is its Burst, for
// daemon.Options.OnBurst). Each unless the environment sets its own.
func tuneRuntime(ctx context.Context, cfg *agent.Config, log *slog.Logger) (burst, stop func()) {
	if os.Getenv("GOGC") == "" {
		// A gateway agent allocates little: half the Go default keeps the
		// heap's floor at 2 MiB instead of 4, which keeps the agent within
		// its RSS budget (docs/BENCHMARKS.md §16), for GC cycles that cost
		// next to nothing at its allocation rate.
		// GOGC in the environment (e.g. a unit drop-in) wins.
		debug.SetGCPercent(gcPercent)
	}
	if !cfg.Metrics.Pprof {
		// Nothing can read a heap profile without /debug/pprof/: do not
		// sample allocations for one (each sample is a stack walk, and
		// its record stays on the heap).
		runtime.MemProfileRate = 0
	}
	if os.Getenv("GOMAXPROCS") == "" {
		// One processor while the work fits in one, every processor while
		// it does not (internal/procs; docs/BENCHMARKS.md §81).
		// GOMAXPROCS in the environment (e.g. a unit drop-in) wins.
		gov := procs.New(log)
		most := gov.Max()
		if most <= 1 {
			return nil, func() {} // one CPU, or a quota of one: nothing to govern
		}
		govCtx, stopGov := context.WithCancel(ctx)
		govDone := make(chan struct{})
		go func() { defer close(govDone); gov.Run(govCtx) }()
		log.Info("procs: one processor while the work fits in one, every processor while it does not", "max", most)
		return gov.Burst, func() { stopGov(); <-govDone }
	}
	return nil, func() {}
}

// historyEnv names the file the gateway bridge records its verdicts and
// applied commands in (fence/history), for tests and audits; the config
// file has no key for it.
const historyEnv = "EDGEFENCE_HISTORY"
