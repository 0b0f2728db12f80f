package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/veraison/go-cose"

	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// TestForgeriesOnRealBinaries sends the forgeries of issue 13 with
// mosquitto_pub through real Mosquitto, at the real agent (edgefence run,
// signing as gw-a) and the real device simulator (edgefence-devsim
// --trust-root --certs --revocations). Mosquitto runs without an ACL and
// the forger is anonymous: it may publish on every command topic, so the
// fence point is the only defence. Each forgery goes to a device of its
// own; each is refused, the device's mark and setpoint unchanged, and the
// holder's next command is accepted. The control runs the same table with
// no keys (the agent's devices `auth: off`, devsim without a trust root):
// the forgeries that the signature is there to stop land — the device
// takes them and the holder's next command is refused — which shows that
// the signed run would fail without the fence's check. (A replay is a
// duplicate in both: the admit rule stops it, signature or not.) Then the
// other direction: forged acks of every verdict racing the device's own
// (ackRace) and forged state reports (stateForgeries), which the agent
// drops with keys and takes without.
func TestForgeriesOnRealBinaries(t *testing.T) {
	agentBin, devsimBin := binaries(t)
	pub, err := exec.LookPath("mosquitto_pub")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("mosquitto_pub (Debian's mosquitto-clients, make deps): %v", err)
		}
		t.Skipf("mosquitto_pub (Debian's mosquitto-clients, make deps): %v", err)
	}
	t.Run("signed", func(t *testing.T) { forgeryRun(t, agentBin, devsimBin, pub, true) })
	t.Run("control", func(t *testing.T) { forgeryRun(t, agentBin, devsimBin, pub, false) })
}

// forgeryCase is one forgery: forge returns the device it goes after, the
// topic and the payload. want is the fence point's verdict with the fence;
// lands says the device takes it without keys.
type forgeryCase struct {
	name  string
	want  fence.Verdict
	lands bool
	forge func(r *forgeryRig) (victim, topic string, payload []byte)
}

var forgeryCases = []forgeryCase{
	{"token 2^63", fence.Invalid, true, func(r *forgeryRig) (string, string, []byte) {
		return r.plain("f-t63", ForgedToken, 1)
	}},
	{"token and seq 2^64-1", fence.Invalid, true, func(r *forgeryRig) (string, string, []byte) {
		return r.plain("f-max", math.MaxUint64, math.MaxUint64)
	}},
	{"current token with seq 2^64-1", fence.Invalid, true, func(r *forgeryRig) (string, string, []byte) {
		return r.plain("f-seq", r.mark("f-seq").Token, math.MaxUint64)
	}},
	{"replayed old envelope from the wire", fence.Duplicate, false, func(r *forgeryRig) (string, string, []byte) {
		return "f-replay", r.topics.Cmd("f-replay"), r.captured("f-replay", 0)
	}},
	{"envelope re-targeted to another device", fence.Invalid, true, func(r *forgeryRig) (string, string, []byte) {
		// The last envelope of the device with the higher token to the
		// other: without the signature the victim would take it. Devices
		// queued in one etcd transaction share a token value
		// (agent/turn.go); f-rt1 is commanded once more than the others,
		// so that its last envelope is above f-rt2's mark by its seq then.
		src, dst := "f-rt1", "f-rt2"
		if r.mark(src).Token < r.mark(dst).Token {
			src, dst = dst, src
		}
		return dst, r.topics.Cmd(dst), r.retarget(r.lastCaptured(src), dst)
	}},
	{"revoked gateway's envelope", fence.Invalid, true, func(r *forgeryRig) (string, string, []byte) {
		return "f-rev", r.topics.Cmd("f-rev"), r.encode(r.revoked, r.env("f-rev", ForgedToken, 1))
	}},
}

// forgeryDevices are the devices of the table, each commanded twice by the
// holder before the forgeries (f-rt1 three times).
var forgeryDevices = []string{"f-t63", "f-max", "f-seq", "f-replay", "f-rt1", "f-rt2", "f-rev", "f-ack", "f-state"}

