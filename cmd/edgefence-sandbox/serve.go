package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/devices/sandbox"
	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// The agent config serve writes for its devices: <dir>/<gateway>.yaml.
const (
	serveGateway  = "gw-1"
	serveLeaseTTL = 10 * time.Second
)

// serve runs the default world and simulated devices until ctx is done.
func serve(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("serve", "[flags]", stderr)
	dir := fs.String("dir", "", "data dir (default: a new temp dir, removed on exit)")
	fast := fs.Bool("fast", false, "fast etcd timing (tick 10 ms, election 100 ms): honours 1–2 s lease TTLs")
	etcdAddr := fs.String("etcd-addr", "", "etcd client address HOST:PORT (default: a free 127.0.0.1 port)")
	mqttAddr := fs.String("mqtt-addr", "", "MQTT broker address HOST:PORT (default: a free 127.0.0.1 port)")
	envFile := fs.String("env", "", "once ready, write EDGEFENCE_ETCD=... and EDGEFENCE_MQTT=... to this file (removed on exit)")
	nDevices := fs.Int("devices", 3, "simulated devices dev-1..dev-N on the broker (0: none)")
	verdictLog := fs.String("verdict-log", "", "the devices' verdict log, JSON lines, appended (default <dir>/verdicts.jsonl)")
	verbose := fs.Bool("v", false, "debug logging")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "serve: unexpected arguments %q\n", fs.Args())
		return errUsage
	}
	if *nDevices < 0 {
		fmt.Fprintf(stderr, "serve: --devices %d: want 0 or more\n", *nDevices)
		return errUsage
	}

	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	if *dir == "" {
		d, err := os.MkdirTemp("", "edgefence-sandbox-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		*dir = d
	}
	if *envFile != "" {
		// A stale file from an earlier run must not look like readiness.
		if err := os.Remove(*envFile); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}

	w, err := sandbox.StartWorld(ctx, sandbox.WorldConfig{
		Dir:      *dir,
		Fast:     *fast,
		EtcdAddr: *etcdAddr,
		MQTTAddr: *mqttAddr,
		Logger:   log,
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil // interrupted while starting
		}
		return err
	}
	defer func() {
		log.Info("stopping")
		if err := w.Close(); err != nil {
			log.Error("stop", "err", err)
		}
		log.Info("stopped")
	}()

	info := readyInfo{Etcd: w.Etcd.Endpoint(), MQTT: w.Broker.URL(), Dir: *dir, Env: *envFile}
	if *nDevices > 0 {
		for i := 1; i <= *nDevices; i++ {
			info.Devices = append(info.Devices, fmt.Sprintf("dev-%d", i))
		}
		info.VerdictLog = *verdictLog
		if info.VerdictLog == "" {
			info.VerdictLog = filepath.Join(*dir, "verdicts.jsonl")
		}
		stopDevices, err := startDevices(ctx, w, info.Devices, filepath.Join(*dir, "devices"), info.VerdictLog, log)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		defer func() {
			if err := stopDevices(); err != nil {
				log.Error("stop devices", "err", err)
			}
		}()

		ac := w.AgentConfig(serveGateway, *dir, info.Devices)
		ac.LeaseTTL = serveLeaseTTL
		info.Config, info.Socket = filepath.Join(*dir, serveGateway+".yaml"), ac.Socket
		if err := ac.Write(info.Config); err != nil {
			return err
		}
	}

	if *envFile != "" {
		if err := w.WriteEnvFile(*envFile); err != nil {
			return err
		}
		defer os.Remove(*envFile)
		log.Info("wrote env file", "path", *envFile)
	}
	// The env file, the devices and the agent config are all ready by the
	// time anyone reads these lines.
	fmt.Fprintf(stdout, "edgefence sandbox ready: etcd at %s, MQTT v5 broker at %s, data in %s\n",
		w.Etcd.Endpoint(), w.Broker.URL(), *dir)
	line, err := json.Marshal(info)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s\n", line)
	printTry(stdout, w, info)

	log.Info("ready; interrupt to stop", "etcd", w.Etcd.Endpoint(), "mqtt", w.Broker.URL(), "devices", len(info.Devices), "fast", *fast)

	<-ctx.Done()
	return nil
}

// startDevices runs a fleet of simulated devices on the world's broker,
// waits until every command topic is subscribed, and returns the function
// that stops them.
func startDevices(ctx context.Context, w *sandbox.World, ids []string, dataDir, verdictLog string, log *slog.Logger) (stop func() error, err error) {
	vf, err := os.OpenFile(verdictLog, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("verdict log: %w", err)
	}
	fleet, err := sim.NewFleet(ctx, sim.FleetConfig{Devices: ids, DataDir: dataDir, Broker: w.Broker.URL(),
		VerdictLog: vf, Logger: log.With("component", "devices")})
	if err != nil {
		vf.Close()
		return nil, err
	}
	stop = func() error {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return errors.Join(fleet.Close(cctx), vf.Close())
	}
	if err := fleet.AwaitReady(ctx); err != nil {
		return nil, errors.Join(err, stop())
	}
	return stop, nil
}

// printTry tells a person what to do with the sandbox.
func printTry(w io.Writer, world *sandbox.World, info readyInfo) {
	host, port, _ := net.SplitHostPort(world.Broker.Addr())
	if len(info.Devices) > 0 {
		fmt.Fprintf(w, "\nSimulated devices %s take commands on the broker; their verdicts go to %s.\n",
			strings.Join(info.Devices, ", "), info.VerdictLog)
		fmt.Fprintf(w, "An agent config for them is %s. In another terminal, try:\n\n", info.Config)
		fmt.Fprintf(w, "  edgefence run --config %s\n", shellQuote(info.Config))
		fmt.Fprintf(w, "  edgefence status --socket %s\n", shellQuote(info.Socket))
		fmt.Fprintf(w, "  edgefence send --socket %s %s set '{\"setpoint\":22}'\n", shellQuote(info.Socket), info.Devices[0])
		fmt.Fprintf(w, "\nTo watch the commands, acks and states (payloads are CBOR), the locks, and the verdicts:\n\n")
	} else {
		fmt.Fprintf(w, "\nNo simulated devices (--devices 0). To watch the MQTT traffic and the locks:\n\n")
	}
	fmt.Fprintf(w, "  mosquitto_sub -V mqttv5 -h %s -p %s -t '%s/dev/#' -v\n", host, port, mqtt.DefaultPrefix)
	fmt.Fprintf(w, "  etcdctl --endpoints %s get --prefix %s\n", world.Etcd.Endpoint(), agent.DefaultEtcdPrefix)
	if len(info.Devices) > 0 {
		fmt.Fprintf(w, "  tail -f %s\n", shellQuote(info.VerdictLog))
	}
	fmt.Fprintf(w, "\nInterrupt (Ctrl-C) to stop.\n")
}

// shellQuote quotes s for a POSIX shell if it needs it.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./:@%+=,") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// readyInfo is the JSON line serve prints once the servers and devices are
// up.
type readyInfo struct {
	Etcd       string   `json:"etcd"`
	MQTT       string   `json:"mqtt"`
	Dir        string   `json:"dir"`
	Env        string   `json:"env,omitempty"`
	Devices    []string `json:"devices,omitempty"`      // simulated device ids
	VerdictLog string   `json:"verdict_log,omitempty"`  // their verdict log
	Config     string   `json:"agent_config,omitempty"` // an agent config for them
	Socket     string   `json:"agent_socket,omitempty"` // that agent's API socket
}
