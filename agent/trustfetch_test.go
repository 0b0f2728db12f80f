package agent

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"go.etcd.io/bbolt"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/fence/auth/authtest"
)

// TestPrefetchDeviceCertificates: at start the agent reads its `auth:
// required` devices' certificates from etcd ahead of their first acks and
// keeps them in its trust store, so that a takeover's first acks verify
// without a read each; a certificate that is not the root's is refused.
func TestPrefetchDeviceCertificates(t *testing.T) {
	op := authtest.NewOperator(t)
	gw := op.Certify("gw-1", "*")
	prefix := "/t/" + t.Name()
	cli := etcdClient(t)
	var devs []DeviceConfig
	for i := range 70 { // more than one batch
		dev := fmt.Sprintf("d%02d", i)
		devs = append(devs, DeviceConfig{ID: dev, Auth: AuthRequired})
		k, err := auth.NewKey()
		if err != nil {
			t.Fatal(err)
		}
		root := op.Root
		if i == 7 {
			root = authtest.NewOperator(t).Root // not this root's
		}
		cert, err := root.CertifyDevice([]byte(dev+"/1"), &k.PublicKey, dev, time.Now().Add(-time.Hour), time.Now().Add(time.Hour), 1)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(t.Context(), TrustDeviceKey(prefix, dev), string(cert)); err != nil {
			t.Fatal(err)
		}
	}
	db, err := bbolt.Open(filepath.Join(t.TempDir(), "trust.db"), 0o600, &bbolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	cfg := signedD1Config(t, op, gw, prefix)
	cfg.Devices = devs
	a := runAgent(t, cfg, cli, newFencePoint(), Options{TrustDB: db})
	known := func(dev string) bool {
		_, err := a.keep.t.DeviceKey([]byte(dev+"/1"), dev)
		return err == nil
	}
	waitFor(t, "every certificate of this root read ahead", func() bool {
		for i, d := range devs {
			if known(d.ID) != (i != 7) {
				return false
			}
		}
		return true
	})
	a.stop()
	// Kept: a trust opened on the same store has them without etcd.
	keep, err := newKeeper(cfg, db, a.log, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := keep.t.DeviceKey([]byte("d69/1"), "d69"); err != nil {
		t.Fatalf("after a restart: %v", err)
	}
}

// TestRepublishMarker: an etcd that lost the agent's statements — and its
// marker with them — gets them back although its revision never went
// back (a wipe whose new revisions passed the old ones between two looks).
func TestRepublishMarker(t *testing.T) {
	op := authtest.NewOperator(t)
	gw := op.Certify("gw-1", "*")
	prefix := "/t/" + t.Name()
	cli := etcdClient(t)
	cfg := signedD1Config(t, op, gw, prefix)
	a, err := newAgent(t, cfg, cli, newFencePoint(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	a.repub.every = 50 * time.Millisecond
	ta := runStarted(t, a)
	defer ta.stop()
	certKey := TrustCertKey(prefix, "gw-1")
	there := func() bool {
		resp, err := cli.Get(t.Context(), certKey, clientv3.WithCountOnly())
		return err == nil && resp.Count == 1
	}
	waitFor(t, "its certificate published", there)
	if _, err := cli.Delete(t.Context(), prefix+"/trust/", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "its certificate put back", there)
}

// TestStateReportAfterEnrolment: a device's signed state report that
// arrives before the agent has its certificate (the device enrolled after
// the agent started) is refused, kept, and taken once the enrolment shows
// in etcd: a retained report, which the broker does not send again, still
// counts.
func TestStateReportAfterEnrolment(t *testing.T) {
	op := authtest.NewOperator(t)
	gw := op.Certify("gw-1", "*")
	prefix := "/t/" + t.Name()
	cli := etcdClient(t)
	cfg := signedD1Config(t, op, gw, prefix)
	a := runAgent(t, cfg, cli, newFencePoint(), Options{})
	waitFor(t, "holding d1", holdingAll(a, []string{"d1"}))
	dk, err := auth.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	dev, err := auth.NewSigner([]byte("d1/1"), dk)
	if err != nil {
		t.Fatal(err)
	}
	// {"fw": {}}: a field the job runner reads (a report nothing reads is
	// not verified: TestUnreadStateReport).
	report, err := dev.SignState(&auth.StateReport{Device: "d1", Token: 1, Seq: 1, Counter: 1, State: []byte{0xa1, 0x62, 'f', 'w', 0xa0}})
	if err != nil {
		t.Fatal(err)
	}
	a.DeviceStateReport("d1", report)
	taken := func() bool {
		a.devauth.mu.Lock()
		defer a.devauth.mu.Unlock()
		return a.devauth.reports["d1"] != nil
	}
	if taken() {
		t.Fatal("a report taken without the device's certificate")
	}
	cert, err := op.Root.CertifyDevice([]byte("d1/1"), &dk.PublicKey, "d1", time.Now().Add(-time.Hour), time.Now().Add(time.Hour), 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(t.Context(), TrustDeviceKey(prefix, "d1"), string(cert)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the report taken once the device is enrolled", taken)
}

// TestUnreadStateReport: with twins off, a signed state report without a
// firmware field is read by nothing and dropped unverified (counted
// unread, not refused); one with the field, and one that does not decode,
// are checked and refused as before.
func TestUnreadStateReport(t *testing.T) {
	op := authtest.NewOperator(t)
	gw := op.Certify("gw-1", "*")
	prefix := "/t/" + t.Name()
	cfg := signedD1Config(t, op, gw, prefix)
	a := runAgent(t, cfg, etcdClient(t), newFencePoint(), Options{})
	waitFor(t, "holding d1", holdingAll(a, []string{"d1"}))
	_, forger := testSigner(t, "d1/9") // no certificate: every verify refuses it
	sign := func(state []byte) []byte {
		r, err := forger.SignState(&auth.StateReport{Device: "d1", Token: 1, Seq: 1, Counter: 1, State: state})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	refused := func() (n uint64) {
		for i := range a.devauth.statesRefused {
			n += a.devauth.statesRefused[i].Load()
		}
		return n
	}
	a.DeviceStateReport("d1", sign([]byte{0xa1, 0x61, 'x', 0x01})) // {"x": 1}
	if u, r := a.reports.unread.Load(), refused(); u != 1 || r != 0 {
		t.Fatalf("a report nothing reads: unread %d, refused %d; want 1, 0", u, r)
	}
	a.DeviceStateReport("d1", sign([]byte{0xa1, 0x62, 'f', 'w', 0xa0})) // {"fw": {}}
	a.DeviceStateReport("d1", []byte{0xd2, 0x84, 0x01})                 // not a signed report
	if u, r := a.reports.unread.Load(), refused(); u != 1 || r != 2 {
		t.Fatalf("a firmware report and a malformed one: unread %d, refused %d; want 1, 2", u, r)
	}
}

// signedD1Config is gw-1's config under prefix: signed with gw's key
// certified by op, one device d1 `auth: required`, no broker.
func signedD1Config(t *testing.T, op *authtest.Operator, gw *authtest.Gateway, prefix string) *Config {
	t.Helper()
	return &Config{Gateway: "gw-1", Etcd: EtcdConfig{Endpoints: testEtcd.Endpoints(), Prefix: prefix, LeaseTTL: 2 * time.Second},
		MQTT: MQTTConfig{Brokers: []string{"mqtt://127.0.0.1:1"}}, Auth: siteAuth(t, op, gw, "gw-1"),
		Devices: []DeviceConfig{{ID: "d1", Auth: AuthRequired}}}
}
