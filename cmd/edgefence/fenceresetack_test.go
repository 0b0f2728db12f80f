package main

import (
	"errors"
	"io"
	"math"
	"testing"
	"time"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/fence/auth/authtest"
)

// How `fence reset --config` reads a reset's ack, by what the config says
// of the device: an `auth: required` device's only if its enrolled key
// (from etcd) signed it, a `fence: gateway` device's only if a gateway key
// certified for it (etcd's <prefix>/trust/certs/) did, an `auth: off`
// device's plainly; and only an ack that answers this very reset.
func TestFenceResetAckCheck(t *testing.T) {
	etcd, cli := startEtcd(t, t.TempDir())
	op := authtest.NewOperator(t)
	prefix := agent.DefaultEtcdPrefix
	devKey, _ := auth.NewKey()
	devCert, err := op.Root.CertifyDevice([]byte("dev-1/1"), &devKey.PublicKey, "dev-1", time.Now().Add(-time.Hour), time.Now().Add(time.Hour), 1)
	if err != nil {
		t.Fatal(err)
	}
	devSigner, _ := auth.NewSigner([]byte("dev-1/1"), devKey)
	gw := op.Certify("gw-1/1", "plc-*", "dev-*")
	for k, v := range map[string][]byte{agent.TrustDeviceKey(prefix, "dev-1"): devCert, agent.TrustCertKey(prefix, "gw-1/1"): gw.Cert} {
		if _, err := cli.Put(t.Context(), k, string(v)); err != nil {
			t.Fatal(err)
		}
	}
	cfg := &agent.Config{Etcd: agent.EtcdConfig{Endpoints: etcd.Endpoints(), Prefix: prefix, DialTimeout: 5 * time.Second},
		Auth: agent.AuthConfig{KeyFile: "/gw.key"},
		Devices: []agent.DeviceConfig{{ID: "dev-1", Auth: agent.AuthRequired}, {ID: "dev-2", Auth: agent.AuthRequired},
			{ID: "plc-1", Fence: agent.FenceGateway, Home: "gw-1", Auth: agent.AuthRequired}, {ID: "off-1", Auth: agent.AuthOff}}}
	f := &resetFlags{deliverCfg: cfg, trust: op.Trust(), timeout: 10 * time.Second, stderr: io.Discard}
	defer func() { f.cli.Close() }()

	reset := func(dev string) *auth.Reset {
		return &auth.Reset{Device: dev, Token: 3, Seq: math.MaxUint64, Counter: 1, ID: "reset:" + dev, Epoch: 5}
	}
	ack := func(r *auth.Reset, edit func(*fence.Ack)) *fence.Ack {
		a := auth.ResetAck(r.Device, r, r.State(), nil)
		if edit != nil {
			edit(&a)
		}
		return &a
	}
	signed := func(s *auth.Signer, a *fence.Ack) []byte {
		raw, err := s.SignAck(a)
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	plain := func(a *fence.Ack) []byte {
		raw, err := fence.MarshalAck(a)
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	other := func(a *fence.Ack) { a.ID = "reset:another" }
	for _, tc := range []struct {
		name string
		dev  string
		raw  func(r *auth.Reset) []byte
		want error // nil: taken
	}{
		{"required, its key", "dev-1", func(r *auth.Reset) []byte { return signed(devSigner, ack(r, nil)) }, nil},
		{"required, plain", "dev-1", func(r *auth.Reset) []byte { return plain(ack(r, nil)) }, auth.ErrUnsigned},
		{"required, a gateway's key", "dev-1", func(r *auth.Reset) []byte { return signed(gw.Signer, ack(r, nil)) }, fence.ErrInvalid}, // unknown, or of the wrong role
		{"required, another reset's", "dev-1", func(r *auth.Reset) []byte { return signed(devSigner, ack(r, other)) }, auth.ErrNotBound},
		{"gateway, its home's key", "plc-1", func(r *auth.Reset) []byte { return signed(gw.Signer, ack(r, nil)) }, nil},
		{"gateway, plain", "plc-1", func(r *auth.Reset) []byte { return plain(ack(r, nil)) }, auth.ErrUnsigned},
		{"off, plain", "off-1", func(r *auth.Reset) []byte { return plain(ack(r, nil)) }, nil},
	} {
		r := reset(tc.dev)
		check, err := f.ackCheck(r)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		a, err := check(tc.raw(r))
		if tc.want == nil && (err != nil || a.ID != r.ID) || tc.want != nil && !errors.Is(err, tc.want) {
			t.Errorf("%s: %+v %v, want %v", tc.name, a, err, tc.want)
		}
	}
	// A required device etcd has no certificate for: said before sending.
	if _, err := f.ackCheck(reset("dev-2")); err == nil {
		t.Fatal("dev-2 has no certificate: no error")
	}
	noRoot := &resetFlags{deliverCfg: cfg, timeout: time.Second, stderr: io.Discard}
	if _, err := noRoot.ackCheck(reset("dev-1")); err == nil {
		t.Fatal("no trust root: no error")
	}
}
