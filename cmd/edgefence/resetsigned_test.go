package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// A reset of a signed device on the real binaries (issue 29, failures 3
// and 4): the real agent commands the real edgefence-devsim with signed
// commands, the device signs its acks with its enrolled key. A broker
// client captures one of the agent's signed commands. `edgefence fence
// reset --config` to a mark below the captured command's token, its epoch
// above the fleet's in etcd: the device-signed ack is verified, the
// command exits 0 reporting it, and the signed reset is at
// <prefix>/trust/resets/dev-1 in etcd. The
// captured command replayed with mosquitto_pub is refused stale at the
// device (its epoch is closed), the device's mark unchanged. On main the
// reset timed out ("fate unknown": the signed ack was never read) and the
// replay was accepted.
func TestFenceResetSignedDevice(t *testing.T) {
	pub, err := exec.LookPath("mosquitto_pub")
	if err != nil {
		t.Skipf("mosquitto_pub (Debian's mosquitto-clients, make deps): %v", err)
	}
	bin := t.TempDir()
	if err := sandbox.BuildCommands(t.Context(), bin, false, "edgefence-devsim"); err != nil {
		t.Fatal(err)
	}
	_, p, ok := keysDir(t)
	ok("keys", "new", "--out", p("operator"))
	ok("keys", "new", "--out", p("gw-1"))
	ok("keys", "certify", "--root-key", p("operator"), "--pub", p("gw-1.pub"), "--kid", "gw-1/1", "--devices", "dev-1", "--out", p("gw-1.cert"))
	e := newEnv(t, "fleet-unused") // etcd and a broker; the agent's device is the devsim's
	e.devices = []string{"dev-1"}
	ok("keys", "enrol", "dev-1", "--root-key", p("operator"), "--out", p("bundle"), "--etcd", e.world.Etcd.Endpoint())
	devsim, err := sandbox.StartProc("devsim", filepath.Join(e.dir, "devsim.log"), nil, filepath.Join(bin, "edgefence-devsim"),
		"--mqtt", e.world.Broker.URL(), "--devices", "dev-1", "--dir", filepath.Join(e.dir, "device"), "--client-id", "devsim",
		"--trust-root", p("operator.pub"), "--trust-root-kid", "operator", "--certs", p("gw-1.cert"), "--device-keys", p("bundle"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = devsim.Kill(); <-devsim.Done() })
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := devsim.WaitLine(ctx, "ready"); err != nil {
		t.Fatal(err)
	}
	cfg, sock := e.configEdit("gw-1", 5*time.Second, func(c *sandbox.AgentConfig) {
		c.Auth = &sandbox.GatewayKey{KeyFile: p("gw-1.key"), KeyID: "gw-1/1", Certificate: p("gw-1.cert"), TrustRoot: p("operator.pub"),
			TrustRootKID: "operator"}
	})
	gw := e.startAgent("gw-1", cfg)
	token := e.waitHolding(gw, sock).Devices[0].Token

	// A broker client captures the agent's signed commands to dev-1, and
	// later the device's acks.
	w := newWiretap(t, e.world.Broker.URL())
	if r, res := e.set(sock, "dev-1", 21); r.code != 0 || res.Verdict != "accepted" {
		t.Fatalf("the holder's signed command\n%s", r)
	}
	captured, env := w.command(t)
	if env.Token != token || env.Token <= 1 {
		t.Fatalf("captured %+v under the holder's token %d", env, token)
	}

	// The fleet's epoch in etcd (edgefence keys epoch): the reset's
	// default epoch is above it.
	ok("keys", "epoch", "--root-key", p("operator.key"), "--config", cfg, "--epoch", "1125899906842624")
	r := edgefence(t, "fence", "reset", "dev-1", "--to", "1", "--root-key", p("operator.key"), "--root-kid", "operator",
		"--config", cfg, "--yes", "--timeout", "20s")
	to := fence.Mark{Token: 1, Seq: 1<<64 - 1}
	if r.code != 0 || !strings.Contains(r.stdout, "accepted: dev-1's fence mark is now "+to.String()+" in epoch ") ||
		!strings.Contains(r.stdout, "published at /edgefence/v1/trust/resets/dev-1") {
		t.Fatalf("fence reset --config of a device that signs its acks\n%s", r)
	}
	resp, err := e.etcd.Get(t.Context(), agent.TrustResetKey(agent.DefaultEtcdPrefix, "dev-1"))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("the reset in etcd: %v %v", resp, err)
	}
	trust := loadTrust(t, p("operator.pub"), p("bundle/dev-1.cert"))
	reset, err := trust.VerifyReset(resp.Kvs[0].Value, "dev-1")
	if err != nil || reset.Mark() != to || reset.Epoch != 1125899906842625 {
		t.Fatalf("the reset in etcd: %+v %v", reset, err)
	}

	// The captured pre-reset command, replayed by a broker client.
	w.clear()
	addr := strings.TrimPrefix(e.world.Broker.URL(), "mqtt://")
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(e.dir, "captured.cose")
	if err := os.WriteFile(file, captured, 0o600); err != nil {
		t.Fatal(err)
	}
	topics := mqtt.Topics{Prefix: mqtt.DefaultPrefix}
	if out, err := exec.CommandContext(t.Context(), pub, "-V", "mqttv5", "-h", host, "-p", port, "-q", "1", "-i", "replayer",
		"-t", topics.Cmd("dev-1"), "-f", file).CombinedOutput(); err != nil {
		t.Fatalf("mosquitto_pub: %v\n%s", err, out)
	}
	raw := w.ack(t, env.ID)
	v, err := auth.VerifyAck(raw, trust)
	if err != nil {
		t.Fatalf("the device's ack of the replay: %v", err)
	}
	a := v.Ack
	want := fmt.Sprintf("epoch 0 closed: the fence point is at epoch %d", reset.Epoch)
	if a.Verdict != fence.Stale || a.Reason != want || a.State() != (fence.State{Epoch: reset.Epoch, Mark: to}) {
		t.Fatalf("the replayed pre-reset command at the device: %+v, want stale (%s) with the reset's mark", a, want)
	}
}

