package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/fence/auth/authtest"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// TestTrustOverTheAirEndToEnd: devices provisioned with the operator's
// root only (no certificates) accept a gateway's signed commands once the
// real agent, on acquiring them, has sent its trust update. The operator
// revokes that gateway with `edgefence keys revoke` and `keys publish`
// to etcd: the revoked gateway's agent sees it is revoked and lets the
// device go (state untrusted, certificate_ok false, counted) with nobody
// stopping it — before, it kept the lock and every command of its ended
// invalid —, another certified gateway takes over, relays the list and is
// accepted, and the revoked key, stolen, is refused at the device (mark
// unchanged). A lower list put in etcd is ignored by the agent (logged). The device restarted (fence point
// reopened, root only again) still refuses the revoked key, still knows
// the other gateway, and refuses an older list; an update with a forged
// statement changes nothing.
func TestTrustOverTheAirEndToEnd(t *testing.T) {
	dir := t.TempDir()
	op := authtest.NewOperator(t)
	rootPrefix := filepath.Join(dir, "operator")
	if err := auth.WriteKeyPair(rootPrefix, op.Key); err != nil {
		t.Fatal(err)
	}
	file := func(name string, b []byte) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	list1 := file("revocations-1.cbor", op.Revoke(1))

	deviceTrust := op.Trust() // the device: the root only
	// ... and a key of its own, enrolled: its acks are signed.
	var signers map[string]*auth.Signer
	e := newEnvFleet(t, func(w *sandbox.World, fc *sim.FleetConfig) {
		bundle := filepath.Join(dir, "bundle")
		if r := edgefence(t, "keys", "enrol", "dev-1", "--root-key", rootPrefix, "--root-kid", authtest.RootKID, "--out", bundle,
			"--etcd", w.Etcd.Endpoint()); r.code != 0 {
			t.Fatal(r)
		}
		k, err := auth.ReadKey(filepath.Join(bundle, "dev-1.key"))
		if err != nil {
			t.Fatal(err)
		}
		s, err := auth.NewSigner([]byte("dev-1/1"), k)
		if err != nil {
			t.Fatal(err)
		}
		signers = map[string]*auth.Signer{"dev-1": s}
		fc.Keys, fc.Signers = deviceTrust, signers
	}, "dev-1")
	gateways := map[string]*authtest.Gateway{}
	gateway := func(name string) (cfg, sock string) {
		t.Helper()
		gw := op.Certify(name, "dev-*")
		gateways[name] = gw
		if err := auth.WriteKeyPair(filepath.Join(dir, name), gw.Key); err != nil {
			t.Fatal(err)
		}
		return e.configEdit(name, 3*time.Second, func(c *sandbox.AgentConfig) {
			c.Auth = &sandbox.GatewayKey{KeyFile: filepath.Join(dir, name+".key"), KeyID: name, Certificate: file(name+".cert", gw.Cert),
				Revocations: list1, TrustRoot: rootPrefix + ".pub", TrustRootKID: authtest.RootKID}
		})
	}
	send := func(sock, setpoint string) agent.SendResult {
		t.Helper()
		return sendResult(t, edgefence(t, "send", "--json", "--socket", sock, "dev-1", "set", `{"setpoint":`+setpoint+`}`))
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !ok(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}

	cfg1, sock1 := gateway("gw-1")
	p1 := e.startAgent("gw-1", cfg1)
	e.waitHolding(p1, sock1)
	if res := send(sock1, "21"); res.Verdict != "accepted" {
		t.Fatalf("gw-1 after its trust update: %+v", res)
	}
	cfg2, sock2 := gateway("gw-2")
	p2 := e.startAgent("gw-2", cfg2) // campaigns; gw-1 holds dev-1

	// The operator revokes gw-1 and publishes the list to etcd.
	list2 := filepath.Join(dir, "revocations-2.cbor")
	if r := edgefence(t, "keys", "revoke", "--root-key", rootPrefix, "--root-kid", authtest.RootKID, "--version", "2",
		"--kid", "gw-1", "--out", list2); r.code != 0 {
		t.Fatal(r)
	}
	etcdURL := e.world.Etcd.Endpoint()
	if r := edgefence(t, "keys", "publish", "--etcd", etcdURL, "--root-pub", rootPrefix+".pub", "--revocations", list2); r.code != 0 {
		t.Fatal(r)
	}
	if r := edgefence(t, "keys", "publish", "--etcd", etcdURL, "--root-pub", rootPrefix+".pub", "--certs", filepath.Join(dir, "gw-2.cert")); r.code != 0 {
		t.Fatal(r)
	}
	if resp, err := e.etcd.Get(t.Context(), agent.TrustCertKey(agent.DefaultEtcdPrefix, "gw-2")); err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("certificate not in etcd: %v", err)
	}
	// Not over a newer one; nor a list of another root.
	if r := edgefence(t, "keys", "publish", "--etcd", etcdURL, "--root-pub", rootPrefix+".pub", "--revocations", list1); r.code == 0 || !strings.Contains(r.stderr, "at least as new") {
		t.Fatalf("older list published: %s", r)
	}
	forgedList := file("forged.cbor", authtest.NewOperator(t).Revoke(99))
	if r := edgefence(t, "keys", "publish", "--etcd", etcdURL, "--root-pub", rootPrefix+".pub", "--revocations", forgedList); r.code == 0 {
		t.Fatalf("forged list published: %s", r)
	}
	// gw-1 learns it is revoked: it lets dev-1 go (untrusted) without
	// anyone stopping it, and gw-2 takes over, relays list 2 and is
	// accepted.
	waitFor("gw-1 to leave dev-1 untrusted", func() bool {
		st, _ := status(t, sock1)
		return st != nil && len(st.Devices) == 1 && st.Devices[0].State == agent.StateUntrusted &&
			st.Trust != nil && !st.Trust.CertificateOK && st.Trust.Releases["own_certificate"] >= 1
	})
	e.waitHolding(p2, sock2)
	if res := send(sock2, "23"); res.Verdict != "accepted" {
		t.Fatalf("gw-2 taking over: %+v", res)
	}
	waitFor("the device to learn list 2", func() bool { return deviceTrust.Version() == 2 })
	if res := send(sock1, "66"); res.Verdict != "" || !strings.Contains(res.Error, "not the lease holder") {
		t.Fatalf("revoked gw-1 still commands: %+v", res)
	}
	// Its key, stolen, still cannot command the device.
	before, err := e.fleet.Mark("dev-1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	c := dialMallory(t, ctx, e.world.Broker.URL())
	forgedCmd, err := gateways["gw-1"].Signer.Sign(&fence.Envelope{V: fence.Version, Device: "dev-1", Token: before.Token + 1000, Seq: 1,
		ID: "stolen-1", Kind: "set", Body: []byte{0xa0}})
	if err != nil {
		t.Fatal(err)
	}
	unauth := e.fleet.Stats().Unauthenticated
	if err := c.Publish(ctx, mqtt.Message{Topic: mqtt.Topics{}.Cmd("dev-1"), Payload: forgedCmd}); err != nil {
		t.Fatal(err)
	}
	waitFor("the device to refuse the revoked key", func() bool { return e.fleet.Stats().Unauthenticated > unauth })
	if m, _ := e.fleet.Mark("dev-1"); m != before {
		t.Fatalf("mark %v after the revoked key's command, want %v", m, before)
	}

	// A lower list put straight into etcd: the agents ignore it.
	old, _ := os.ReadFile(list1)
	if _, err := e.etcd.Put(ctx, agent.TrustRevocationsKey(agent.DefaultEtcdPrefix), string(old)); err != nil {
		t.Fatal(err)
	}
	if err := p2.WaitLine(ctx, "revocation list ignored"); err != nil {
		t.Fatalf("gw-2 did not log the lower list: %v", err)
	}

	// The device restarts, provisioned with the root only again.
	if err := e.fleet.Close(ctx); err != nil {
		t.Fatal(err)
	}
	deviceTrust = op.Trust()
	e.fleet, err = sim.NewFleet(ctx, sim.FleetConfig{Devices: []string{"dev-1"}, DataDir: filepath.Join(e.dir, "devices"),
		Broker: e.world.Broker.URL(), ClientID: "devsim-" + t.Name(), Keys: deviceTrust, Signers: signers})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.fleet.Close(context.Background()) })
	if err := e.fleet.AwaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := deviceTrust.Key([]byte("gw-1"), "dev-1"); !errors.Is(err, auth.ErrRevoked) || deviceTrust.Version() != 2 {
		t.Fatalf("gw-1 after the device's restart: %v (list %d)", err, deviceTrust.Version())
	}
	if res := send(sock2, "24"); res.Verdict != "accepted" {
		t.Fatalf("gw-2 after the device's restart (no new trust update): %+v", res)
	}

	// A broker client replays the old list, then forges one.
	forged, _ := os.ReadFile(forgedList)
	for i, up := range [][]byte{authtest.Update(t, old), authtest.Update(t, forged)} {
		refused := e.fleet.Stats().TrustRefused
		if err := c.Publish(ctx, mqtt.Message{Topic: mqtt.Topics{}.Cmd("dev-1"), Payload: up}); err != nil {
			t.Fatal(err)
		}
		waitFor("the device to refuse the update", func() bool { return e.fleet.Stats().TrustRefused > refused })
		if deviceTrust.Version() != 2 {
			t.Fatalf("update %d moved the list to %d", i, deviceTrust.Version())
		}
	}
	if _, err := deviceTrust.Key([]byte("gw-1"), "dev-1"); !errors.Is(err, auth.ErrRevoked) {
		t.Fatalf("gw-1 after the replays: %v", err)
	}
	if m, err := e.fleet.Mark("dev-1"); err != nil || m.Token == 0 {
		t.Fatalf("mark %v %v", m, err)
	}
}