// forgeryRig is one run's world as the forger sees it.
type forgeryRig struct {
	t       *testing.T
	signed  bool
	topics  mqtt.Topics
	revoked *auth.Signer // gw-r: certified, then revoked
	verdict string       // the devices' verdict log

	mu     sync.Mutex
	states [][]byte            // f-state's state reports, as published
	wire   map[string][][]byte // command payloads seen on each device's topic
}

func forgeryRun(t *testing.T, agentBin, devsimBin, pub string, signed bool) {
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	dir := t.TempDir()
	m, err := StartMosquitto(ctx, t.TempDir()) // anonymous, no ACL: everyone may publish anything
	if errors.Is(err, ErrNoMosquitto) && os.Getenv("CI") != "true" {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	e := startEtcd(t, EtcdConfig{Fast: true})
	r := &forgeryRig{t: t, signed: signed, verdict: filepath.Join(dir, "verdicts.jsonl"), wire: map[string][][]byte{}}

	// The operator's trust: gw-a (the holder) and gw-r, both certified
	// for the devices; gw-r revoked by the list devsim is given.
	kit, err := NewTrustKit(filepath.Join(dir, "trust"))
	if err != nil {
		t.Fatal(err)
	}
	gk, err := kit.Gateway("gw-a", "f-*")
	if err != nil {
		t.Fatal(err)
	}
	rk, err := kit.Gateway("gw-r", "f-*")
	if err != nil {
		t.Fatal(err)
	}
	revs, err := kit.Revoke(1, rk.KeyID)
	if err != nil {
		t.Fatal(err)
	}
	if r.revoked, err = signerOf(rk); err != nil {
		t.Fatal(err)
	}

	args := []string{"--mqtt", m.URL(), "--devices", strings.Join(forgeryDevices, ","), "--dir", filepath.Join(dir, "devices"),
		"--log", r.verdict, "--client-id", "devsim-forgery"}
	ac := AgentConfig{Gateway: "gw-a", Etcd: e.Endpoint(), MQTT: m.URL(), Devices: forgeryDevices,
		Socket: filepath.Join(dir, "gw-a.sock"), StateDir: filepath.Join(dir, "gw-a-state"), LeaseTTL: 10 * time.Second, LogFormat: "json",
		Twins: true}
	if signed {
		// The devices speak for themselves too: their own keys,
		// their certificates in etcd (acks of auth: required devices).
		devKeys, certs, err := kit.DeviceKeys(forgeryDevices...)
		if err != nil {
			t.Fatal(err)
		}
		if err := PublishDevices(ctx, e.Endpoints(), "", certs); err != nil {
			t.Fatal(err)
		}
		args = append(args, kit.DevsimArgs(revs)...)
		args = append(args, "--device-keys", devKeys)
		ac.Auth = gk
	}
	devsim, err := StartProc("devsim", filepath.Join(dir, "devsim.log"), nil, devsimBin, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = devsim.Stop(10 * time.Second) })
	if err := devsim.WaitLine(ctx, "msg=ready"); err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "gw-a.yaml")
	if err := ac.Write(cfgPath); err != nil {
		t.Fatal(err)
	}
	gw, err := StartProc("gw-a", filepath.Join(dir, "gw-a.log"), nil, agentBin, "run", "--config", cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Stop(10 * time.Second) })

	// An observer records every command on the wire, for the replays
	// (not the trust updates the agent sends before them).
	obs, err := mqtt.Dial(ctx, mqtt.Config{Brokers: []string{m.URL()}, ClientID: "observer", CleanStart: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { obs.Close(context.Background()) })
	obs.Subscribe(r.topics.AllCmd(), func(msg mqtt.Message) {
		if auth.IsUpdate(msg.Payload) {
			return
		}
		dev, _, _ := r.topics.Parse(msg.Topic)
		r.mu.Lock()
		r.wire[dev] = append(r.wire[dev], append([]byte(nil), msg.Payload...))
		r.mu.Unlock()
	})
	obs.Subscribe(r.topics.State("f-state"), func(msg mqtt.Message) {
		r.mu.Lock()
		r.states = append(r.states, append([]byte(nil), msg.Payload...))
		r.mu.Unlock()
	})
	if err := obs.AwaitSubscribed(ctx); err != nil {
		t.Fatal(err)
	}

	holder, send := awaitHolder(t, ctx, agentBin, gw, ac.Socket, forgeryDevices)
	for _, dev := range forgeryDevices {
		sps := []float64{20, 21}
		if dev == "f-rt1" {
			sps = append(sps, 20.5)
		}
		for _, sp := range sps {
			if res := send(dev, sp); res.Verdict != fence.Accepted.String() {
				t.Fatalf("%s: the holder's command: %+v", dev, res)
			}
		}
	}
	if signed {
		// The revocation list is all that stops gw-r: its certificate
		// alone would let its envelope through.
		certsOnly, err := kit.Trust()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := auth.Verify(r.encode(r.revoked, r.env("f-rev", ForgedToken, 1)), certsOnly); err != nil {
			t.Fatalf("gw-r's envelope without the revocation list: %v", err)
		}
	}

	for _, tc := range forgeryCases {
		t.Run(tc.name, func(t *testing.T) {
			r.t = t
			victim, topic, payload := tc.forge(r)
			before := r.records(victim)
			last := before[len(before)-1]
			mosquittoPub(t, ctx, pub, m.Addr(), topic, payload, filepath.Join(dir, "forgery"))
			rec := r.awaitRecord(ctx, victim, len(before))
			next := send(victim, 22)
			t.Logf("forgery: %s (%s), mark %v -> %v; the holder's next command: %s", rec.Verdict, rec.Reason, last.Mark(), rec.Mark(), next.Verdict)
			if !signed && tc.lands {
				// Without keys the attack lands: the test can see it.
				if rec.Verdict != fence.Accepted || next.Verdict == fence.Accepted.String() {
					t.Fatalf("control: the forgery did not land (verdict %s, the holder's next %+v): the signed run proves nothing", rec.Verdict, next)
				}
				return
			}
			if rec.Verdict != tc.want || rec.Mark() != last.Mark() {
				t.Errorf("forgery: %s (%s), mark %v; want %s, the mark %v unchanged", rec.Verdict, rec.Reason, rec.Mark(), tc.want, last.Mark())
			}
			if rec.State == nil || last.State == nil || rec.State.Setpoint != last.State.Setpoint {
				t.Errorf("setpoint after the forgery %+v, was %+v", rec.State, last.State)
			}
			if next.Verdict != fence.Accepted.String() {
				t.Errorf("the holder's next command: %+v", next)
			}
		})
	}

	t.Run("forged acks racing the device's", func(t *testing.T) {
		r.t = t
		var forgers []*auth.Signer // a stolen key of another device
		if signed {
			other, err := kit.DeviceSigners("f-t63")
			if err != nil {
				t.Fatal(err)
			}
			forgers = append(forgers, other["f-t63"])
		}
		ackRace(t, ctx, r, devsim, holder, ac.Socket, forgers, func(topic string, payload []byte) {
			mosquittoPub(t, ctx, pub, m.Addr(), topic, payload, filepath.Join(dir, "forged-ack"))
		})
	})
	t.Run("forged state reports", func(t *testing.T) {
		r.t = t
		stateForgeries(t, ctx, r, kit, e.Endpoint(), ac.Socket, holder.cfg.AgentBin, func(payload []byte) {
			mosquittoPub(t, ctx, pub, m.Addr(), r.topics.State("f-state"), payload, filepath.Join(dir, "forged-state"))
		})
	})
}