// wiretap is a broker client watching dev-1's command and ack topics.
type wiretap struct {
	mu       sync.Mutex
	commands [][]byte
	acks     map[string][]byte // by the id they name
}

func newWiretap(t *testing.T, broker string) *wiretap {
	t.Helper()
	w := &wiretap{acks: map[string][]byte{}}
	topics := mqtt.Topics{}
	c, err := mqtt.Dial(t.Context(), mqtt.Config{Brokers: []string{broker}, ClientID: "wiretap", Subscriptions: []mqtt.Subscription{
		{Filter: topics.Cmd("dev-1"), Handler: func(m mqtt.Message) {
			w.mu.Lock()
			w.commands = append(w.commands, m.Payload)
			w.mu.Unlock()
		}},
		{Filter: topics.Ack("dev-1"), Handler: func(m mqtt.Message) {
			if a, err := auth.ClaimedAck(m.Payload); err == nil {
				w.mu.Lock()
				w.acks[a.ID] = m.Payload
				w.mu.Unlock()
			}
		}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := c.AwaitSubscribed(ctx); err != nil {
		t.Fatal(err)
	}
	return w
}

// command returns the last signed command seen (not a trust update).
func (w *wiretap) command(t *testing.T) ([]byte, *fence.Envelope) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := len(w.commands) - 1; i >= 0; i-- {
		if env, err := auth.Peek(w.commands[i]); err == nil {
			return w.commands[i], env
		}
	}
	t.Fatalf("no signed command seen among %d messages", len(w.commands))
	return nil, nil
}

func (w *wiretap) clear() {
	w.mu.Lock()
	defer w.mu.Unlock()
	clear(w.acks)
}

// ack waits for the device's ack naming id.
func (w *wiretap) ack(t *testing.T, id string) []byte {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		w.mu.Lock()
		raw := w.acks[id]
		w.mu.Unlock()
		if raw != nil {
			return raw
		}
	}
	t.Fatalf("no ack of %s", id)
	return nil
}
