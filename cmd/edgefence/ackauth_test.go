package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/shadow"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// signedWorld is an operator root, a gateway key gw-1 certified for dev-1
// and dev-2, and both devices enrolled with `edgefence keys enrol` (their
// certificates published in etcd), the fleet signing with their keys.
type signedWorld struct {
	*env
	dir     string
	devices map[string]*auth.Signer // the devices' own keys (the forger stole some)
	fc      sim.FleetConfig         // to start the fleet again
}

// offline runs fn with the fleet stopped, then starts it again: what fn
// publishes reaches the agent before any device answers.
func (sw *signedWorld) offline(t *testing.T, fn func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := sw.fleet.Close(ctx); err != nil {
		t.Fatal(err)
	}
	fn()
	f, err := sim.NewFleet(ctx, sw.fc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close(context.Background()) })
	if err := f.AwaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	sw.fleet = f
}

func newSignedWorld(t *testing.T) *signedWorld {
	t.Helper()
	dir, p, ok := keysDir(t)
	ok("keys", "new", "--out", p("operator"))
	ok("keys", "new", "--out", p("gw-1"))
	ok("keys", "certify", "--root-key", p("operator"), "--pub", p("gw-1.pub"), "--kid", "gw-1/1", "--devices", "dev-1,dev-2", "--out", p("gw-1.cert"))
	sw := &signedWorld{dir: dir, devices: map[string]*auth.Signer{}}
	sw.env = newEnvFleet(t, func(w *sandbox.World, fc *sim.FleetConfig) {
		for _, dev := range []string{"dev-1", "dev-2"} {
			ok("keys", "enrol", dev, "--root-key", p("operator"), "--out", p("bundle"), "--etcd", w.Etcd.Endpoint())
			k, err := auth.ReadKey(p("bundle/" + dev + ".key"))
			if err != nil {
				t.Fatal(err)
			}
			if sw.devices[dev], err = auth.NewSigner([]byte(dev+"/1"), k); err != nil {
				t.Fatal(err)
			}
		}
		// The devices trust gw-1 to command them, and know their own
		// certificates (so that their own key is refused as a signer
		// of commands for its role, not as unknown).
		trust := loadTrust(t, p("bundle/trust-root.pub"), p("gw-1.cert"), p("bundle/dev-1.cert"))
		fc.Keys, fc.Signers = trust, sw.devices
		sw.fc = *fc
	}, "dev-1", "dev-2")
	return sw
}

