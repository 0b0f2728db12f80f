package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// The agent config serve writes for its devices: <dir>/<gateway>.yaml.
const (
	serveGateway  = "gw-1"
	serveLeaseTTL = 10 * time.Second
	// The broker's other users: the in-process device fleet, and one that
	// may only watch (mosquitto_sub).
	serveFleetUser = "devices"
	serveWatchUser = "watch"
)

// serve runs the default world and simulated devices until ctx is done.
func serve(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f, err := parseServeFlags(args, stderr)
	if err != nil {
		return err
	}
	log := f.logger(stderr)
	if f.dir == "" {
		d, err := os.MkdirTemp("", "edgefence-sandbox-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		f.dir = d
	}
	if f.envFile != "" {
		// A stale file from an earlier run must not look like readiness.
		if err := os.Remove(f.envFile); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}

	w, auth, err := startServeWorld(ctx, f, log)
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

	info := readyInfo{Etcd: w.Etcd.Endpoint(), MQTT: w.Broker.URL(), Dir: f.dir, Env: f.envFile, MQTTUsers: map[string]string{}}
	for _, u := range auth.Users() {
		info.MQTTUsers[u], _ = auth.User(u)
	}
	if f.devices > 0 {
		// The operator's trust chain: gw-1 signs every command, the
		// devices take only what a key the root certified signed.
		keys, err := serveTrust(ctx, w, f, &info)
		if err != nil {
			return err
		}
		stopDevices, err := serveDevices(ctx, w, f, &info, keys, log)
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
		if err := writeAgentConfig(w, f.dir, &info, keys.gateway); err != nil {
			return err
		}
	}

	if f.envFile != "" {
		if err := w.WriteEnvFile(f.envFile); err != nil {
			return err
		}
		defer os.Remove(f.envFile)
		log.Info("wrote env file", "path", f.envFile)
	}
	if err := announce(stdout, w, info); err != nil {
		return err
	}
	log.Info("ready; interrupt to stop", "etcd", w.Etcd.Endpoint(), "mqtt", w.Broker.URL(), "devices", len(info.Devices), "fast", f.fast)

	<-ctx.Done()
	return nil
}

// startServeWorld starts the world of f, its broker requiring the
// credentials of serveAuth.
func startServeWorld(ctx context.Context, f *serveFlags, log *slog.Logger) (*sandbox.World, *sandbox.BrokerAuth, error) {
	auth, err := serveAuth(f)
	if err != nil {
		return nil, nil, err
	}
	w, err := sandbox.StartWorld(ctx, sandbox.WorldConfig{Dir: f.dir, Fast: f.fast, EtcdAddr: f.etcdAddr, MQTTAddr: f.mqttAddr,
		Auth: auth, Logger: log})
	return w, auth, err
}

// serveFlags are serve's flags.
type serveFlags struct {
	dir                string
	fast               bool
	etcdAddr, mqttAddr string
	envFile            string
	devices            int
	verdictLog         string
	mqttUsers, mqttACL string
	verbose            bool
}

// serveAuth is the broker's users and ACL (deploy/mosquitto's rules):
// gateway gw-1, the device fleet's user (the devices' own topics), the
// watch user (read only), each with a new random password, and the users
// and rules of --mqtt-users and --mqtt-acl.
func serveAuth(f *serveFlags) (*sandbox.BrokerAuth, error) {
	p := mqtt.DefaultPrefix
	var devs []string
	for i := 1; i <= f.devices; i++ {
		devs = append(devs, fmt.Sprintf("dev-%d", i))
	}
	acl := sandbox.DeviceACL(p) + sandbox.GatewayACL(p, serveGateway) + sandbox.ObserverACL(p, serveWatchUser)
	if len(devs) > 0 {
		acl += sandbox.FleetACL(p, serveFleetUser, devs...)
	}
	auth, err := sandbox.NewBrokerAuth(acl)
	if err != nil {
		return nil, err
	}
	if f.mqttACL != "" {
		b, err := os.ReadFile(f.mqttACL)
		if err != nil {
			return nil, err
		}
		if err := auth.AddACL(string(b)); err != nil {
			return nil, fmt.Errorf("%s: %w", f.mqttACL, err)
		}
	}
	if f.mqttUsers != "" {
		if err := auth.ReadPasswords(f.mqttUsers); err != nil {
			return nil, err
		}
	}
	users := []string{serveGateway, serveWatchUser}
	if len(devs) > 0 {
		users = append(users, serveFleetUser)
	}
	for _, u := range users {
		if _, err := auth.User(u); err != nil {
			return nil, err
		}
	}
	return auth, nil
}

// logger is serve's log on stderr: text, debug with -v.
func (f *serveFlags) logger(stderr io.Writer) *slog.Logger {
	level := slog.LevelInfo
	if f.verbose {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
}

// parseServeFlags parses and checks serve's flags: flag.ErrHelp after -h,
// errUsage (reported on stderr) on a usage error.
func parseServeFlags(args []string, stderr io.Writer) (*serveFlags, error) {
	f := &serveFlags{}
	fs := newFlagSet("serve", "[flags]", stderr)
	fs.StringVar(&f.dir, "dir", "", "data dir (default: a new temp dir, removed on exit)")
	fs.BoolVar(&f.fast, "fast", false, "fast etcd timing (tick 10 ms, election 100 ms): honours 1–2 s lease TTLs")
	fs.StringVar(&f.etcdAddr, "etcd-addr", "", "etcd client address HOST:PORT (default: a free 127.0.0.1 port)")
	fs.StringVar(&f.mqttAddr, "mqtt-addr", "", "MQTT broker address HOST:PORT (default: a free 127.0.0.1 port)")
	fs.StringVar(&f.envFile, "env", "", "once ready, write EDGEFENCE_ETCD=... and EDGEFENCE_MQTT=... to this file (removed on exit)")
	fs.IntVar(&f.devices, "devices", 3, "simulated devices dev-1..dev-N on the broker (0: none)")
	fs.StringVar(&f.verdictLog, "verdict-log", "", "the devices' verdict log, JSON lines, appended (default <dir>/verdicts.jsonl)")
	fs.StringVar(&f.mqttUsers, "mqtt-users", "", "more broker users: a file of user:password lines")
	fs.StringVar(&f.mqttACL, "mqtt-acl", "", "more broker rules: a file in Mosquitto's acl_file format (deploy/mosquitto/edgefence.acl)")
	fs.BoolVar(&f.verbose, "v", false, "debug logging")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "serve: unexpected arguments %q\n", fs.Args())
		return nil, errUsage
	}
	if f.devices < 0 {
		fmt.Fprintf(stderr, "serve: --devices %d: want 0 or more\n", f.devices)
		return nil, errUsage
	}
	return f, nil
}

