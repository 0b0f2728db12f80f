package agent

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgefence/edgefence/devices/shim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/fence/auth/authtest"
	"github.com/edgefence/edgefence/offline"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// signedShim is a Sender and TrustPublisher in front of a real device shim
// provisioned with the operator's root only: commands go signed by gw,
// trust updates reach the shim unless the device is "offline" for them
// (drop: that many updates are lost before one arrives).
type signedShim struct {
	gw   *auth.Signer
	shim *shim.Shim
	// dev, if set, signs the device's acks, and check (the agent's,
	// CheckAcksWith) must pass each before it resolves the command, as
	// the MQTT transport does: a refused ack is dropped.
	dev   *auth.Signer
	check mqtt.AckCheck

	// hold, if set, is called with each envelope after the device
	// answered it and before the ack is returned (an ack in flight).
	hold func(env *fence.Envelope)

	mu        sync.Mutex
	drop      int // trust updates still to lose
	published int
	sent      [][]byte // the signed envelopes, in order
}

type acceptAll struct{}

func (acceptAll) Check(*fence.Envelope) error { return nil }
func (acceptAll) Apply(*fence.Envelope) error { return nil }

func (s *signedShim) Send(ctx context.Context, env *fence.Envelope) (*fence.Ack, error) {
	raw, err := s.gw.Sign(env)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.sent = append(s.sent, raw)
	s.mu.Unlock()
	ack := s.shim.Handle(env.Device, raw, acceptAll{})
	if s.hold != nil {
		s.hold(env)
	}
	if s.check == nil || s.dev == nil {
		return &ack, nil
	}
	signed, err := s.dev.SignAck(&ack)
	if err != nil {
		return nil, err
	}
	a, err := s.check(env, signed)
	if err != nil {
		<-ctx.Done() // dropped: no ack comes
		return nil, ctx.Err()
	}
	return a, nil
}

func (s *signedShim) CheckAcksWith(check mqtt.AckCheck) { s.check = check }

func (s *signedShim) PublishTrust(_ context.Context, dev string, update []byte) error {
	s.mu.Lock()
	s.published++
	lost := s.drop > 0
	if lost {
		s.drop--
	}
	s.mu.Unlock()
	if !lost {
		if res := s.shim.Process(dev, update, acceptAll{}); res.Update == nil {
			return errors.New("not taken as a trust update")
		}
	}
	return nil
}

func (s *signedShim) publishes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.published
}