// stateForgeries publishes forged state reports for f-state, whose real
// reported setpoint is 21 (the holder's second command): an unsigned one
// (setpoint 666), and with keys also one signed by another device's key
// and the device's own first report (setpoint 20) replayed. With keys the
// agent refuses them all (status device_auth.state_reports_refused) and the
// twin's reported setpoint stays 21; without keys (the control) the
// unsigned one reaches reported: the attack lands.
func stateForgeries(t *testing.T, ctx context.Context, r *forgeryRig, kit *TrustKit, etcd, sock, agentBin string, publish func([]byte)) {
	const dev = "f-state"
	waitSetpoint := func(want float64) bool {
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if twinSetpoint(t, ctx, agentBin, etcd, dev) == want {
				return true
			}
		}
		return false
	}
	if !waitSetpoint(21) {
		t.Fatalf("reported setpoint %v, want the holder's 21", twinSetpoint(t, ctx, agentBin, etcd, dev))
	}
	forged, err := sim.MarshalState(sim.State{Setpoint: 666, Mode: "heat"})
	if err != nil {
		t.Fatal(err)
	}
	if !r.signed {
		publish(forged)
		if !waitSetpoint(666) {
			t.Fatalf("control: the forged report did not reach reported: the signed run proves nothing")
		}
		return
	}
	before := statesRefused(t, ctx, agentBin, sock)
	other, err := kit.DeviceSigners("f-t63")
	if err != nil {
		t.Fatal(err)
	}
	stolen, err := other["f-t63"].SignState(&auth.StateReport{Device: dev, Token: ForgedToken, Seq: 1, Counter: math.MaxUint64, State: forged})
	if err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	if len(r.states) < 2 {
		r.mu.Unlock()
		t.Fatalf("%d state reports of %s on the wire, want 2", len(r.states), dev)
	}
	replayed := r.states[0]
	r.mu.Unlock()
	for _, p := range [][]byte{forged, stolen, replayed} {
		publish(p)
	}
	for deadline := time.Now().Add(60 * time.Second); statesRefused(t, ctx, agentBin, sock) < before+3; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("state reports refused: %d, want 3 more than %d", statesRefused(t, ctx, agentBin, sock), before)
		}
	}
	if v := twinSetpoint(t, ctx, agentBin, etcd, dev); v != 21 {
		t.Fatalf("reported setpoint %v after the forgeries, want 21", v)
	}
}

