package agent

import (
	"context"
	"crypto/ecdsa"
	"errors"
	"log/slog"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
)

// A required device without a certificate in etcd: its signed ack cannot
// be verified, which the log (ERROR, once) and the status say; once the
// operator publishes the certificate, the next ack is read from etcd on the
// miss and verified. A gateway-fenced device's ack is its home gateway's.
func TestDeviceAuthCertificateFromEtcd(t *testing.T) {
	dir := t.TempDir()
	rk, err := auth.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	if err := auth.WriteKeyPair(filepath.Join(dir, "root"), rk); err != nil {
		t.Fatal(err)
	}
	root, err := auth.NewRoot([]byte("operator"), rk)
	if err != nil {
		t.Fatal(err)
	}
	dk, dev := testSigner(t, "d1/1")
	gk, gw := testSigner(t, "gw/1")

	prefix := "/t/" + t.Name()
	cfg := &Config{Gateway: "gw", Etcd: EtcdConfig{Prefix: prefix}, Auth: AuthConfig{KeyFile: "k", KeyID: "gw/1",
		TrustRoot: filepath.Join(dir, "root.pub"), TrustRootKID: "operator"},
		Devices: []DeviceConfig{{ID: "d1"}, {ID: "plc", Fence: FenceGateway, Home: "gw"}}}
	cfg.ApplyDefaults()
	logs := &logBuffer{}
	cli := etcdClient(t)
	now := time.Now()
	clock := func() time.Time { return now }
	log := slog.New(slog.NewJSONHandler(logs, nil))
	keep, err := newKeeper(cfg, nil, log, clock)
	if err != nil {
		t.Fatal(err)
	}
	k := newDeviceAuth(cfg, keep, cli, log, clock)
	env := &fence.Envelope{V: fence.Version, Device: "d1", Token: 5, Seq: 1, ID: "c1", Kind: "set"}
	a := fence.NewAck(env, fence.Accepted, fence.Mark{Token: 5, Seq: 1}, "")
	raw, err := dev.SignAck(&a)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.checkAck(env, raw); !errors.Is(err, auth.ErrUnknownKey) {
		t.Fatalf("no certificate anywhere: %v", err)
	}
	if s := k.status(); !slices.Equal(s.WithoutCertificate, []string{"d1"}) || s.AcksRefused["unknown_key"] != 1 {
		t.Fatalf("status %+v", s)
	}
	var errLines int
	for _, l := range logs.lines(t) {
		if l["level"] == "ERROR" && l["device"] == "d1" {
			errLines++
		}
	}
	if errLines != 1 {
		t.Fatalf("%d ERROR lines about d1, want 1", errLines)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	cert, err := root.CertifyDevice([]byte("d1/1"), &dk.PublicKey, "d1", now.Add(-time.Hour), now.Add(time.Hour), 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, prefix+"/trust/devices/d1", string(cert)); err != nil {
		t.Fatal(err)
	}
	if _, err := k.checkAck(env, raw); !errors.Is(err, auth.ErrUnknownKey) {
		t.Fatalf("re-read within rereadEvery: %v", err) // bounded: forged kids cannot flood etcd
	}
	now = now.Add(rereadEvery)
	if got, err := k.checkAck(env, raw); err != nil || got.Verdict != fence.Accepted {
		t.Fatalf("after enrolment: %+v %v", got, err)
	}
	if s := k.status(); len(s.WithoutCertificate) != 0 {
		t.Fatalf("status after enrolment %+v", s)
	}

	// plc is behind its home gateway's table: the gateway's certified key
	// answers for it; the device key of d1 does not.
	gcert, err := root.Certify([]byte("gw/1"), &gk.PublicKey, []string{"plc"}, now.Add(-time.Hour), now.Add(time.Hour), 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, prefix+"/trust/certs/gw/1", string(gcert)); err != nil {
		t.Fatal(err)
	}
	penv := &fence.Envelope{V: fence.Version, Device: "plc", Token: 5, Seq: 1, ID: "c2", Kind: "set"}
	pa := fence.NewAck(penv, fence.Stale, fence.Mark{Token: 9, Seq: 1}, "")
	byGateway, _ := gw.SignAck(&pa)
	byDevice, _ := dev.SignAck(&pa)
	if _, err := k.checkAck(penv, byDevice); err == nil {
		t.Fatal("a device key answered for a gateway-fenced device")
	}
	if got, err := k.checkAck(penv, byGateway); err != nil || got.Verdict != fence.Stale {
		t.Fatalf("the home gateway's ack: %+v %v", got, err)
	}

	// The ack of an operator's fence reset answers no command: only d1's
	// own key may say that d1's mark went down. A plain one, another
	// device's, or one naming another reset is dropped.
	renv := &fence.Envelope{V: fence.Version, Device: "d1", ID: "reset:0123456789abcdef"}
	ra := fence.NewAck(renv, fence.Accepted, fence.Mark{Token: 3, Seq: 1}, "")
	plain, _ := fence.MarshalAck(&ra)
	signed, _ := dev.SignAck(&ra)
	byOther, _ := gw.SignAck(&ra)
	if _, err := k.checkReset("d1", renv.ID, plain); !errors.Is(err, auth.ErrUnsigned) {
		t.Fatalf("plain reset ack: %v", err)
	}
	if _, err := k.checkReset("d1", renv.ID, byOther); err == nil {
		t.Fatal("a gateway key answered a device's reset")
	}
	if _, err := k.checkReset("d1", "reset:another", signed); !errors.Is(err, auth.ErrNotBound) {
		t.Fatalf("reset ack for another reset id: %v", err)
	}
	if got, err := k.checkReset("d1", renv.ID, signed); err != nil || got.Mark() != (fence.Mark{Token: 3, Seq: 1}) {
		t.Fatalf("the device's own reset ack: %+v %v", got, err)
	}
}

// testSigner returns a new key and its signer named kid.
func testSigner(t *testing.T, kid string) (*ecdsa.PrivateKey, *auth.Signer) {
	t.Helper()
	k, err := auth.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	s, err := auth.NewSigner([]byte(kid), k)
	if err != nil {
		t.Fatal(err)
	}
	return k, s
}

// A reset (or the fleet's epoch) lowers a device's mark in a new epoch:
// its reports of the new epoch are newer than every report of the old one
// — accepted although their marks are lower —, and an old-epoch report
// replayed afterwards is refused, whatever its mark.
func TestDeviceAuthReportsAcrossEpochs(t *testing.T) {
	k := &deviceAuth{reports: map[string]*auth.StateReport{}, marks: map[string]fence.State{}}
	report := func(epoch uint64, token fence.Token, counter uint64) *auth.StateReport {
		return &auth.StateReport{Device: "d1", Epoch: epoch, Token: token, Seq: 1, Counter: counter}
	}
	old := report(0, 900, 5)
	if err := k.newer(old); err != nil {
		t.Fatal(err)
	}
	k.marks["d1"] = fence.State{Epoch: 9, Mark: fence.Mark{Token: 3, Seq: 1}} // the device's ack after the reset
	if err := k.newer(report(9, 3, 1)); err != nil {
		t.Fatalf("the new epoch's first report: %v", err)
	}
	for _, r := range []*auth.StateReport{old, report(0, 901, 6), report(8, 5000, 1)} {
		if err := k.newer(r); !errors.Is(err, errReplayed) {
			t.Errorf("a report of epoch %d mark %d after the reset: %v", r.Epoch, r.Token, err)
		}
	}
}
