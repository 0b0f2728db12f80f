package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/fence/auth/authtest"
	"github.com/edgefence/edgefence/internal/sandbox"
)

// TestTrustEtcdRebuilt, on Debian's etcd 3.4 and the embedded one: a
// signed site — a device whose acks its own enrolled key signs, gateways
// certified by the operator — loses etcd (wiped: the device certificate
// and every other statement with it). gw-1, restarted on its state dir,
// refuses the low token etcd grants now (its guard) and puts back the
// statements it kept in trust.db (the device's certificate and its own).
// gw-2, a replacement with no state of its own, takes the device with a
// token below the device's mark; the device answers stale, signed, and
// gw-2 verifies it with the certificate gw-1 put back: a token regression,
// state refused, the lock let go. Before, the certificates lived only in
// etcd: gw-2 dropped the stale ack it could not verify, the send never had
// a verdict and gw-2 kept the lock for good. Then the fleet recovers with
// one signed epoch statement (`edgefence keys epoch`): a gateway commands
// the device again in the new epoch.
func TestTrustEtcdRebuilt(t *testing.T) {
	for _, k := range etcdKinds {
		t.Run(k.name, func(t *testing.T) {
			site := newSignedSite(t)
			var ae agentEtcd
			e := newEnvFleet(t, func(w *sandbox.World, fc *sim.FleetConfig) {
				ae = k.start(t, &env{t: t, world: w})
				fc.Keys, fc.Signers = site.op.Trust(), map[string]*auth.Signer{"dev-1": site.enrol("dev-1", ae.url)}
			}, "dev-1")
			e.etcdURL = ae.url
			cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ae.url}, DialTimeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cli.Close() })
			if r := edgefence(t, "etcd", "bump-revision", "--etcd", ae.url, "--to", "500"); r.code != 0 {
				t.Fatal(r)
			}
			cfg1, sock1 := site.gateway(e, "gw-1", 5*time.Second)
			gw1 := e.startAgent("gw-1", cfg1)
			high := e.waitHolding(gw1, sock1).Devices[0].Token
			if r, res := e.set(sock1, "dev-1", 21); res.Verdict != "accepted" {
				t.Fatalf("signed command under token %d: %s", high, r)
			}
			if err := gw1.Stop(10 * time.Second); err != nil {
				t.Fatal(err)
			}

			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			if err := ae.wipe(ctx); err != nil {
				t.Fatal(err)
			}
			// gw-1 on its state dir refuses the low token by its own
			// guard, and puts back the statements it kept.
			gw1 = e.startAgent("gw-1-after-wipe", cfg1)
			waitDeviceState(t, gw1, sock1, "dev-1", agent.StateRefused)
			for _, key := range []string{agent.TrustDeviceKey(agent.DefaultEtcdPrefix, "dev-1"), agent.TrustCertKey(agent.DefaultEtcdPrefix, "gw-1")} {
				for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
					resp, err := cli.Get(ctx, key)
					if err == nil && len(resp.Kvs) == 1 {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("%s not put back into etcd: %v", key, err)
					}
				}
			}
			if st, _ := status(t, sock1); st == nil || st.Trust == nil || st.Trust.Republished < 2 {
				t.Fatalf("gw-1's trust status: %+v", st)
			}

			// A replacement gateway with no state: it reads the
			// certificates gw-1 put back.
			cfg2, sock2 := site.gateway(e, "gw-2", 5*time.Second)
			gw2 := e.startAgent("gw-2", cfg2)
			e.waitHolding(gw2, sock2)
			if r, res := e.set(sock2, "dev-1", 98); res.Verdict != "stale" {
				t.Fatalf("gw-2 after the wipe: want the device's signed stale, verified\n%s", r)
			}
			waitDeviceState(t, gw2, sock2, "dev-1", agent.StateRefused)

			// The recovery of a signed fleet: one epoch statement. A
			// gateway takes the device in the new epoch (the trust update
			// brings the statement to the device first) and is accepted.
			if r := edgefence(t, "keys", "epoch", "--root-key", site.root+".key", "--root-kid", authtest.RootKID, "--root-pub", site.root+".pub",
				"--etcd", ae.url); r.code != 0 {
				t.Fatalf("keys epoch: %s", r)
			}
			holder := ""
			for deadline := time.Now().Add(30 * time.Second); holder == ""; time.Sleep(50 * time.Millisecond) {
				for _, sock := range []string{sock1, sock2} {
					if st, _ := status(t, sock); st != nil && st.Devices[0].State == agent.StateHolding && st.Devices[0].Epoch > 0 {
						holder = sock
					}
				}
				if time.Now().After(deadline) {
					t.Fatal("no gateway holds dev-1 in the new epoch")
				}
			}
			if r, res := e.set(holder, "dev-1", 23); res.Verdict != "accepted" {
				t.Fatalf("in the new epoch: %s", r)
			}

			// The operator's own copy goes back the same way: the
			// enrolment bundle's certificate, to the device's key.
			devKey := agent.TrustDeviceKey(agent.DefaultEtcdPrefix, "dev-1")
			if _, err := cli.Delete(ctx, devKey); err != nil {
				t.Fatal(err)
			}
			if r := edgefence(t, "keys", "publish", "--etcd", ae.url, "--root-pub", site.root+".pub", "--root-kid", authtest.RootKID,
				"--certs", filepath.Join(site.dir, "bundle", "dev-1.cert")); r.code != 0 || !strings.Contains(r.stdout, devKey) {
				t.Fatalf("keys publish of the device's certificate: %s", r)
			}
		})
	}
}
