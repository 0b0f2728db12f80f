package sandbox

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// TestFigure1CDeviceSigned is Figure 1 with the C device and the trust on
// (invariant I7): both agents sign, efsdev verifies every command against
// the kit's root and the gateway certificates (efs_verify_signed, mbedTLS)
// and signs its acks and state reports with its device key, which the
// agents verify; A's late command is refused stale by the C code; in the
// forgery scene an unsigned envelope with token 2^63 is refused invalid,
// the mark unchanged, and B's next command accepted.
func TestFigure1CDeviceSigned(t *testing.T) {
	bin := CDeviceForTest(t)
	var dir string
	res := runFigure1(t, func(c *Figure1Config) {
		c.Device, c.CDeviceBin = DeviceC, bin
		c.Trust, c.Forgery = trustKit(t), true
		dir = c.Dir
	})
	if err := res.CheckFenced(); err != nil {
		t.Fatal(err)
	}
	checkLateRefusedAtDevice(t, res)
	if f := res.Forgery; f == nil || f.Verdict != fence.Invalid || f.After != f.Before || f.After.Token != res.TokenB[f.Device] {
		t.Fatalf("forgery %+v, want refused invalid at B's mark (tokens %v)", f, res.TokenB)
	}
	checkSanitizerClean(t, filepath.Join(dir, "devsim.log"))
	b, err := os.ReadFile(filepath.Join(dir, "devsim.log"))
	if err != nil || !strings.Contains(string(b), "commands must be signed") {
		t.Fatalf("efsdev did not run signed: %v\n%s", err, b)
	}
}

// signedRig is a C device with the trust on, and what talks to it: a
// gateway's signer, and a client that keeps every raw ack and state report.
type signedRig struct {
	bin, url, dir string
	kit           *TrustKit
	gw            *GatewayKey
	sign          *auth.Signer
	verify        *auth.Trust // the root and the device's certificate: what the agent checks acks with
	cl            *mqtt.Client
	topics        mqtt.Topics
	acks, states  chan []byte
}

const signedDev = "dev-s"

