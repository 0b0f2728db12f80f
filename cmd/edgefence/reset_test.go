package main

// The operator's authorised fence reset (`edgefence fence reset`), end to
// end: the real edgefence binary signs and delivers, a device's shim (the
// in-process fleet, or the real edgefence-devsim) checks it against the
// operator root, the agents learn the new mark from the reset's ack.

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/devices/shim"
	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// operatorKey writes the operator's root key pair as dir/operator.key and
// .pub with the CLI and returns the key file and the root as a device
// holds it.
func operatorKey(t *testing.T, dir string) (string, *auth.RootKey) {
	t.Helper()
	prefix := filepath.Join(dir, "operator")
	if r := edgefence(t, "keys", "new", "--out", prefix); r.code != 0 {
		t.Fatalf("keys new\n%s", r)
	}
	pub, err := auth.ReadPublic(prefix + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	rk, err := auth.NewRootKey([]byte("operator"), pub)
	if err != nil {
		t.Fatal(err)
	}
	return prefix + ".key", rk
}

// etcdRevision is etcd's current revision, as the runbook finds it.
func etcdRevision(t *testing.T, url string) fence.Token {
	t.Helper()
	r := edgefence(t, "etcd", "bump-revision", "--etcd", url, "--to", "1", "--dry-run", "--json")
	var rep struct {
		From int64 `json:"from"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &rep) != nil || rep.From <= 0 {
		t.Fatalf("etcd revision\n%s", r)
	}
	return fence.Token(rep.From)
}

// signReset signs a reset of dev to token (seq 2^64-1) into a new file.
func signReset(t *testing.T, dir, dev string, token fence.Token, keyFile, kid string) string {
	t.Helper()
	out := filepath.Join(dir, fmt.Sprintf("reset-%s-%d-%d.cose", dev, token, time.Now().UnixNano()))
	r := edgefence(t, "fence", "reset", dev, "--to", strconv.FormatUint(uint64(token), 10), "--root-key", keyFile, "--root-kid", kid,
		"--out", out, "--yes")
	if r.code != 0 || !strings.Contains(r.stdout, "new mark: "+strconv.FormatUint(uint64(token), 10)+"/18446744073709551615") ||
		!strings.Contains(r.stdout, "default: the current Unix time in milliseconds") {
		t.Fatalf("fence reset --out\n%s", r)
	}
	return out
}

// deliverReset runs `edgefence fence reset --from file --config cfg --yes`.
func deliverReset(t *testing.T, file, cfg string) result {
	t.Helper()
	return edgefence(t, "fence", "reset", "--from", file, "--config", cfg, "--yes")
}

// waitStatus polls `edgefence status --json` at socket until ok holds for
// dev's status and the counters.
func waitStatus(t *testing.T, socket, dev, what string, ok func(agent.DeviceStatus, agent.Counters) bool) agent.DeviceStatus {
	t.Helper()
	var last result
	for deadline := time.Now().Add(90 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		st, r := status(t, socket)
		last = r
		if st == nil {
			continue
		}
		for _, d := range st.Devices {
			if d.ID == dev && ok(d, st.Counters) {
				return d
			}
		}
	}
	t.Fatalf("%s: never %s; last status:\n%s", dev, what, last)
	return agent.DeviceStatus{}
}

// README, "Token regression: recovery runbook", the reset path, on Debian's
// etcd 3.4 (no --bump-revision anywhere) and the embedded one: a device
// accepted commands at a high token; etcd is wiped; the gateways get low
// tokens, the device refuses them, and gw-2 refuses the device from then on
// (its guard knows the device's mark). The operator resets the device's
// mark to etcd's current revision, signed offline, delivered with the
// agent's MQTT settings; gw-2 learns the new mark from the reset's ack
// and, without a restart, takes the device with a token above it; the
// device accepts. The same reset delivered again is refused, the mark
// unchanged.
func TestTokenRegressionRunbookReset(t *testing.T) {
	for _, kind := range etcdKinds {
		t.Run(kind.name, func(t *testing.T) {
			keyDir := t.TempDir()
			rootKey, rk := operatorKey(t, keyDir)
			e := newEnvFleet(t, func(_ *sandbox.World, fc *sim.FleetConfig) { fc.Root = rk }, "dev-1")
			etcd := kind.start(t, e)
			e.etcdURL = etcd.url
			g := e.regress(etcd)
			high, cfg2, gw2, sock2, gw3, sock3 := g.high, g.cfg2, g.gw2, g.sock2, g.gw3, g.sock3
			if d := waitDeviceState(t, gw2, sock2, "dev-1", agent.StateRefused); d.FenceToken != high {
				t.Fatalf("gw-2's dev-1 after the refusal: %+v", d)
			}
			waitDeviceState(t, gw3, sock3, "dev-1", agent.StateHolding)

			// The reset: to etcd's revision now, signed offline (an
			// air-gapped key: --out), delivered by the agent's config.
			rev := etcdRevision(t, etcd.url)
			if rev >= high {
				t.Fatalf("revision %d after the wipe, want one below the device's mark %d", rev, high)
			}
			file := signReset(t, keyDir, "dev-1", rev, rootKey, "operator")
			r := deliverReset(t, file, cfg2)
			want := fence.Mark{Token: rev, Seq: math.MaxUint64}
			if r.code != 0 || !strings.Contains(r.stdout, "accepted: dev-1's fence mark is now "+want.String()) ||
				!strings.Contains(r.stdout, "published at /edgefence/v1/trust/resets/dev-1") {
				t.Fatalf("fence reset --from\n%s", r)
			}
			if m, err := e.fleet.Mark("dev-1"); err != nil || m != want {
				t.Fatalf("device mark %v, %v: want %v", m, err, want)
			}
			// gw-2 learns the device's new mark from the reset's ack.
			waitStatus(t, sock2, "dev-1", "told of the reset", func(d agent.DeviceStatus, c agent.Counters) bool {
				return d.FenceToken == rev && c.Resets == 1
			})
			// gw-3 held a token the reset spent; stopped, the lock is
			// gw-2's, under a token above the new mark, without a restart.
			if err := gw3.Stop(10 * time.Second); err != nil {
				t.Fatalf("gw-3 did not stop cleanly: %v", err)
			}
			d := waitStatus(t, sock2, "dev-1", "held by gw-2 above the reset", func(d agent.DeviceStatus, _ agent.Counters) bool {
				return d.State == agent.StateHolding && d.Token > rev
			})
			if r, res := e.set(sock2, "dev-1", 22); r.code != 0 || res.Verdict != "accepted" {
				t.Fatalf("gw-2's send under token %d after the reset: want accepted\n%s", d.Token, r)
			}
			if s, err := e.fleet.State("dev-1"); err != nil || s.Setpoint != 22 {
				t.Fatalf("device state %+v, %v: want setpoint 22", s, err)
			}

			// The same reset again: refused, the mark unchanged.
			before, err := e.fleet.Mark("dev-1")
			if err != nil {
				t.Fatal(err)
			}
			r = deliverReset(t, file, cfg2)
			if r.code != 1 || !strings.Contains(r.stdout, "refused (invalid)") || !strings.Contains(r.stdout, "replay") {
				t.Fatalf("replayed reset\n%s", r)
			}
			if m, err := e.fleet.Mark("dev-1"); err != nil || m != before {
				t.Fatalf("device mark %v after the replay, want %v (%v)", m, before, err)
			}
			if r, res := e.set(sock2, "dev-1", 23); r.code != 0 || res.Verdict != "accepted" {
				t.Fatalf("after the replay\n%s", r)
			}

			// gw-1 held the device at the high token before the wipe,
			// and its own guard remembers it (max_token_held). Started
			// again, now with the operator's root, it finds the reset the
			// CLI published in etcd, lowers its guard to the reset and
			// takes the device with a token above the reset and below
			// what it held: accepted.
			if err := gw2.Stop(10 * time.Second); err != nil {
				t.Fatalf("gw-2 did not stop cleanly: %v", err)
			}
			cfg1, sock1 := e.config("gw-1", 5*time.Second)
			appendConfig(t, cfg1, "auth:\n  trust_root: "+filepath.Join(keyDir, "operator.pub")+"\n  trust_root_kid: operator\n")
			e.startAgent("gw-1", cfg1)
			d1 := waitStatus(t, sock1, "dev-1", "held by gw-1 again", func(d agent.DeviceStatus, _ agent.Counters) bool {
				return d.State == agent.StateHolding
			})
			if d1.Token <= rev || d1.Token >= high {
				t.Fatalf("gw-1 holds dev-1 under token %d: want one above the reset %d and below what it held, %d", d1.Token, rev, high)
			}
			if r, res := e.set(sock1, "dev-1", 24); r.code != 0 || res.Verdict != "accepted" {
				t.Fatalf("gw-1's send under token %d after the reset: want accepted\n%s", d1.Token, r)
			}
		})
	}
}

// A device of the unsigned era (no Keys: the real edgefence-devsim with
// only --reset-root) bricked by one forged envelope with token 2^63 from a
// broker client; the holder's commands come back stale and the agent
// refuses the device. `edgefence fence reset` brings it back: the holder
// commands again, without a restart. The devsim is killed with SIGKILL
// right after the reset's ack: the reset is on disk. The same reset
// replayed, a reset of another device on this device's topic and one
// signed by a gateway's key are refused, the mark unchanged. Asking
// without --yes and answering nothing sends nothing.
func TestFenceResetBrickedDevice(t *testing.T) {
	bin := t.TempDir()
	if err := sandbox.BuildCommands(t.Context(), bin, false, "edgefence-devsim"); err != nil {
		t.Fatal(err)
	}
	resetBricked(t, resetDevice{
		args: func(url, dir, pub string) []string {
			return []string{filepath.Join(bin, "edgefence-devsim"), "--mqtt", url, "--devices", "dev-1,dev-2", "--dir", dir,
				"--client-id", "devsim", "--reset-root", pub, "--trust-root-kid", "operator"}
		},
		onDisk: func(t *testing.T, dir, dev string) (fence.Mark, uint64) {
			s, err := shim.Open(filepath.Join(dir, sim.DBFile), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			m, merr := s.Mark(dev)
			last, lerr := s.LastReset(dev)
			if merr != nil || lerr != nil || !auth.ValidResetID(last.ID) {
				t.Fatalf("after kill -9: mark %v (%v), last reset %+v (%v)", m, merr, last, lerr)
			}
			return m, last.Counter
		},
	})
}

// resetDevice is the real device process resetBricked runs: its command
// line (broker, directory, the operator's public key) and what it has on
// disk for a device once killed (the mark, the last reset's counter).
type resetDevice struct {
	args   func(url, dir, pub string) []string
	onDisk func(t *testing.T, dir, dev string) (fence.Mark, uint64)
	// logCheck, if set, checks each run's log once it ended.
	logCheck func(t *testing.T, log string)
}

// resetBricked is the scenario of TestFenceResetBrickedDevice and
// TestFenceResetCDevice on the device d.
func resetBricked(t *testing.T, d resetDevice) {
	keyDir := t.TempDir()
	rootKey, _ := operatorKey(t, keyDir)
	e := newEnv(t, "fleet-unused") // etcd and a broker; the agent's devices are the real device's
	e.devices = []string{"dev-1", "dev-2"}
	devDir := filepath.Join(e.dir, "device")
	startDevice := func(name string) *sandbox.Proc {
		args := d.args(e.world.Broker.URL(), devDir, filepath.Join(keyDir, "operator.pub"))
		log := filepath.Join(e.dir, name+".log")
		p, err := sandbox.StartProc(name, log, nil, args[0], args[1:]...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = p.Kill()
			<-p.Done()
			if d.logCheck != nil {
				d.logCheck(t, log)
			}
		})
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		if err := p.WaitLine(ctx, "ready"); err != nil {
			t.Fatal(err)
		}
		return p
	}
	device := startDevice("device")
	cfg, sock := e.config("gw-1", 5*time.Second)
	gw := e.startAgent("gw-1", cfg)
	tok := e.waitHolding(gw, sock).Devices[0].Token
	if r, res := e.set(sock, "dev-1", 21); r.code != 0 || res.Verdict != "accepted" {
		t.Fatalf("holder\n%s", r)
	}

	// The forgery, from a broker client: a plain envelope, token 2^63.
	brokerCfg := mqtt.Config{Brokers: []string{e.world.Broker.URL()}, ClientID: "mallory"}
	request := func(raw []byte, id string) *fence.Ack {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		a, err := mqtt.Request(ctx, brokerCfg, mqtt.Topics{Prefix: mqtt.DefaultPrefix}, "dev-1", raw, id)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	body, err := fence.EncodeBody(map[string]any{"setpoint": 99})
	if err != nil {
		t.Fatal(err)
	}
	forged, err := fence.MarshalEnvelope(&fence.Envelope{V: fence.Version, Device: "dev-1", Token: 1 << 63, Seq: 1, ID: "forged", Kind: "set", Body: body})
	if err != nil {
		t.Fatal(err)
	}
	if a := request(forged, "forged"); a.Verdict != fence.Accepted {
		t.Fatalf("the forgery at a device without Keys: %+v (issue 13: accepted)", a)
	}
	if r, res := e.set(sock, "dev-1", 22); r.code == 0 || res.Verdict != "stale" {
		t.Fatalf("bricked: the holder's command\n%s", r)
	}
	waitDeviceState(t, gw, sock, "dev-1", agent.StateRefused)

	// Asked, not confirmed: nothing sent.
	rev := etcdRevision(t, e.world.Etcd.Endpoint())
	args := []string{"fence", "reset", "dev-1", "--to", strconv.FormatUint(uint64(rev), 10), "--root-key", rootKey, "--root-kid", "operator", "--config", cfg}
	if r := edgefence(t, args...); r.code != 1 || !strings.Contains(r.stdout, "Proceed? [y/N]") || !strings.Contains(r.stderr, "not confirmed") {
		t.Fatalf("without --yes and no answer\n%s", r)
	}
	if st, _ := status(t, sock); st.Counters.Resets != 0 {
		t.Fatalf("a reset was sent without confirmation: %+v", st.Counters)
	}

	// The reset, then SIGKILL at once: the mark and the counter are on disk.
	file := signReset(t, keyDir, "dev-1", rev, rootKey, "operator")
	if r := deliverReset(t, file, cfg); r.code != 0 || !strings.Contains(r.stdout, "accepted") {
		t.Fatalf("reset\n%s", r)
	}
	if err := device.Kill(); err != nil {
		t.Fatal(err)
	}
	<-device.Done()
	m, counter := d.onDisk(t, devDir, "dev-1")
	if want := (fence.Mark{Token: rev, Seq: math.MaxUint64}); m != want || counter == 0 {
		t.Fatalf("after kill -9: mark %v, reset counter %d; want %v and a counter", m, counter, want)
	}
	startDevice("device-restarted")

	// The agent learned the new mark from the ack: it holds the device
	// again under a token above it, and the device accepts.
	held := waitStatus(t, sock, "dev-1", "held above the reset", func(d agent.DeviceStatus, c agent.Counters) bool {
		return d.State == agent.StateHolding && d.Token > rev && c.Resets == 1
	})
	if held.Token <= tok {
		t.Fatalf("token %d, want one above the first %d", held.Token, tok)
	}
	if r, res := e.set(sock, "dev-1", 23); r.code != 0 || res.Verdict != "accepted" {
		t.Fatalf("the holder after the reset\n%s", r)
	}
	after := fence.Mark{Token: held.Token}

	// Refused, the mark unchanged: the replay, another device's reset on
	// this device's topic, a gateway's key.
	r := deliverReset(t, file, cfg)
	if r.code != 1 || !strings.Contains(r.stdout, "refused (invalid)") || !strings.Contains(r.stdout, "replay") {
		t.Fatalf("replay after the device's restart\n%s", r)
	}
	other, err := os.ReadFile(signReset(t, keyDir, "dev-2", 1, rootKey, "operator"))
	if err != nil {
		t.Fatal(err)
	}
	peek, err := auth.PeekReset(other)
	if err != nil {
		t.Fatal(err)
	}
	if a := request(other, peek.ID); a.Verdict != fence.Invalid || !strings.Contains(a.Reason, "reset for another device") || a.MaxToken != after.Token {
		t.Fatalf("dev-2's reset on dev-1's topic: %+v", a)
	}
	gwKey := filepath.Join(keyDir, "gw-a")
	if r := edgefence(t, "keys", "new", "--out", gwKey); r.code != 0 {
		t.Fatalf("keys new\n%s", r)
	}
	r = edgefence(t, "fence", "reset", "dev-1", "--to", "1", "--root-key", gwKey+".key", "--root-kid", "gw-a/1", "--config", cfg, "--yes")
	if r.code != 1 || !strings.Contains(r.stdout, "refused (invalid)") || !strings.Contains(r.stdout, "not the operator root") {
		t.Fatalf("a gateway key's reset\n%s", r)
	}
	if r, res := e.set(sock, "dev-1", 24); r.code != 0 || res.Verdict != "accepted" {
		t.Fatalf("the holder after the refused resets\n%s", r)
	}
}
