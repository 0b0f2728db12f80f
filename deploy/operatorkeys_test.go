package deploy_test

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// The signed world of TestInstallAndOperate, made with the installed
// binary from the keys `edgefence keys init` wrote in keys.

// otherGateway makes another gateway's key pair (gw-other, in dir) and has
// the root in keys certify it for every device: the certificate's file
// and the signer.
func otherGateway(t *testing.T, bin, keys, dir string) (cert string, s *auth.Signer) {
	t.Helper()
	prefix, cert := filepath.Join(dir, "gw-other"), filepath.Join(dir, "gw-other.cert")
	run(t, time.Minute, ".", nil, bin, "keys", "new", "--out", prefix)
	run(t, time.Minute, ".", nil, bin, "keys", "certify", "--root-key", filepath.Join(keys, "root.key"), "--pub", prefix+".pub",
		"--kid", "gw-other/1", "--devices", "*", "--out", cert)
	k, err := auth.ReadKey(prefix + ".key")
	if err != nil {
		t.Fatal(err)
	}
	if s, err = auth.NewSigner([]byte("gw-other/1"), k); err != nil {
		t.Fatal(err)
	}
	return cert, s
}

// signedFleet enrols devices (`keys enrol --config cfg`: their own keys in
// dir/bundle, their certificates in etcd, where the agent reads them) and
// runs them: they take only commands signed by a key the root certified
// (this gateway's, and those of certs) and sign their acks and state
// reports.
func signedFleet(t *testing.T, ctx context.Context, bin, cfg, keys string, w *sandbox.World, devices []string, dir string, certs ...string) *sim.Fleet {
	t.Helper()
	bundle := filepath.Join(dir, "bundle")
	pub, err := auth.ReadPublic(filepath.Join(keys, "root.pub"))
	if err != nil {
		t.Fatal(err)
	}
	trust, err := auth.NewTrust([]byte("operator"), pub, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range append([]string{filepath.Join(keys, "gateway.cert")}, certs...) {
		if _, err := trust.AddCertificateFile(c); err != nil {
			t.Fatal(err)
		}
	}
	signers := map[string]*auth.Signer{}
	for _, d := range devices {
		run(t, time.Minute, ".", nil, bin, "keys", "enrol", d, "--root-key", filepath.Join(keys, "root.key"), "--out", bundle, "--config", cfg)
		k, err := auth.ReadKey(filepath.Join(bundle, d+".key"))
		if err != nil {
			t.Fatal(err)
		}
		if signers[d], err = auth.NewSigner([]byte(d+"/1"), k); err != nil {
			t.Fatal(err)
		}
	}
	fleet, err := sim.NewFleet(ctx, sim.FleetConfig{Devices: devices, DataDir: filepath.Join(dir, "devices"),
		Broker: w.Broker.URL(), ClientID: "devsim-operate", Keys: trust, Signers: signers})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		fleet.Close(c)
	})
	if err := fleet.AwaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return fleet
}

// otherCommander is another gateway's commander for dev, signing with s.
func otherCommander(t *testing.T, ctx context.Context, w *sandbox.World, fleet *sim.Fleet, dev string, s *auth.Signer) *mqtt.Commander {
	t.Helper()
	other, err := mqtt.NewCommander(ctx, mqtt.Config{Brokers: []string{w.Broker.URL()}, ClientID: "gw-other",
		CleanStart: true, SessionExpiry: -1}, fleet.Topics(), []string{dev})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		other.Close(c)
	})
	other.SignWith(s.Sign)
	if err := other.Client().AwaitSubscribed(ctx); err != nil {
		t.Fatal(err)
	}
	return other
}

// unitCredentials does what systemd does for the installed unit's
// LoadCredential=ID:PATH lines (PATH in the scratch root): a copy of each
// file, named ID, in dir, which it returns as $CREDENTIALS_DIRECTORY.
func unitCredentials(t *testing.T, root, dir string) string {
	t.Helper()
	f, err := os.Open(filepath.Join(root, unitPath))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	n := 0
	for sc := bufio.NewScanner(f); sc.Scan(); {
		id, path, ok := strings.Cut(strings.TrimPrefix(sc.Text(), "LoadCredential="), ":")
		if !ok || !strings.HasPrefix(sc.Text(), "LoadCredential=") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(root, path))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, id), b, 0o400); err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n == 0 {
		t.Fatal("the installed unit has no LoadCredential=")
	}
	return dir
}
