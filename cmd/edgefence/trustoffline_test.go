package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/fence/auth/authtest"
	"github.com/edgefence/edgefence/internal/sandbox"
)

// signedSite is an operator's trust chain on disk for tests of the real
// agent: the root, device keys enrolled in etcd, and gateways certified
// for "dev-*".
type signedSite struct {
	t    *testing.T
	dir  string
	op   *authtest.Operator
	root string // the root key pair's path prefix
}

func newSignedSite(t *testing.T) *signedSite {
	t.Helper()
	s := &signedSite{t: t, dir: t.TempDir(), op: authtest.NewOperator(t)}
	s.root = filepath.Join(s.dir, "operator")
	if err := auth.WriteKeyPair(s.root, s.op.Key); err != nil {
		t.Fatal(err)
	}
	return s
}

// enrol enrols dev's own key with `edgefence keys enrol`, publishing its
// certificate to etcd at etcdURL, and returns its signer.
func (s *signedSite) enrol(dev, etcdURL string) *auth.Signer {
	s.t.Helper()
	bundle := filepath.Join(s.dir, "bundle")
	if r := edgefence(s.t, "keys", "enrol", dev, "--root-key", s.root, "--root-kid", authtest.RootKID, "--out", bundle,
		"--etcd", etcdURL); r.code != 0 {
		s.t.Fatal(r)
	}
	k, err := auth.ReadKey(filepath.Join(bundle, dev+".key"))
	if err != nil {
		s.t.Fatal(err)
	}
	sg, err := auth.NewSigner([]byte(dev+"/1"), k)
	if err != nil {
		s.t.Fatal(err)
	}
	return sg
}

// gateway certifies a key for gateway name and writes its agent config
// in e, signed: its devices are `auth: required`.
func (s *signedSite) gateway(e *env, name string, leaseTTL time.Duration) (cfg, sock string) {
	s.t.Helper()
	gw := s.op.Certify(name, "dev-*")
	if err := auth.WriteKeyPair(filepath.Join(s.dir, name), gw.Key); err != nil {
		s.t.Fatal(err)
	}
	cert := filepath.Join(s.dir, name+".cert")
	if err := os.WriteFile(cert, gw.Cert, 0o600); err != nil {
		s.t.Fatal(err)
	}
	return e.configEdit(name, leaseTTL, func(c *sandbox.AgentConfig) {
		c.Auth = &sandbox.GatewayKey{KeyFile: filepath.Join(s.dir, name+".key"), KeyID: name, Certificate: cert,
			TrustRoot: s.root + ".pub", TrustRootKID: authtest.RootKID}
	})
}

// outboxStates returns `edgefence outbox list --state all`'s entries by
// command id: their state names.
func outboxStates(t *testing.T, socket string) map[string]string {
	t.Helper()
	r := edgefence(t, "outbox", "list", "--state", "all", "--json", "--socket", socket)
	if r.code != 0 {
		t.Fatal(r)
	}
	var list agent.OutboxList
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil {
		t.Fatalf("outbox list: %v\n%s", err, r)
	}
	out := make(map[string]string, len(list.Records))
	for _, rec := range list.Records {
		out[rec.ID] = rec.StateString()
	}
	return out
}

// TestTrustDeviceOfflineAtAcquisition: devices provisioned with the
// operator's root only, and offline — never connected, so the broker
// keeps no session for them — when the real agent acquires them and
// publishes its trust update. Commands queue meanwhile; the agent is
// killed (-9) and restarted inside its lease TTL, with the devices still
// offline. When the devices come up, every queued command must end
// accepted: the device gets the gateway's certificate (the retained trust
// update on its command topic, or the update the agent publishes again
// when the device refuses its signer as unknown) and takes the same
// envelope. Before, the certificate went out once, at acquisition, and
// every command ended invalid ("unknown signer key: no certificate").
func TestTrustDeviceOfflineAtAcquisition(t *testing.T) {
	site := newSignedSite(t)
	devs := []string{"dev-1", "dev-2"}
	// The world's fleet serves another device; dev-1 and dev-2 start later.
	e := newEnvFleet(t, func(*sandbox.World, *sim.FleetConfig) {}, "dev-boot")
	e.devices = devs
	signers := map[string]*auth.Signer{}
	for _, d := range devs {
		signers[d] = site.enrol(d, e.world.Etcd.Endpoint())
	}
	cfg, sock := site.gateway(e, "gw-1", 10*time.Second)
	p := e.startAgent("gw-1", cfg)
	e.waitHolding(p, sock)

	queued := map[string]bool{}
	enqueue := func(n int) {
		t.Helper()
		for _, d := range devs {
			for i := range n {
				r := edgefence(t, "send", "--json", "--no-wait", "--socket", sock, d, "set", `{"setpoint":`+strconv.Itoa(20+i)+`}`)
				res := sendResult(t, r)
				if res.ID == "" {
					t.Fatalf("send --no-wait: %s", r)
				}
				queued[res.ID] = true
			}
		}
	}
	enqueue(3)
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	<-p.Done()
	p = e.startAgent("gw-1b", cfg)
	e.waitHolding(p, sock)
	enqueue(2)

	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	fleet, err := sim.NewFleet(ctx, sim.FleetConfig{Devices: devs, DataDir: filepath.Join(e.dir, "late"), Broker: e.world.Broker.URL(),
		ClientID: "late-" + t.Name(), Keys: site.op.Trust(), Signers: signers})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fleet.Close(context.Background()) })
	if err := fleet.AwaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	var states map[string]string
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		states = outboxStates(t, sock)
		ended := 0
		for id := range queued {
			if s := states[id]; s != "" && s != "pending" {
				ended++
			}
		}
		if ended == len(queued) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d queued commands ended within 60 s: %v", ended, len(queued), states)
		}
	}
	for id := range queued {
		if states[id] != fence.Accepted.String() {
			t.Errorf("queued command %s ended %s, want accepted", id, states[id])
		}
	}
	for _, d := range devs {
		if res := sendResult(t, edgefence(t, "send", "--json", "--socket", sock, d, "set", `{"setpoint":30}`)); res.Verdict != "accepted" {
			t.Errorf("%s after the queue: %+v", d, res)
		}
	}
}
