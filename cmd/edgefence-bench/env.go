package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/agent/daemon"
	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// Broker names accepted by --broker.
const (
	brokerMochi     = "mochi"
	brokerMosquitto = "mosquitto"
)

// broker is a running MQTT broker.
type broker struct {
	name string
	url  string
	stop func()
}

// startBroker starts mochi in process or Mosquitto as a subprocess.
func startBroker(ctx context.Context, name, dir string) (*broker, error) {
	switch name {
	case brokerMochi:
		b, err := sandbox.StartBroker(sandbox.BrokerConfig{})
		if err != nil {
			return nil, err
		}
		return &broker{name: name, url: b.URL(), stop: func() { _ = b.Close() }}, nil
	case brokerMosquitto:
		d := filepath.Join(dir, "mosquitto")
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
		m, err := sandbox.StartMosquitto(ctx, d)
		if err != nil {
			return nil, err
		}
		return &broker{name: name, url: m.URL(), stop: func() { _ = m.Close() }}, nil
	}
	return nil, fmt.Errorf("unknown broker %q (want %s or %s)", name, brokerMochi, brokerMosquitto)
}

// startEtcd starts an embedded single-node etcd with the fast timings the
// tests use (TickMs=10, ElectionMs=100), data under dir.
func startEtcd(ctx context.Context, dir string) (*sandbox.Etcd, error) {
	d := filepath.Join(dir, "etcd")
	if err := os.MkdirAll(d, 0o700); err != nil {
		return nil, err
	}
	return sandbox.StartEtcd(ctx, sandbox.EtcdConfig{Dir: d, Fast: true})
}

// dupSender wraps the agent's MQTT Commander. While dup is set it rewrites
// every envelope's seq to 1, which the device has already accepted under the
// current token: the fence point answers Duplicate without writing (no
// fsync, no state change, no state publish). Everything else on the path —
// agent.Send, the outbox, the Commander, the broker, the device's decode and
// admit, the ack — is unchanged. It is how the benchmarks isolate the fsync.
type dupSender struct {
	*mqtt.Commander
	dup atomic.Bool
}

func (s *dupSender) Send(ctx context.Context, env *fence.Envelope) (*fence.Ack, error) {
	if s.dup.Load() {
		e := *env
		e.Seq = 1
		env = &e
	}
	return s.Commander.Send(ctx, env)
}

// agentConfig is the config of an in-process bench agent on devs: etcd
// under a prefix of its own, the broker at brokerURL, its state and API
// socket in dir (keep dir short: a socket path has at most 107 bytes);
// unsigned (auth: off) until signWorld signs it.
func agentConfig(gateway, dir string, etcd *sandbox.Etcd, brokerURL string, devs []string) *agent.Config {
	c := &agent.Config{Gateway: gateway, StateDir: dir,
		Etcd:    agent.EtcdConfig{Endpoints: etcd.Endpoints(), Prefix: fmt.Sprintf("/bench/%s-%d", gateway, time.Now().UnixNano()), LeaseTTL: 10 * time.Second},
		MQTT:    agent.MQTTConfig{Brokers: []string{brokerURL}, ClientID: gateway},
		API:     agent.APIConfig{Socket: filepath.Join(dir, "api.sock")},
		Command: agent.CommandConfig{Timeout: 10 * time.Second}}
	for _, d := range devs {
		c.Devices = append(c.Devices, agent.DeviceConfig{ID: d, Auth: agent.AuthOff})
	}
	return c
}

// benchAgent is an in-process agent built and run as `edgefence run` runs
// it (agent/daemon: outbox, API socket, MQTT commander, systemd notifier).
type benchAgent struct {
	*agent.Agent
	started time.Time    // when Run was started (after daemon.New)
	stop    func() error // ends Run and waits for it; safe to call twice
}

// startAgent builds cfg's daemon with o (systemd notifications off) and
// runs it until stop.
func startAgent(ctx context.Context, cfg *agent.Config, o daemon.Options) (*benchAgent, error) {
	o.Notify = func(string) error { return nil }
	d, err := daemon.New(ctx, cfg, o)
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	rctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	started := time.Now()
	go func() { done <- d.Run(rctx) }()
	return &benchAgent{Agent: d.Agent(), started: started, stop: sync.OnceValue(func() error { cancel(); return <-done })}, nil
}

// deviceIDs returns n device ids prefix000, prefix001, ...
func deviceIDs(prefix string, n int) []string {
	w := len(fmt.Sprint(max(n-1, 0)))
	w = max(w, 3)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s%0*d", prefix, w, i)
	}
	return ids
}

// shipTags are the build tags of what ships: the Makefile's SHIPTAGS
// (TestShipTagsAsMakefile).
var shipTags = []string{"grpcnotrace", "nethttpomithttp2"}

// tagsWith is shipTags and extra, as -tags takes them.
func tagsWith(extra ...string) string {
	return strings.Join(append(slices.Clone(shipTags), extra...), ",")
}