// twinSetpoint is the setpoint in dev's reported twin (edgefence twin get).
func twinSetpoint(t *testing.T, ctx context.Context, agentBin, etcd, dev string) float64 {
	t.Helper()
	out, err := exec.CommandContext(ctx, agentBin, "twin", "get", "--etcd", etcd, "--json", dev).Output()
	if err != nil {
		t.Fatalf("edgefence twin get: %v", err)
	}
	var doc struct {
		Reported struct {
			State map[string]any `json:"state"`
		} `json:"reported"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatalf("twin get: %v", err)
	}
	v, _ := doc.Reported.State["setpoint"].(float64)
	return v
}

// ackRace: the device f-ack frozen (SIGSTOP), the holder sends it a
// command; the forger, who sees it on the wire, answers it at once with
// forged acks of every verdict — unsigned, and signed by each of forgers
// (stolen keys of other devices) — and only then the device wakes and
// answers itself. With keys, the agent drops every forgery (counted in
// status device_auth.acks_refused) and `edgefence send` reports the
// device's own verdict, accepted. Without keys (the control) the first
// forgery, a stale, decides the command: the attack lands.
func ackRace(t *testing.T, ctx context.Context, r *forgeryRig, devsim *Proc, holder *figure1, sock string, forgers []*auth.Signer, publish func(topic string, payload []byte)) {
	const victim = "f-ack"
	r.mu.Lock()
	seen := len(r.wire[victim])
	r.mu.Unlock()
	refusedBefore := acksRefused(t, ctx, holder.cfg.AgentBin, sock)
	if err := devsim.Freeze(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			if err := devsim.Resume(); err != nil {
				t.Error(err)
			}
		}
	}
	defer resume()
	done := make(chan SendResult, 1)
	go func() {
		res, err := holder.send(ctx, sock, victim, 23)
		if err != nil {
			res.Error = err.Error()
		}
		done <- res
	}()
	var env *fence.Envelope
	for deadline := time.Now().Add(60 * time.Second); env == nil; time.Sleep(10 * time.Millisecond) {
		r.mu.Lock()
		if len(r.wire[victim]) > seen {
			env, _ = auth.Claimed(r.wire[victim][seen])
		}
		r.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatal("the holder's command never reached the wire")
		}
	}
	forged := 0
	for _, v := range []fence.Verdict{fence.Stale, fence.Invalid, fence.Duplicate, fence.Accepted} {
		a := fence.NewAck(env, v, fence.Mark{Token: env.Token + 1<<40, Seq: 1}, "forged")
		raw, err := fence.MarshalAck(&a)
		if err != nil {
			t.Fatal(err)
		}
		publish(r.topics.Ack(victim), raw)
		forged++
		for _, s := range forgers {
			if raw, err = s.SignAck(&a); err != nil {
				t.Fatal(err)
			}
			publish(r.topics.Ack(victim), raw)
			forged++
		}
		if !r.signed {
			break // one forged stale is enough to decide it
		}
	}
	if r.signed {
		for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			n := acksRefused(t, ctx, holder.cfg.AgentBin, sock)
			if n >= refusedBefore+uint64(forged) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("acks refused %d, want %d more than %d", n, forged, refusedBefore)
			}
		}
	}
	resume()
	res := <-done
	t.Logf("%d forged acks; the command's verdict: %s (%s)", forged, res.Verdict, res.Error)
	if !r.signed {
		if res.Verdict != fence.Stale.String() {
			t.Fatalf("control: the forged stale did not decide the command (%+v): the signed run proves nothing", res)
		}
		return
	}
	// The device's own answer decides: accepted — or, when the broker
	// dropped the frozen device's connection meanwhile and delivered the
	// command again after the first ack was lost with it, duplicate (the
	// device applied it once, and says so); every forgery was refused before
	// the device woke. The device's log says it applied the command.
	applied := false
	for _, rec := range r.records(victim) {
		applied = applied || rec.ID == env.ID && rec.Verdict == fence.Accepted
	}
	if !applied || res.Verdict != fence.Accepted.String() && res.Verdict != fence.Duplicate.String() {
		t.Fatalf("send said %+v, the device applied it: %v; want the device's own verdict", res, applied)
	}
}

// acksRefused and statesRefused are the sums of the agent's refused acks
// and state reports (status device_auth).
func acksRefused(t *testing.T, ctx context.Context, agentBin, sock string) uint64 {
	return refusedSum(t, ctx, agentBin, sock, "acks_refused")
}

func statesRefused(t *testing.T, ctx context.Context, agentBin, sock string) uint64 {
	return refusedSum(t, ctx, agentBin, sock, "state_reports_refused")
}

func refusedSum(t *testing.T, ctx context.Context, agentBin, sock, key string) uint64 {
	t.Helper()
	out, err := exec.CommandContext(ctx, agentBin, "status", "--json", "--socket", sock).Output()
	if err != nil {
		t.Fatalf("edgefence status: %v", err)
	}
	var st struct {
		DeviceAuth map[string]json.RawMessage `json:"device_auth"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatalf("status: %v", err)
	}
	var counts map[string]uint64
	if raw, ok := st.DeviceAuth[key]; ok {
		if err := json.Unmarshal(raw, &counts); err != nil {
			t.Fatalf("status device_auth.%s: %v", key, err)
		}
	}
	var n uint64
	for _, v := range counts {
		n += v
	}
	return n
}