// TestTrustRetry: a device that never got the gateway's trust update (it
// was offline when the update went out) refuses the first command invalid
// for want of the gateway's certificate; the agent publishes the update
// again and resends the same envelope, which is accepted — one command, one
// verdict. A device the updates never reach refuses the command for good
// after trustRetries more updates, and that refusal is its verdict.
func TestTrustRetry(t *testing.T) {
	op := authtest.NewOperator(t)
	gw := op.Certify("gw-1", "d*")
	for _, c := range []struct {
		name    string
		drop    int
		verdict fence.Verdict
		pubs    int
	}{
		{"update lost once", 1, fence.Accepted, 2},
		{"never reaches the device", 100, fence.Invalid, 1 + trustRetries},
	} {
		t.Run(c.name, func(t *testing.T) {
			sh, err := shim.Open(filepath.Join(t.TempDir(), "dev.db"), &shim.Options{Keys: op.Trust()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { sh.Close() })
			fp := &signedShim{gw: gw.Signer, shim: sh, drop: c.drop}
			cfg := &Config{Gateway: "gw-1", Etcd: EtcdConfig{Endpoints: testEtcd.Endpoints(), Prefix: "/t/" + t.Name(), LeaseTTL: 2 * time.Second},
				MQTT: MQTTConfig{Brokers: []string{"mqtt://127.0.0.1:1"}}, Command: CommandConfig{Timeout: 10 * time.Second},
				Auth: AuthConfig{KeyFile: "k", KeyID: "gw-1"}, Devices: []DeviceConfig{{ID: "d1", Auth: AuthRequired}}}
			a := runAgent(t, cfg, etcdClient(t), fp, Options{TrustUpdates: &TrustUpdates{Certificate: gw.Cert, Publisher: fp}})
			waitFor(t, "holding d1", holdingAll(a, []string{"d1"}))
			ack, _ := a.Send(t.Context(), "d1", "set", nil)
			if ack == nil || ack.Verdict != c.verdict {
				t.Fatalf("ack %+v, want %v", ack, c.verdict)
			}
			if n := fp.publishes(); n != c.pubs {
				t.Errorf("%d trust updates published, want %d", n, c.pubs)
			}
			if n := a.delivery.stats.trustRetried.Load(); n != uint64(c.pubs-1) {
				t.Errorf("trustRetried %d, want %d", n, c.pubs-1)
			}
			recs, err := a.outbox.List(offline.Filter{Device: "d1"})
			if err != nil || len(recs) != 1 || recs[0].State != c.verdict {
				t.Fatalf("outbox %+v (%v): want one entry, %v", recs, err, c.verdict)
			}
			// A device that refuses this gateway's signer for good is
			// let go (untrusted), to be campaigned for again later.
			want := uint64(0)
			if c.verdict == fence.Invalid {
				want = 1
			}
			waitFor(t, "the releases counted", func() bool {
				return a.leases.stats.untrusted[untrustIndex(untrustSigner)].Load() == want
			})
		})
	}
}

// siteAuth writes the operator's root and gw's key and certificate (kid)
// and returns the auth section naming them.
func siteAuth(t *testing.T, op *authtest.Operator, gw *authtest.Gateway, kid string) AuthConfig {
	t.Helper()
	dir := t.TempDir()
	if err := auth.WriteKeyPair(filepath.Join(dir, "root"), op.Key); err != nil {
		t.Fatal(err)
	}
	if err := auth.WriteKeyPair(filepath.Join(dir, "gw"), gw.Key); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "gw.cert"), gw.Cert, 0o600); err != nil {
		t.Fatal(err)
	}
	return AuthConfig{KeyFile: filepath.Join(dir, "gw.key"), KeyID: kid, Certificate: filepath.Join(dir, "gw.cert"),
		TrustRoot: filepath.Join(dir, "root.pub"), TrustRootKID: authtest.RootKID}
}

// TestUntrustedAcks: a device whose acks no certificate the agent can find
// vouches for (its key never enrolled): every ack is dropped, the command
// has no verdict, and after unverifiedLimit attempts the agent lets the
// lock go (acks_unverified, state untrusted) instead of holding the device
// for good; the command stays queued, never ended by an ack it could not
// verify.
func TestUntrustedAcks(t *testing.T) {
	op := authtest.NewOperator(t)
	gw := op.Certify("gw-1", "d*")
	dk, err := auth.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	dev, err := auth.NewSigner([]byte("d1/1"), dk)
	if err != nil {
		t.Fatal(err)
	}
	sh, err := shim.Open(filepath.Join(t.TempDir(), "dev.db"), &shim.Options{Keys: op.Trust()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sh.Close() })
	fp := &signedShim{gw: gw.Signer, shim: sh, dev: dev}
	cfg := &Config{Gateway: "gw-1", Etcd: EtcdConfig{Endpoints: testEtcd.Endpoints(), Prefix: "/t/" + t.Name(), LeaseTTL: 2 * time.Second},
		MQTT: MQTTConfig{Brokers: []string{"mqtt://127.0.0.1:1"}}, Command: CommandConfig{Timeout: time.Second},
		Auth: siteAuth(t, op, gw, "gw-1"), Devices: []DeviceConfig{{ID: "d1", Auth: AuthRequired}}}
	logs := &logBuffer{}
	a := runAgent(t, cfg, etcdClient(t), fp, Options{Logger: slog.New(slog.NewJSONHandler(logs, nil)),
		TrustUpdates: &TrustUpdates{Certificate: gw.Cert, Publisher: fp}})
	waitFor(t, "holding d1", holdingAll(a, []string{"d1"}))
	if _, err := a.Enqueue(t.Context(), "d1", "set", nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "d1 left for its unverifiable acks", func() bool {
		return a.leases.stats.untrusted[untrustIndex(untrustAcks)].Load() >= 1
	})
	released := false
	for _, l := range logs.lines(t) {
		if l["msg"] == "lease released: this gateway cannot command the device with trust" && l["reason"] == untrustAcks {
			released = true
		}
	}
	if !released {
		t.Fatal("no log line for the release")
	}
	if n, _ := a.outbox.Pending("d1"); n != 1 {
		t.Fatalf("%d pending, want the command still queued", n)
	}
}