// buildBinary builds ./cmd/<name> of the module in the working directory
// into dir, as the gateway binaries ship (static, no cgo), with the build
// tags extra added (edgefence_pprof: a profiling build).
func buildBinary(ctx context.Context, dir, name string, log io.Writer, extra ...string) (string, error) {
	out := filepath.Join(dir, name)
	tags := tagsWith(extra...)
	fmt.Fprintf(log, "CGO_ENABLED=0 go build -tags %s -trimpath -ldflags='-s -w' ./cmd/%s\n", tags, name)
	cmd := exec.CommandContext(ctx, "go", "build", "-tags", tags, "-trimpath", "-ldflags=-s -w", "-o", out, "github.com/edgefence/edgefence/cmd/"+name)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build %s (run from the module, or pass the binary): %w", name, err)
	}
	return out, nil
}

// startFleet starts one sim.Fleet serving devs on the broker at url under
// the MQTT prefix, its data in dir/devices, with fa's keys, waits up to
// wait for it to be subscribed, and returns it with the function that
// closes it.
func startFleet(ctx context.Context, dir, url, prefix, clientID string, devs []string, wait time.Duration, fa fleetAuth) (*sim.Fleet, func(), error) {
	fleet, err := sim.NewFleet(ctx, sim.FleetConfig{Devices: devs, DataDir: filepath.Join(dir, "devices"), Broker: url,
		Prefix: prefix, ClientID: clientID, MQTT: mqtt.Config{CleanStart: true, SessionExpiry: -1}, Keys: fa.keys, Signers: fa.signers})
	if err != nil {
		return nil, nil, err
	}
	closeFleet := func() {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = fleet.Close(c)
	}
	if err := awaitCtx(ctx, wait, fleet.AwaitReady); err != nil {
		closeFleet()
		return nil, nil, err
	}
	return fleet, closeFleet, nil
}

// startFleets starts nf sim.Fleets serving devs on the broker at url under
// the MQTT prefix, device i on fleet i mod nf, fleet i with its data in
// dir/fleet-i and MQTT client id clientID-i, each with a fresh session and fa's keys,
// and waits up to 10 s for each to be subscribed. It returns the fleets it
// started, also with an error: close them with closeFleets.
func startFleets(ctx context.Context, dir, url, prefix, clientID string, devs []string, nf int, fa fleetAuth) ([]*sim.Fleet, error) {
	return startFleetsLanes(ctx, dir, url, prefix, clientID, devs, nf, 1, fa)
}

// startFleetsLanes is startFleets with lanes MQTT clients a fleet
// (sim.FleetConfig.Lanes: the commands arriving on them together share a
// commit).
func startFleetsLanes(ctx context.Context, dir, url, prefix, clientID string, devs []string, nf, lanes int, fa fleetAuth) ([]*sim.Fleet, error) {
	parts := make([][]string, nf)
	for i, d := range devs {
		parts[i%nf] = append(parts[i%nf], d)
	}
	var fleets []*sim.Fleet
	for i, p := range parts {
		f, err := sim.NewFleet(ctx, sim.FleetConfig{Devices: p, DataDir: filepath.Join(dir, fmt.Sprintf("fleet-%d", i)), Broker: url,
			Prefix: prefix, ClientID: fmt.Sprintf("%s-%d", clientID, i), MQTT: mqtt.Config{CleanStart: true, SessionExpiry: -1},
			Keys: fa.keys, Signers: fa.signers, Lanes: lanes})
		if err != nil {
			return fleets, err
		}
		fleets = append(fleets, f)
	}
	for _, f := range fleets {
		if err := awaitCtx(ctx, 10*time.Second, f.AwaitReady); err != nil {
			return fleets, fmt.Errorf("fleet: %w", err)
		}
	}
	return fleets, nil
}

// closeFleets closes fleets, each within 10 s.
func closeFleets(fleets []*sim.Fleet) {
	for _, f := range fleets {
		closeCtx(f.Close)
	}
}

// benchBin is a binary a benchmark runs: its name under ./cmd and its
// path (empty: build it).
type benchBin struct {
	name string
	path *string
}

// buildMissing builds the binaries whose path is empty (buildBinary) and
// sets their paths. It returns how they were built ("" if none was) for
// the tables' headings.
func buildMissing(ctx context.Context, dir string, log io.Writer, bins ...benchBin) (string, error) {
	var built []string
	for _, b := range bins {
		if *b.path != "" {
			continue
		}
		p, err := buildBinary(ctx, dir, b.name, log)
		if err != nil {
			return "", err
		}
		*b.path = p
		built = append(built, "./cmd/"+b.name)
	}
	if len(built) == 0 {
		return "", nil
	}
	return "CGO_ENABLED=0 go build -tags " + tagsWith() + " -trimpath -ldflags='-s -w' " + strings.Join(built, " "), nil
}

// startMochiAndClient starts mochi in process and an etcd client; done
// closes both.
func startMochiAndClient(ctx context.Context, etcd *sandbox.Etcd, dir string) (*broker, *clientv3.Client, func(), error) {
	br, err := startBroker(ctx, brokerMochi, dir)
	if err != nil {
		return nil, nil, nil, err
	}
	cli, err := etcd.Client()
	if err != nil {
		br.stop()
		return nil, nil, nil, err
	}
	return br, cli, func() { cli.Close(); br.stop() }, nil
}