// awaitHolder waits until the agent p (API socket sock) holds devices,
// and returns a figure1 that drives it and its `edgefence send`, whose
// failure to run fails the test.
func awaitHolder(t *testing.T, ctx context.Context, agentBin string, p *Proc, sock string, devices []string) (*figure1, func(dev string, setpoint float64) SendResult) {
	t.Helper()
	f := &figure1{cfg: Figure1Config{AgentBin: agentBin, Devices: devices}}
	if _, err := f.waitHolding(ctx, p, sock); err != nil {
		t.Fatal(err)
	}
	return f, func(dev string, setpoint float64) SendResult {
		t.Helper()
		res, err := f.send(ctx, sock, dev, setpoint)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
}

// plain is a forged unsigned envelope for dev on its own topic.
func (r *forgeryRig) plain(dev string, token fence.Token, seq uint64) (string, string, []byte) {
	return dev, r.topics.Cmd(dev), r.encode(nil, r.env(dev, token, seq))
}

func (r *forgeryRig) env(dev string, token fence.Token, seq uint64) *fence.Envelope {
	body, err := sim.SetBody{Setpoint: new(SetpointLate)}.Encode()
	if err != nil {
		r.t.Fatal(err)
	}
	return &fence.Envelope{V: fence.Version, Device: dev, Token: token, Seq: seq, ID: fmt.Sprintf("forged-%s-%d", dev, time.Now().UnixNano()),
		Kind: sim.KindSet, Body: body, Holder: ForgerUser}
}

// encode signs env with s, or encodes it plain when s is nil or the run
// has no keys (its devices would not decode a signed one).
func (r *forgeryRig) encode(s *auth.Signer, env *fence.Envelope) []byte {
	enc := fence.MarshalEnvelope
	if s != nil && r.signed {
		enc = s.Sign
	}
	b, err := enc(env)
	if err != nil {
		r.t.Fatal(err)
	}
	return b
}

// captured is the i-th command payload seen on dev's topic.
func (r *forgeryRig) captured(dev string, i int) []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.wire[dev]) <= i {
		r.t.Fatalf("%s: %d commands captured, want %d", dev, len(r.wire[dev]), i+1)
	}
	return r.wire[dev][i]
}