func newSignedRig(t testing.TB) *signedRig {
	t.Helper()
	r := &signedRig{bin: CDeviceForTest(t), dir: t.TempDir(), kit: trustKit(t), acks: make(chan []byte, 64), states: make(chan []byte, 64)}
	var err error
	if r.gw, err = r.kit.Gateway("gw-a", "dev-*"); err != nil {
		t.Fatal(err)
	}
	key, err := auth.ReadKey(r.gw.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	if r.sign, err = auth.NewSigner([]byte(r.gw.KeyID), key); err != nil {
		t.Fatal(err)
	}
	_, certs, err := r.kit.DeviceKeys(signedDev)
	if err != nil {
		t.Fatal(err)
	}
	if r.verify, err = r.kit.Trust(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.verify.AddCertificate(certs[signedDev]); err != nil {
		t.Fatal(err)
	}
	r.url = startBroker(t, BrokerConfig{}).URL()
	r.cl = DialTest(t, r.url, "gateway")
	r.cl.Subscribe(r.topics.AllAck(), func(m mqtt.Message) { r.acks <- m.Payload })
	r.cl.Subscribe(r.topics.State(signedDev), func(m mqtt.Message) { r.states <- m.Payload })
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := r.cl.AwaitSubscribed(ctx); err != nil {
		t.Fatal(err)
	}
	return r
}

// start runs efsdev with the root only (it learns gateway certificates
// over the air) and the device's key.
func (r *signedRig) start(t testing.TB, round int) (*Proc, string) {
	t.Helper()
	return r.startBin(t, round, r.bin)
}

// startBin runs bin (efsdev, or edgefence-devsim: the same flags).
func (r *signedRig) startBin(t testing.TB, round int, bin string) (*Proc, string) {
	t.Helper()
	return startDeviceProc(t, r.dir, round, nil, bin, "--mqtt", r.url, "--devices", signedDev,
		"--dir", filepath.Join(r.dir, "data"), "--log", filepath.Join(r.dir, "verdicts.jsonl"), "--client-id", "efsdev-signed",
		"--trust-root", r.kit.RootPub(), "--trust-root-kid", r.kit.RootKID, "--device-keys", filepath.Join(r.kit.Dir, "devices"))
}

func (r *signedRig) publish(t testing.TB, payload []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := r.cl.Publish(ctx, mqtt.Message{Topic: r.topics.Cmd(signedDev), Payload: payload}); err != nil {
		t.Fatal(err)
	}
}

func envelope(t testing.TB, token fence.Token, seq uint64, sp float64) *fence.Envelope {
	t.Helper()
	body, err := setpoint(sp).Encode()
	if err != nil {
		t.Fatal(err)
	}
	return &fence.Envelope{V: fence.Version, Device: signedDev, Token: token, Seq: seq, ID: CommandID(signedDev, token, seq),
		Kind: sim.KindSet, Body: body, Holder: "gw-a"}
}

// send publishes env signed by s (or plain if s is nil) and returns the
// device's ack, verified with fence/auth's VerifyAck against the device's
// certificate and bound to env.
func (r *signedRig) send(t testing.TB, s *auth.Signer, env *fence.Envelope) *fence.Ack {
	t.Helper()
	var raw []byte
	var err error
	if s != nil {
		raw, err = s.Sign(env)
	} else {
		raw, err = fence.MarshalEnvelope(env)
	}
	if err != nil {
		t.Fatal(err)
	}
	r.publish(t, raw)
	return r.awaitAck(t, env)
}

func (r *signedRig) awaitAck(t testing.TB, env *fence.Envelope) *fence.Ack {
	t.Helper()
	timeout := time.After(15 * time.Second)
	for {
		select {
		case raw := <-r.acks:
			v, err := auth.VerifyAck(raw, r.verify)
			if err != nil {
				t.Fatalf("the C device's ack does not verify: %v (% x)", err, raw)
			}
			if v.Ack.ID != env.ID {
				continue
			}
			if string(v.KeyID) != signedDev+"/1" {
				t.Fatalf("ack signed by %q", v.KeyID)
			}
			if err := auth.BoundTo(v.Ack, env); err != nil {
				t.Fatal(err)
			}
			return v.Ack
		case <-timeout:
			t.Fatalf("no ack for %s", env.ID)
		}
	}
}

// awaitState returns the next state report, verified with VerifyState.
func (r *signedRig) awaitState(t testing.TB) *auth.StateReport {
	t.Helper()
	select {
	case raw := <-r.states:
		v, err := auth.VerifyState(raw, r.verify)
		if err != nil {
			t.Fatalf("the C device's state report does not verify: %v (% x)", err, raw)
		}
		return v.Report
	case <-time.After(15 * time.Second):
		t.Fatal("no state report")
	}
	return nil
}

func (r *signedRig) update(t testing.TB, stmts ...[]byte) {
	t.Helper()
	u, err := auth.MarshalUpdate(stmts)
	if err != nil {
		t.Fatal(err)
	}
	r.publish(t, u)
}

func wantVerdict(t *testing.T, what string, a *fence.Ack, v fence.Verdict, reason string, mark fence.Mark) {
	t.Helper()
	if a.Verdict != v || !strings.Contains(a.Reason, reason) || a.Mark() != mark {
		t.Fatalf("%s: %+v; want %s (%q) at mark %v", what, a, v, reason, mark)
	}
}

// TestCDeviceSigned: the C device with the trust on, against fence/auth.
// A command before any gateway certificate is refused (unknown key); the
// certificate arrives in a trust update on the cmd topic (no ack), and the
// next signed command is accepted; its ack and state report verify with
// VerifyAck / VerifyState against the device's certificate, bound to the
// command. Unsigned, forged (a flipped bit), uncertified-for-the-device and
// device-key-signed commands are refused invalid with the mark unchanged.
// After a kill -9 and a restart with the root alone the certificate
// learned is still there (<dir>/trust.cbor: stored before it took effect);
// a revocation list refuses gw-a's commands, an older one replayed does not
// un-revoke, nor do a kill -9 and a restart.
func TestCDeviceSigned(t *testing.T) {
	r := newSignedRig(t)
	p, logPath := r.start(t, 0)
	wantVerdict(t, "before the certificate", r.send(t, r.sign, envelope(t, 5, 1, 21)), fence.Invalid, "unknown", fence.Mark{})

	cert, err := os.ReadFile(r.gw.Certificate)
	if err != nil {
		t.Fatal(err)
	}
	r.update(t, cert)
	env := envelope(t, 5, 1, 22)
	wantVerdict(t, "after the update", r.send(t, r.sign, env), fence.Accepted, "", fence.Mark{Token: 5, Seq: 1})
	rep := r.awaitState(t)
	st, err := sim.UnmarshalState(rep.State)
	if err != nil || rep.Device != signedDev || rep.Mark() != (fence.Mark{Token: 5, Seq: 1}) || st.Setpoint != 22 || st.LastID != env.ID {
		t.Fatalf("state report %+v (%+v, %v)", rep, st, err)
	}

	at := fence.Mark{Token: 5, Seq: 1}
	forged := envelope(t, ForgedToken, 1, 99)
	wantVerdict(t, "unsigned 2^63", r.send(t, nil, forged), fence.Invalid, "", at)
	raw, err := r.sign.Sign(envelope(t, 6, 1, 99))
	if err != nil {
		t.Fatal(err)
	}
	raw[len(raw)-1] ^= 1
	r.publish(t, raw)
	wantVerdict(t, "a flipped bit", r.awaitAck(t, envelope(t, 6, 1, 99)), fence.Invalid, "signature", at)
	other, err := r.kit.Gateway("gw-x", "plc-*")
	if err != nil {
		t.Fatal(err)
	}
	otherCert, err := os.ReadFile(other.Certificate)
	if err != nil {
		t.Fatal(err)
	}
	r.update(t, otherCert)
	ok, err := auth.ReadKey(other.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	gx, err := auth.NewSigner([]byte(other.KeyID), ok)
	if err != nil {
		t.Fatal(err)
	}
	wantVerdict(t, "a gateway not certified for the device", r.send(t, gx, envelope(t, 7, 1, 99)), fence.Invalid, "authorised", at)
	dsigners, err := r.kit.DeviceSigners(signedDev)
	if err != nil {
		t.Fatal(err)
	}
	wantVerdict(t, "the device's own key", r.send(t, dsigners[signedDev], envelope(t, 8, 1, 99)), fence.Invalid, "", at)
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	checkSanitizerClean(t, logPath)

	p, logPath = r.start(t, 1) // the root alone: the certificate learned is in the store
	wantVerdict(t, "after a restart", r.send(t, r.sign, envelope(t, 5, 2, 23)), fence.Accepted, "", fence.Mark{Token: 5, Seq: 2})
	r.awaitState(t)
	old, err := r.kit.Revoke(1)
	if err != nil {
		t.Fatal(err)
	}
	revoked, err := r.kit.Revoke(2, r.gw.KeyID)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{revoked, old} { // the newer list, then the older one replayed
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		r.update(t, b)
	}
	at = fence.Mark{Token: 5, Seq: 2}
	wantVerdict(t, "revoked", r.send(t, r.sign, envelope(t, 5, 3, 24)), fence.Invalid, "unknown", at)
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	checkSanitizerClean(t, logPath)
	p, logPath = r.start(t, 2)
	wantVerdict(t, "revoked, after a restart", r.send(t, r.sign, envelope(t, 5, 3, 24)), fence.Invalid, "unknown", at)
	if err := p.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	checkSanitizerClean(t, logPath)
	b, err := os.ReadFile(logPath)
	if err != nil || !strings.Contains(string(b), "accepted=0") || !strings.Contains(string(b), "invalid=1") {
		t.Fatalf("the last run's counts: %v\n%s", err, b)
	}
}

// TestCDeviceTrustFlags: the trust flags go together, and a root, a
// certificate or a device key that does not check stops the start.
func TestCDeviceTrustFlags(t *testing.T) {
	r := newSignedRig(t)
	data := filepath.Join(r.dir, "data")
	base := []string{"--mqtt", r.url, "--devices", signedDev, "--dir", data}
	devKeys := filepath.Join(r.kit.Dir, "devices")
	bogus := filepath.Join(r.dir, "bogus")
	if err := os.WriteFile(bogus, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"root without kid", []string{"--trust-root", r.kit.RootPub()}, "go together"},
		{"device keys without root", []string{"--device-keys", devKeys}, "need them"},
		{"reset root without kid", []string{"--reset-root", r.kit.RootPub()}, "go together"},
		{"device keys with only a reset root", []string{"--reset-root", r.kit.RootPub(), "--trust-root-kid", "operator",
			"--device-keys", devKeys}, "need them"},
		{"reset root not a key", []string{"--reset-root", bogus, "--trust-root-kid", "operator"}, "--reset-root"},
		{"root not a key", []string{"--trust-root", bogus, "--trust-root-kid", "operator"}, "--trust-root"},
		{"epoch without root", []string{"--epoch", bogus}, "need them"},
		{"epoch not an epoch statement", []string{"--trust-root", r.kit.RootPub(), "--trust-root-kid", "operator",
			"--epoch", r.gw.Certificate}, "--epoch"},
		{"epoch not the root's", []string{"--trust-root", r.kit.RootPub(), "--trust-root-kid", "operator",
			"--epoch", bogus}, "--epoch"},
		{"certificate not the root's", []string{"--trust-root", r.gw.KeyFile[:len(r.gw.KeyFile)-4] + ".pub", "--trust-root-kid", "operator",
			"--certs", r.gw.Certificate}, "--certs"},
		{"device key of another device", []string{"--trust-root", r.kit.RootPub(), "--trust-root-kid", "operator",
			"--devices", "dev-other", "--device-keys", devKeys}, "--device-keys"},
	} {
		args := append(append([]string{}, base...), tt.args...)
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		out, err := exec.CommandContext(ctx, r.bin, args...).CombinedOutput()
		cancel()
		if err == nil || !strings.Contains(string(out), tt.want) {
			t.Errorf("%s: %v\n%s", tt.name, err, out)
		}
		if rep := SanitizerReport(out); rep != "" {
			t.Errorf("%s: sanitizer: %s", tt.name, rep)
		}
	}
}

// BenchmarkSignedRoundTrip is BenchmarkDeviceRoundTrip signed (invariant
// I7): one accepted set command at a time, signed by the gateway's key
// here, verified by the device against the certificate it got in a trust
// update, its ack signed by the device's key and verified here with
// auth.VerifyAck and BoundTo (and its signed state report read off the
// broker), for edgefence-devsim and efsdev given the same flags.
func BenchmarkSignedRoundTrip(b *testing.B) {
	for _, kind := range benchDevices(b) {
		b.Run(kind.name, func(b *testing.B) {
			r := newSignedRig(b)
			p, _ := r.startBin(b, 0, kind.bin)
			defer p.Stop(10 * time.Second)
			cert, err := os.ReadFile(r.gw.Certificate)
			if err != nil {
				b.Fatal(err)
			}
			r.update(b, cert)
			b.ResetTimer()
			for i := range b.N {
				if a := r.send(b, r.sign, envelope(b, 1, uint64(i+1), float64(i%100))); a.Verdict != fence.Accepted {
					b.Fatalf("%+v", a)
				}
				<-r.states
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "commands/s")
		})
	}
}

// wantEpoch is wantVerdict with the device's epoch the ack carries.
func wantEpoch(t *testing.T, what string, a *fence.Ack, v fence.Verdict, reason string, epoch uint64, mark fence.Mark) {
	t.Helper()
	wantVerdict(t, what, a, v, reason, mark)
	if a.Epoch != epoch {
		t.Fatalf("%s: %+v; want epoch %d", what, a, epoch)
	}
}

// replay publishes raw, a signed command captured earlier, again and
// returns the device's ack to it.
func (r *signedRig) replay(t *testing.T, raw []byte, env *fence.Envelope) *fence.Ack {
	t.Helper()
	r.publish(t, raw)
	return r.awaitAck(t, env)
}

// startCaptured starts efsdev (round 0), gives it gw-a's certificate in a
// trust update and sends env signed, accepted at epoch 0: the signed
// bytes, kept to replay later.
func (r *signedRig) startCaptured(t *testing.T, env *fence.Envelope) (p *Proc, logPath string, captured []byte) {
	t.Helper()
	p, logPath = r.start(t, 0)
	cert, err := os.ReadFile(r.gw.Certificate)
	if err != nil {
		t.Fatal(err)
	}
	r.update(t, cert)
	if captured, err = r.sign.Sign(env); err != nil {
		t.Fatal(err)
	}
	wantEpoch(t, "the command captured", r.replay(t, captured, env), fence.Accepted, "", 0,
		fence.Mark{Token: env.Token, Seq: env.Seq})
	r.awaitState(t)
	return p, logPath, captured
}

// TestCDeviceSignedReset: efsdev signed (--trust-root, --device-keys) takes
// the operator's reset through the library (efs_handle) with the root of
// its trust: the ack is signed by the device's key, passes auth.VerifyAck
// and is bound to the reset (its id, token and seq); the mark goes down to
// the reset's, in the reset's epoch. The reset closes the past: a signed
// command captured before it (token 9, above the new mark) and replayed
// from a broker client is refused stale, its epoch closed, the mark
// unchanged — also after a kill -9 (the reset's epoch is on flash); the
// next command of the reset's epoch above its mark is accepted; the same
// reset replayed, before and after a kill -9, is refused (its counter is on
// flash), and so is a reset signed by the gateway's key.
func TestCDeviceSignedReset(t *testing.T) {
	r := newSignedRig(t)
	before := envelope(t, 9, 1, 22)
	p, logPath, captured := r.startCaptured(t, before)
	reset := auth.Reset{Device: signedDev, Token: 3, Seq: 1, Counter: 1, ID: auth.NewResetID(), Epoch: 1}
	raw, err := r.kit.root.Reset(reset)
	if err != nil {
		t.Fatal(err)
	}
	asEnv := &fence.Envelope{Device: signedDev, ID: reset.ID, Token: reset.Token, Seq: reset.Seq}
	deliver := func(what string, v fence.Verdict, reason string, m fence.Mark) {
		t.Helper()
		r.publish(t, raw)
		wantEpoch(t, what, r.awaitAck(t, asEnv), v, reason, 1, m)
	}
	deliver("the reset", fence.Accepted, "fence reset to 3/1", fence.Mark{Token: 3, Seq: 1})
	closed := "epoch 0 closed: the fence point is at epoch 1"
	wantEpoch(t, "captured before the reset, replayed", r.replay(t, captured, before), fence.Stale, closed, 1,
		fence.Mark{Token: 3, Seq: 1})
	deliver("replayed", fence.Invalid, "replay", fence.Mark{Token: 3, Seq: 1})
	wantEpoch(t, "of epoch 0 above the reset", r.send(t, r.sign, envelope(t, 4, 1, 23)), fence.Stale, closed, 1,
		fence.Mark{Token: 3, Seq: 1})
	next := envelope(t, 4, 1, 23)
	next.Epoch = 1
	wantEpoch(t, "above the reset, in its epoch", r.send(t, r.sign, next), fence.Accepted, "", 1, fence.Mark{Token: 4, Seq: 1})
	r.awaitState(t)
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	checkSanitizerClean(t, logPath)
	p, logPath = r.start(t, 1)
	wantEpoch(t, "captured before the reset, replayed after a kill -9", r.replay(t, captured, before), fence.Stale, closed, 1,
		fence.Mark{Token: 4, Seq: 1})
	deliver("replayed after a kill -9", fence.Invalid, "replay", fence.Mark{Token: 4, Seq: 1})
	gk, err := auth.ReadKey(r.gw.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	notRoot, err := auth.NewRoot([]byte(r.gw.KeyID), gk)
	if err != nil {
		t.Fatal(err)
	}
	reset.Counter, reset.ID = 2, auth.NewResetID()
	if raw, err = notRoot.Reset(reset); err != nil {
		t.Fatal(err)
	}
	asEnv.ID = reset.ID
	deliver("signed by the gateway's key", fence.Invalid, "not the operator root", fence.Mark{Token: 4, Seq: 1})
	if err := p.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	checkSanitizerClean(t, logPath)
}

// TestCDeviceSignedEpoch: the fleet's epoch statement at efsdev (the
// root's, in a trust update; efsdev_trust, the library's port.epoch). A
// signed command accepted before it, replayed after it, is refused stale
// (its epoch closed) and the mark of the closed epoch counts as none; a
// command of a later epoch is invalid with the reason auth.NeedsTrust
// reads; one of the statement's epoch is accepted. An older statement
// replayed lowers nothing. After a kill -9 and a restart with the root
// alone the statement is in the store (kept before it counted); a newer
// one given with --epoch at start raises the epoch again.
func TestCDeviceSignedEpoch(t *testing.T) {
	r := newSignedRig(t)
	before := envelope(t, 5, 1, 21)
	p, logPath, captured := r.startCaptured(t, before)
	statement := func(n uint64) []byte {
		t.Helper()
		raw, err := r.kit.root.Epoch(n, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	at := func(epoch uint64, tok fence.Token, seq uint64) *fence.Envelope {
		env := envelope(t, tok, seq, 22)
		env.Epoch = epoch
		return env
	}
	r.update(t, statement(2))
	wantEpoch(t, "captured before the statement, replayed", r.replay(t, captured, before), fence.Stale,
		"epoch 0 closed: the fence point is at epoch 2", 2, fence.Mark{})
	a := r.send(t, r.sign, at(3, 1, 1))
	wantEpoch(t, "of an epoch not stated", a, fence.Invalid, "unknown epoch 3: the fence point is at epoch 2", 2, fence.Mark{})
	if !auth.NeedsTrust(a) {
		t.Fatalf("unknown epoch: auth.NeedsTrust false for %+v", a)
	}
	wantEpoch(t, "of the statement's epoch", r.send(t, r.sign, at(2, 1, 1)), fence.Accepted, "", 2, fence.Mark{Token: 1, Seq: 1})
	if rep := r.awaitState(t); rep.Epoch != 2 || rep.Token != 1 {
		t.Fatalf("the state report after it: epoch %d mark %v, want epoch 2 mark 1/1", rep.Epoch, rep.Mark())
	}
	r.update(t, statement(1))
	wantEpoch(t, "an older statement replayed", r.send(t, r.sign, at(1, 9, 1)), fence.Stale, "epoch 1 closed", 2,
		fence.Mark{Token: 1, Seq: 1})
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	checkSanitizerClean(t, logPath)

	p, logPath = r.start(t, 1) // the root alone: the statement is in the store
	wantEpoch(t, "after a kill -9, replayed", r.replay(t, captured, before), fence.Stale, "epoch 0 closed", 2,
		fence.Mark{Token: 1, Seq: 1})
	wantEpoch(t, "after a kill -9", r.send(t, r.sign, at(2, 1, 2)), fence.Accepted, "", 2, fence.Mark{Token: 1, Seq: 2})
	r.awaitState(t)
	if err := p.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	checkSanitizerClean(t, logPath)

	file := filepath.Join(r.dir, "epoch-3.cose")
	if err := os.WriteFile(file, statement(3), 0o600); err != nil {
		t.Fatal(err)
	}
	p, logPath = startDeviceProc(t, r.dir, 2, nil, r.bin, "--mqtt", r.url, "--devices", signedDev,
		"--dir", filepath.Join(r.dir, "data"), "--client-id", "efsdev-signed", "--trust-root", r.kit.RootPub(),
		"--trust-root-kid", r.kit.RootKID, "--epoch", file, "--device-keys", filepath.Join(r.kit.Dir, "devices"))
	wantEpoch(t, "--epoch 3", r.send(t, r.sign, at(2, 1, 3)), fence.Stale, "epoch 2 closed: the fence point is at epoch 3", 3,
		fence.Mark{})
	wantEpoch(t, "--epoch 3, of epoch 3", r.send(t, r.sign, at(3, 1, 1)), fence.Accepted, "", 3, fence.Mark{Token: 1, Seq: 1})
	if err := p.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	checkSanitizerClean(t, logPath)
}