func loadTrust(t *testing.T, root string, certs ...string) *auth.Trust {
	t.Helper()
	pub, err := auth.ReadPublic(root)
	if err != nil {
		t.Fatal(err)
	}
	trust, err := auth.NewTrust([]byte("operator"), pub, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range certs {
		raw, err := os.ReadFile(c)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := trust.AddCertificate(raw); err != nil {
			t.Fatal(err)
		}
	}
	return trust
}

// startAgent runs gw-1 signing its commands, requiring signed acks and
// state reports, with twins on.
func (sw *signedWorld) startAgent(t *testing.T) (sock string, st *agent.Status) {
	cfg, sock := sw.configEdit("gw-1", 10*time.Second, func(c *sandbox.AgentConfig) {
		c.Twins = true
		c.Auth = &sandbox.GatewayKey{KeyFile: filepath.Join(sw.dir, "gw-1.key"), KeyID: "gw-1/1", Certificate: filepath.Join(sw.dir, "gw-1.cert"),
			TrustRoot: filepath.Join(sw.dir, "bundle", "trust-root.pub"), TrustRootKID: "operator"}
	})
	p := sw.env.startAgent("gw-1", cfg)
	return sock, sw.waitHolding(p, sock)
}

// forger is a broker client with no right to speak for any device: it
// answers every command to dev-1 at once with forged acks, racing the
// device's own, and records the device's real state reports.
type forger struct {
	c *mqtt.Client

	mu      sync.Mutex
	forge   func(env *fence.Envelope) [][]byte // the forged acks for one command
	reports [][]byte                           // dev-1's signed state reports, as published
}

func newForger(t *testing.T, broker string) *forger {
	t.Helper()
	fg := &forger{}
	topics := mqtt.Topics{}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	c, err := mqtt.Dial(t.Context(), mqtt.Config{Brokers: []string{broker}, ClientID: "mallory", Subscriptions: []mqtt.Subscription{
		{Filter: topics.Cmd("dev-1"), Handler: func(m mqtt.Message) {
			env, err := auth.Claimed(m.Payload)
			if err != nil {
				return
			}
			fg.mu.Lock()
			forge, c := fg.forge, fg.c
			fg.mu.Unlock()
			if forge == nil {
				return
			}
			for _, raw := range forge(env) {
				// At once, from the handler: the race is on.
				_ = c.Publish(context.Background(), mqtt.Message{Topic: topics.Ack("dev-1"), Payload: raw, CorrelationData: []byte(env.ID)})
			}
		}},
		{Filter: topics.State("dev-1"), Handler: func(m mqtt.Message) {
			if len(m.Payload) > 1 && m.Payload[0] == 0xd2 {
				fg.mu.Lock()
				fg.reports = append(fg.reports, m.Payload)
				fg.mu.Unlock()
			}
		}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	fg.mu.Lock()
	fg.c = c
	fg.mu.Unlock()
	if err := c.AwaitConnection(ctx); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); !c.Subscribed(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("forger not subscribed")
		}
	}
	return fg
}

func (fg *forger) set(forge func(env *fence.Envelope) [][]byte) {
	fg.mu.Lock()
	defer fg.mu.Unlock()
	fg.forge = forge
}

// plainAck is a broker client's forgery: an unsigned ack of verdict v.
func plainAck(t *testing.T, env *fence.Envelope, v fence.Verdict) []byte {
	a := fence.NewAck(env, v, fence.Mark{Token: env.Token + 1<<40, Seq: 1}, "forged")
	raw, err := fence.MarshalAck(&a)
	if err != nil {
		t.Error(err)
	}
	return raw
}

// signedAck is an ack of verdict v signed by s, for env changed by edit.
func signedAck(t *testing.T, s *auth.Signer, env *fence.Envelope, v fence.Verdict, edit func(*fence.Ack)) []byte {
	a := fence.NewAck(env, v, fence.Mark{Token: env.Token, Seq: env.Seq}, "forged")
	edit(&a)
	raw, err := s.SignAck(&a)
	if err != nil {
		t.Error(err)
	}
	return raw
}

// Forged acks of every verdict race the device's own: unsigned, signed by
// another device's key, and signed by the device's own (stolen) key but
// for another (token, seq). None resolves the command; the device's does:
// `send` exits by the real verdict, the outbox records it, and a forged
// stale does not depose the holder. Forged state reports (unsigned, by
// another device's key, an old one replayed) never reach reported. And
// the device's key cannot sign a command.
func TestForgedAcksAndStateReports(t *testing.T) {
	sw := newSignedWorld(t)
	fg := newForger(t, sw.world.Broker.URL())
	sock, st := sw.startAgent(t)
	token := st.Devices[0].Token
	send := func(setpoint string) (agent.SendResult, result) {
		t.Helper()
		r := edgefence(t, "send", "--json", "--socket", sock, "dev-1", "set", `{"setpoint":`+setpoint+`}`)
		return sendResult(t, r), r
	}
	otherDevice, stolen := sw.devices["dev-2"], sw.devices["dev-1"]
	offBy := func(a *fence.Ack) { a.Seq++ }
	same := func(*fence.Ack) {}
	forAll := func(verdicts ...fence.Verdict) func(env *fence.Envelope) [][]byte {
		return func(env *fence.Envelope) (out [][]byte) {
			for _, v := range verdicts {
				out = append(out, plainAck(t, env, v), signedAck(t, otherDevice, env, v, same), signedAck(t, stolen, env, v, offBy))
			}
			return out
		}
	}

	refused := func() map[string]uint64 {
		st, _ := status(t, sock)
		return st.DeviceAuth.AcksRefused
	}
	// race sends a command while the device is offline and the forger
	// answers it with a forgery of each verdict, unsigned, by another
	// device's key and by the device's stolen key for another seq; once
	// the agent has refused them all, the device comes back and answers.
	race := func(setpoint string, verdicts ...fence.Verdict) (agent.SendResult, result) {
		t.Helper()
		before := refused()
		fg.set(forAll(verdicts...))
		done := make(chan result, 1)
		sw.offline(t, func() {
			go func() {
				done <- edgefence(t, "send", "--json", "--socket", sock, "dev-1", "set", `{"setpoint":`+setpoint+`}`)
			}()
			waitFor(t, "the forgeries refused", func() bool {
				n := refused()
				for _, why := range []string{"unsigned", "not_bound"} {
					if n[why] < before[why]+uint64(len(verdicts)) {
						return false
					}
				}
				// Another device's key: unknown until the agent reads
				// that device's certificate (it reads them ahead at
				// start), not authorised for dev-1 once it has.
				return n["unknown_key"]+n["not_authorised"] >= before["unknown_key"]+before["not_authorised"]+uint64(len(verdicts))
			})
			fg.set(nil)
		})
		r := <-done
		return sendResult(t, r), r
	}

	// The device accepts; forged stale, duplicate and invalid came first.
	res, r := race("22", fence.Stale, fence.Duplicate, fence.Invalid)
	if r.code != 0 || res.Verdict != "accepted" {
		t.Fatalf("accepted command after forgeries: %s", r)
	}
	if r := edgefence(t, "outbox", "show", "--socket", sock, "--json", res.ID); r.code != 0 || !strings.Contains(r.stdout, `"accepted"`) {
		t.Fatalf("outbox: %s", r)
	}
	st, _ = status(t, sock)
	if d := st.Devices[0]; d.State != agent.StateHolding || d.Token != token {
		t.Fatalf("after a forged stale: %+v, want holding token %d", d, token)
	}

	// The device refuses (setpoint out of range); a forged accepted came first.
	res, r = race("1000", fence.Accepted)
	if r.code != exitVerdict || res.Verdict != "invalid" {
		t.Fatalf("refused command after a forged accepted: %s", r)
	}
	if s, err := sw.fleet.State("dev-1"); err != nil || s.Setpoint != 22 {
		t.Fatalf("device state %+v %v", s, err)
	}

	// State reports: the device's signed ones reach reported; forgeries,
	// and the device's own old report replayed, never do.
	if res, r := send("23"); res.Verdict != "accepted" {
		t.Fatalf("%s", r)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	app := shadow.NewStore(sw.etcd, shadow.StoreConfig{Prefix: agent.DefaultEtcdPrefix, Writer: "app"})
	reported := func() any {
		rep, err := app.GetReported(ctx, "dev-1")
		if err != nil {
			return nil
		}
		return rep.Fields["setpoint"]
	}
	waitFor(t, "the device's report of setpoint 23 in reported", func() bool { return reported() == float64(23) })
	fg.mu.Lock()
	old := fg.reports[0] // setpoint 22
	fg.mu.Unlock()
	stolenReport, err := otherDevice.SignState(&auth.StateReport{Device: "dev-1", Token: 1 << 62, Seq: 1, Counter: 1 << 62,
		State: []byte{0xa1, 0x68, 's', 'e', 't', 'p', 'o', 'i', 'n', 't', 0x05}})
	if err != nil {
		t.Fatal(err)
	}
	for _, raw := range [][]byte{{0xa1, 0x68, 's', 'e', 't', 'p', 'o', 'i', 'n', 't', 0x06}, stolenReport, old} {
		if err := fg.c.Publish(ctx, mqtt.Message{Topic: mqtt.Topics{}.State("dev-1"), Payload: raw}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the forged reports refused", func() bool {
		st, _ := status(t, sock)
		n := st.DeviceAuth.StatesRefused
		return n["unsigned"] >= 1 && n["unknown_key"]+n["not_authorised"] >= 1 && n["replayed"] >= 1
	})
	if got := reported(); got != float64(23) {
		t.Fatalf("reported setpoint %v after forged reports, want 23", got)
	}

	// The device's own key cannot command it: refused by the device's
	// fence point, the mark unchanged.
	before, err := sw.fleet.Mark("dev-1")
	if err != nil {
		t.Fatal(err)
	}
	unauth := sw.fleet.Stats().Unauthenticated
	cmd, err := stolen.Sign(&fence.Envelope{V: fence.Version, Device: "dev-1", Token: 1 << 63, Seq: 1, ID: "by-device-key", Kind: "set",
		Body: []byte{0xa1, 0x68, 's', 'e', 't', 'p', 'o', 'i', 'n', 't', 0x18, 99}, Holder: "mallory"})
	if err != nil {
		t.Fatal(err)
	}
	if err := fg.c.Publish(ctx, mqtt.Message{Topic: mqtt.Topics{}.Cmd("dev-1"), Payload: cmd}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the device-key command refused", func() bool { return sw.fleet.Stats().Unauthenticated > unauth })
	if m, err := sw.fleet.Mark("dev-1"); err != nil || m != before {
		t.Fatalf("mark %v after a command signed by the device key, want %v (%v)", m, before, err)
	}
	if res, r := send("24"); res.Verdict != "accepted" {
		t.Fatalf("the holder afterwards: %s", r)
	}
}

// waitFor polls cond with a generous deadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}