// serveKeys are the sandbox's keys (invariant I7): the gateway's, and the
// simulated devices' trust and own keys.
type serveKeys struct {
	gateway *sandbox.GatewayKey
	trust   auth.Keys               // what the devices accept commands from
	signers map[string]*auth.Signer // the devices' own keys: they sign their acks and state reports
}

// serveTrust makes (or takes from an earlier run) the operator's root,
// serveGateway's signing key and certificate, and a key for each of the
// simulated devices dev-1..dev-N in f.dir/trust; it publishes the device
// certificates in the world's etcd (where agents look for them) and
// records the devices and the dir in info.
func serveTrust(ctx context.Context, w *sandbox.World, f *serveFlags, info *readyInfo) (*serveKeys, error) {
	kit, err := sandbox.NewTrustKit(filepath.Join(f.dir, "trust"))
	if err != nil {
		return nil, err
	}
	k := &serveKeys{}
	if k.gateway, err = kit.Gateway(serveGateway, "dev-*"); err != nil {
		return nil, err
	}
	if k.trust, err = kit.Trust(); err != nil {
		return nil, err
	}
	for i := 1; i <= f.devices; i++ {
		info.Devices = append(info.Devices, fmt.Sprintf("dev-%d", i))
	}
	_, certs, err := kit.DeviceKeys(info.Devices...)
	if err != nil {
		return nil, err
	}
	if err := sandbox.PublishDevices(ctx, w.Etcd.Endpoints(), "", certs); err != nil {
		return nil, err
	}
	if k.signers, err = kit.DeviceSigners(info.Devices...); err != nil {
		return nil, err
	}
	info.Trust = kit.Dir
	return k, nil
}

