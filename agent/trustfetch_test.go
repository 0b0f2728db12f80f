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
	cfg := &Config{Gateway: "gw-1", Etcd: EtcdConfig{Endpoints: testEtcd.Endpoints(), Prefix: prefix, LeaseTTL: 2 * time.Second},
		MQTT: MQTTConfig{Brokers: []string{"mqtt://127.0.0.1:1"}}, Auth: siteAuth(t, op, gw, "gw-1"), Devices: devs}
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
	cfg := &Config{Gateway: "gw-1", Etcd: EtcdConfig{Endpoints: testEtcd.Endpoints(), Prefix: prefix, LeaseTTL: 2 * time.Second},
		MQTT: MQTTConfig{Brokers: []string{"mqtt://127.0.0.1:1"}}, Auth: siteAuth(t, op, gw, "gw-1"),
		Devices: []DeviceConfig{{ID: "d1", Auth: AuthRequired}}}
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