// TestUntrustedOwnCertificate: a gateway whose own certificate has expired
// does not campaign for its `auth: required` devices (state untrusted,
// the reason naming the fix), and keeps its `auth: off` ones.
func TestUntrustedOwnCertificate(t *testing.T) {
	op := authtest.NewOperator(t)
	gw := op.Certify("gw-1", "d*")
	cfg := &Config{Gateway: "gw-1", Etcd: EtcdConfig{Endpoints: testEtcd.Endpoints(), Prefix: "/t/" + t.Name(), LeaseTTL: 2 * time.Second},
		MQTT: MQTTConfig{Brokers: []string{"mqtt://127.0.0.1:1"}}, Command: CommandConfig{Timeout: time.Second},
		Auth: siteAuth(t, op, gw, "gw-1"), Devices: []DeviceConfig{{ID: "d1", Auth: AuthRequired}, {ID: "d2", Auth: AuthOff}}}
	later := func() time.Time { return time.Now().Add(48 * time.Hour) } // past the certificate's NotAfter
	a := runAgent(t, cfg, etcdClient(t), newFencePoint(), Options{Now: later})
	waitFor(t, "holding d2", holdingAll(a, []string{"d2"}))
	waitFor(t, "d1 untrusted", func() bool {
		st := a.Status()
		return st.Devices[0].State == StateUntrusted && strings.Contains(st.Devices[0].Reason, "keys certify") &&
			st.Trust != nil && !st.Trust.CertificateOK
	})
	if a.leases.stats.untrusted[untrustIndex(untrustOwnCert)].Load() != 1 {
		t.Fatal("own_certificate not counted once")
	}
}

// TestRevokedGatewayEndsItsQueue: a gateway that learns its own key is
// revoked lets the device go and will not campaign for it again, so it
// never sees another holder supersede what it queued: its queued commands
// must end anyway — the one never sent stale (superseded), the one in
// flight with the device's verdict — not wait forever (I4).
func TestRevokedGatewayEndsItsQueue(t *testing.T) {
	op := authtest.NewOperator(t)
	gw := op.Certify("gw-1", "d*")
	fp := newFencePoint()
	ids, gate := gatedDevices(fp, 1)
	prefix := "/t/" + t.Name()
	cfg := &Config{Gateway: "gw-1", Etcd: EtcdConfig{Endpoints: testEtcd.Endpoints(), Prefix: prefix, LeaseTTL: 2 * time.Second},
		MQTT: MQTTConfig{Brokers: []string{"mqtt://127.0.0.1:1"}}, Command: CommandConfig{Timeout: time.Minute},
		Auth: siteAuth(t, op, gw, "gw-1"), Devices: []DeviceConfig{{ID: ids[0], Auth: AuthRequired}}}
	a := runAgent(t, cfg, etcdClient(t), fp, Options{})
	waitFor(t, "holding", holdingAll(a, ids))
	var queued []string
	for range 2 {
		env, err := a.Enqueue(t.Context(), ids[0], "set", nil)
		if err != nil {
			t.Fatal(err)
		}
		queued = append(queued, env.ID)
	}
	if _, err := a.cli.Put(t.Context(), TrustRevocationsKey(prefix), string(op.Revoke(1, "gw-1"))); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the device left", func() bool { return a.Status().Devices[0].State == StateUntrusted })
	close(gate)
	waitFor(t, "both commands ended", pendingZero(a.outbox))
	second, err := a.outbox.Get(queued[1])
	if err != nil || second.State != fence.Stale || !strings.Contains(second.Ack.Reason, "may not command") {
		t.Fatalf("the command never sent: %+v %v", second, err)
	}
}