// serveDevices starts info's simulated devices, their data and verdict log
// in f.dir unless given, requiring commands signed as keys allows and
// signing what they send with their own; it returns the function that
// stops them.
func serveDevices(ctx context.Context, w *sandbox.World, f *serveFlags, info *readyInfo, keys *serveKeys, log *slog.Logger) (stop func() error, err error) {
	info.VerdictLog = f.verdictLog
	if info.VerdictLog == "" {
		info.VerdictLog = filepath.Join(f.dir, "verdicts.jsonl")
	}
	return startDevices(ctx, w, info.Devices, filepath.Join(f.dir, "devices"), info.VerdictLog, info.MQTTUsers[serveFleetUser], keys.trust, keys.signers, log)
}

// writeAgentConfig writes an agent config for info's devices, signing
// with gk, to <dir>/<serveGateway>.yaml and records it and its socket in
// info.
func writeAgentConfig(w *sandbox.World, dir string, info *readyInfo, gk *sandbox.GatewayKey) error {
	ac := w.AgentConfig(serveGateway, dir, info.Devices)
	ac.Auth = gk
	ac.LeaseTTL = serveLeaseTTL
	ac.MQTTUser, ac.MQTTPassword = serveGateway, info.MQTTUsers[serveGateway]
	info.Config, info.Socket = filepath.Join(dir, serveGateway+".yaml"), ac.Socket
	return ac.Write(info.Config)
}

// announce prints that the sandbox is ready, in words and as one JSON
// line, and what to try. The env file, the devices and the agent config
// are all ready by the time anyone reads these lines.
func announce(stdout io.Writer, w *sandbox.World, info readyInfo) error {
	fmt.Fprintf(stdout, "edgefence sandbox ready: etcd at %s, MQTT v5 broker at %s, data in %s\n",
		w.Etcd.Endpoint(), w.Broker.URL(), info.Dir)
	line, err := json.Marshal(info)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s\n", line)
	fmt.Fprintf(stdout, "\nThe broker requires a user and password and applies deploy/mosquitto/edgefence.acl's rules. Users:\n")
	for _, u := range slices.Sorted(maps.Keys(info.MQTTUsers)) {
		fmt.Fprintf(stdout, "  %-10s password %s\n", u, info.MQTTUsers[u])
	}
	printTry(stdout, w, info)
	return nil
}

// startDevices runs a fleet of simulated devices on the world's broker,
// waits until every command topic is subscribed, and returns the function
// that stops them.
func startDevices(ctx context.Context, w *sandbox.World, ids []string, dataDir, verdictLog, password string, keys auth.Keys, signers map[string]*auth.Signer, log *slog.Logger) (stop func() error, err error) {
	vf, err := os.OpenFile(verdictLog, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("verdict log: %w", err)
	}
	fleet, err := sim.NewFleet(ctx, sim.FleetConfig{Devices: ids, DataDir: dataDir, Broker: w.Broker.URL(),
		VerdictLog: vf, Logger: log.With("component", "devices"), MQTT: mqtt.Config{Username: serveFleetUser, Password: []byte(password)}, Keys: keys, Signers: signers})
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
		fmt.Fprintf(w, "They take only commands signed by a key the operator's root (in %s) certified: the agent config\n", info.Trust)
		fmt.Fprintf(w, "for them, %s, signs with %s's. In another terminal, try:\n\n", info.Config, serveGateway)
		fmt.Fprintf(w, "  edgefence run --config %s\n", shellQuote(info.Config))
		fmt.Fprintf(w, "  edgefence status --socket %s\n", shellQuote(info.Socket))
		fmt.Fprintf(w, "  edgefence send --socket %s %s set '{\"setpoint\":22}'\n", shellQuote(info.Socket), info.Devices[0])
		fmt.Fprintf(w, "\nTo watch the commands, acks and states (payloads are CBOR), the locks, and the verdicts:\n\n")
	} else {
		fmt.Fprintf(w, "\nNo simulated devices (--devices 0). To watch the MQTT traffic and the locks:\n\n")
	}
	fmt.Fprintf(w, "  mosquitto_sub -V mqttv5 -h %s -p %s -u %s -P %s -t '%s/dev/#' -v\n", host, port, serveWatchUser, info.MQTTUsers[serveWatchUser], mqtt.DefaultPrefix)
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
	// Trust is the dir of the operator's root key and gw-1's signing key
	// and certificate (the agent config's auth section names them).
	Trust string `json:"trust_dir,omitempty"`
	// MQTTUsers are the broker's users and their passwords: gw-1 (the agent
	// config's), devices (the simulated devices'), watch (read only), and
	// those of --mqtt-users.
	MQTTUsers map[string]string `json:"mqtt_users"`
}