// lastCaptured is the last command payload seen on dev's topic.
func (r *forgeryRig) lastCaptured(dev string) []byte {
	r.mu.Lock()
	n := len(r.wire[dev])
	r.mu.Unlock()
	return r.captured(dev, max(n-1, 0))
}

// retarget rewrites the device of a captured envelope to dev, keeping its
// signature if it has one.
func (r *forgeryRig) retarget(raw []byte, dev string) []byte {
	var msg cose.Sign1Message
	signed := msg.UnmarshalCBOR(raw) == nil
	inner := raw
	if signed {
		inner = msg.Payload
	}
	env, err := fence.UnmarshalEnvelope(inner)
	if err != nil {
		r.t.Fatal(err)
	}
	env.Device = dev
	out, err := fence.MarshalEnvelope(env)
	if err != nil {
		r.t.Fatal(err)
	}
	if !signed {
		return out
	}
	msg.Payload = out // the signature is over the old payload
	if out, err = msg.MarshalCBOR(); err != nil {
		r.t.Fatal(err)
	}
	return out
}

// mark is dev's mark in the verdict log (after its last decision).
func (r *forgeryRig) mark(dev string) fence.Mark {
	recs := r.records(dev)
	return recs[len(recs)-1].Mark()
}

// records are dev's verdicts so far.
func (r *forgeryRig) records(dev string) []sim.VerdictRecord {
	var out []sim.VerdictRecord
	for _, rec := range readVerdicts(r.t, r.verdict) {
		if rec.Device == dev {
			out = append(out, rec)
		}
	}
	if len(out) == 0 {
		r.t.Fatalf("%s: no verdicts", dev)
	}
	return out
}

// awaitRecord polls the verdict log for dev's verdict number n+1.
func (r *forgeryRig) awaitRecord(ctx context.Context, dev string, n int) sim.VerdictRecord {
	r.t.Helper()
	for {
		if recs := r.records(dev); len(recs) > n {
			return recs[n]
		}
		select {
		case <-ctx.Done():
			r.t.Fatalf("%s: no verdict on the forgery: %v", dev, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// mosquittoPub publishes payload to topic with the mosquitto_pub at pub
// (QoS 1, MQTT v5, anonymous), from a file: the forger's own tool.
func mosquittoPub(t *testing.T, ctx context.Context, pub, addr, topic string, payload []byte, file string) {
	t.Helper()
	if err := os.WriteFile(file, payload, 0o600); err != nil {
		t.Fatal(err)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, pub, "-V", "mqttv5", "-h", host, "-p", port, "-q", "1", "-i", "forger", "-t", topic, "-f", file).CombinedOutput()
	if err != nil {
		t.Fatalf("mosquitto_pub: %v\n%s", err, out)
	}
}

// signerOf is the signer of a sandbox gateway key.
func signerOf(k *GatewayKey) (*auth.Signer, error) {
	key, err := auth.ReadKey(k.KeyFile)
	if err != nil {
		return nil, err
	}
	return auth.NewSigner([]byte(k.KeyID), key)
}
