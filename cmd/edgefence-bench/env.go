package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/devices/sandbox"
	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence"
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

// dupSender wraps the agent's real Sender. While dup is set it rewrites every
// envelope's seq to 1, which the device has already accepted under the
// current token: the fence point answers Duplicate without writing (no
// fsync, no state change, no state publish). Everything else on the path —
// agent.Send, the Commander, the broker, the device's decode and admit, the
// ack — is unchanged. It is how the benchmarks isolate the fsync.
type dupSender struct {
	next agent.Sender
	dup  atomic.Bool
}

func (s *dupSender) Send(ctx context.Context, env *fence.Envelope) (*fence.Ack, error) {
	if s.dup.Load() {
		e := *env
		e.Seq = 1
		env = &e
	}
	return s.next.Send(ctx, env)
}

// nopSender is the Sender of agents that never send (lock benchmarks).
type nopSender struct{}

func (nopSender) Send(context.Context, *fence.Envelope) (*fence.Ack, error) {
	return nil, fmt.Errorf("nopSender: sending is not part of this benchmark")
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

// buildBinary builds ./cmd/<name> of the module in the working directory
// into dir, as the gateway binaries ship (static, no cgo).
func buildBinary(ctx context.Context, dir, name string, log io.Writer) (string, error) {
	out := filepath.Join(dir, name)
	fmt.Fprintf(log, "CGO_ENABLED=0 go build -tags grpcnotrace -trimpath -ldflags='-s -w' ./cmd/%s\n", name)
	cmd := exec.CommandContext(ctx, "go", "build", "-tags", "grpcnotrace", "-trimpath", "-ldflags=-s -w", "-o", out, "github.com/edgefence/edgefence/cmd/"+name)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build %s (run from the module, or pass the binary): %w", name, err)
	}
	return out, nil
}

// startFleet starts one sim.Fleet serving devs on the broker at url under
// the MQTT prefix, its data in dir/devices, waits up to wait for it to be
// subscribed, and returns it with the function that closes it.
func startFleet(ctx context.Context, dir, url, prefix, clientID string, devs []string, wait time.Duration) (*sim.Fleet, func(), error) {
	fleet, err := sim.NewFleet(ctx, sim.FleetConfig{Devices: devs, DataDir: filepath.Join(dir, "devices"), Broker: url,
		Prefix: prefix, ClientID: clientID, MQTT: mqtt.Config{CleanStart: true, SessionExpiry: -1}})
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
