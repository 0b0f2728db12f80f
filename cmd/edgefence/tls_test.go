package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"

	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/internal/mochiquota"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// testPKI is a throw-away PKI written to PEM files: a CA, a server
// certificate for 127.0.0.1 (etcd and the broker; also good for client
// auth, as etcd's own loopback gateway connects with it), a client
// certificate, and a second CA that signed neither.
type testPKI struct {
	ca, serverCert, serverKey, clientCert, clientKey, otherCA string // file paths

	pool   *x509.CertPool
	server tls.Certificate
	client tls.Certificate
}

func newTestPKI(t *testing.T, dir string) *testPKI {
	t.Helper()
	p := &testPKI{pool: x509.NewCertPool()}
	now := time.Now()
	serial := int64(0)
	issue := func(name string, tmpl *x509.Certificate, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*x509.Certificate, *ecdsa.PrivateKey, string, string) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		serial++
		tmpl.SerialNumber = big.NewInt(serial)
		tmpl.Subject = pkix.Name{CommonName: name}
		tmpl.NotBefore, tmpl.NotAfter = now.Add(-time.Minute), now.Add(time.Hour)
		if parent == nil {
			parent, parentKey = tmpl, key // self-signed
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
		if err != nil {
			t.Fatal(err)
		}
		cert, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatal(err)
		}
		kder, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		certFile, keyFile := filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
		if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
			t.Fatal(err)
		}
		return cert, key, certFile, keyFile
	}
	ca := func() *x509.Certificate {
		return &x509.Certificate{IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	}
	leaf := func(usage ...x509.ExtKeyUsage) *x509.Certificate {
		return &x509.Certificate{KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: usage,
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"}}
	}
	caCert, caKey, caFile, _ := issue("edgefence-test-ca", ca(), nil, nil)
	p.ca = caFile
	p.pool.AddCert(caCert)
	_, _, p.otherCA, _ = issue("other-ca", ca(), nil, nil)
	_, _, p.serverCert, p.serverKey = issue("server", leaf(x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth), caCert, caKey)
	_, _, p.clientCert, p.clientKey = issue("client", leaf(x509.ExtKeyUsageClientAuth), caCert, caKey)
	var err error
	if p.server, err = tls.LoadX509KeyPair(p.serverCert, p.serverKey); err != nil {
		t.Fatal(err)
	}
	if p.client, err = tls.LoadX509KeyPair(p.clientCert, p.clientKey); err != nil {
		t.Fatal(err)
	}
	return p
}

// clientTLS is the TLS configuration of a client with the client certificate.
func (p *testPKI) clientTLS() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: p.pool, Certificates: []tls.Certificate{p.client}}
}

// tlsBroker starts a mochi broker whose only listener is TLS and requires
// a client certificate signed by the PKI's CA; it returns "HOST:PORT".
func tlsBroker(t *testing.T, p *testPKI) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	srv := mochi.New(&mochi.Options{Logger: slog.New(slog.DiscardHandler)})
	if err := srv.AddHook(new(auth.AllowHook), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := mochiquota.Add(srv); err != nil {
		t.Fatal(err)
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{p.server},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: p.pool}
	if err := srv.AddListener(listeners.NewTCP(listeners.Config{ID: "tls", Address: addr, TLSConfig: tc})); err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return addr
}

// The agent over TLS both ways: etcd on https:// and the broker on
// mqtts://, each requiring a client certificate (mutual TLS), with the
// files from etcd.tls and mqtt.tls. It holds every device, a command is
// accepted, `twin get --config` reads over TLS. With etcd.tls trusting
// another CA, or without a client certificate, run and twin get stop
// naming the TLS problem and nothing is held; with such an mqtt.tls the
// broker link stays down and every attempt logs why.
func TestRunTLS(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	dir := t.TempDir()
	pki := newTestPKI(t, dir)

	etcd, err := sandbox.StartEtcd(ctx, sandbox.EtcdConfig{Dir: filepath.Join(dir, "etcd"), Fast: true,
		TLS: &sandbox.EtcdTLS{CertFile: pki.serverCert, KeyFile: pki.serverKey,
			ClientCAFile: pki.ca, ClientCertAuth: true, Client: pki.clientTLS()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { etcd.Close() })
	if !strings.HasPrefix(etcd.Endpoint(), "https://") {
		t.Fatalf("etcd endpoint %s is not https", etcd.Endpoint())
	}
	cli, err := etcd.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	broker := "mqtts://" + tlsBroker(t, pki)

	// The devices connect over mutual TLS too.
	devices := []string{"dev-1", "dev-2"}
	fleet, err := sim.NewFleet(ctx, sim.FleetConfig{Devices: devices, DataDir: filepath.Join(dir, "devices"),
		Broker: broker, ClientID: "devsim-" + t.Name(), MQTT: mqtt.Config{TLSConfig: pki.clientTLS()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := fleet.Close(cctx); err != nil {
			t.Errorf("fleet close: %v", err)
		}
	})
	if err := fleet.AwaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, dir: dir, etcd: cli, fleet: fleet, devices: devices}

	// config writes gateway's config with its etcd.tls and mqtt.tls.
	config := func(gateway, etcdTLS, mqttTLS string) (path, socket string) {
		c := sandbox.AgentConfig{Gateway: gateway, Etcd: etcd.Endpoint(), MQTT: broker, Devices: devices,
			Socket: filepath.Join(dir, gateway+".sock"), StateDir: filepath.Join(dir, gateway+"-state"), LogFormat: "json"}
		b, err := c.YAML()
		if err != nil {
			t.Fatal(err)
		}
		s := strings.Replace(string(b), "etcd:\n", "etcd:\n  dial_timeout: 5s\n"+etcdTLS, 1)
		s = strings.Replace(s, "mqtt:\n", "mqtt:\n"+mqttTLS, 1)
		path = filepath.Join(dir, gateway+".yaml")
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return path, c.Socket
	}
	tlsBlock := func(ca string, withCert bool) string {
		s := "  tls:\n    ca_file: " + yamlString(ca) + "\n"
		if withCert {
			s += "    cert_file: " + yamlString(pki.clientCert) + "\n    key_file: " + yamlString(pki.clientKey) + "\n"
		}
		return s
	}
	good := tlsBlock(pki.ca, true)
	refusals := []struct {
		name string
		tls  string
		want string // in the error
	}{
		{"wrong-ca", tlsBlock(pki.otherCA, true), "certificate signed by unknown authority"},
		{"no-cert", tlsBlock(pki.ca, false), "tls: certificate required"},
	}

	// etcd refuses the handshake, or the agent refuses etcd's certificate:
	// run stops at once naming the TLS problem and etcd.tls, holding
	// nothing (run first, so that "nothing" is plain in etcd).
	for _, tc := range refusals {
		path, _ := config("gw-etcd-"+tc.name, tc.tls, good)
		r := edgefence(t, "run", "--config", path)
		if r.code != 1 || !strings.Contains(r.stderr, tc.want) || !strings.Contains(r.stderr, "etcd.tls") {
			t.Errorf("run with etcd.tls %s: want exit 1 naming %q and etcd.tls\n%s", tc.name, tc.want, r)
		}
	}
	leases, err := cli.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range devices {
		if keys := e.lockKeys(d); len(keys) != 0 || len(leases.Leases) != 0 {
			t.Fatalf("after the refused agents: lock keys %v, leases %v; want none", keys, leases.Leases)
		}
	}

	// The right files: the agent holds every device, with the broker up.
	// This agent is the shipped build (SHIPTAGS: without net/http's own
	// HTTP/2, which this test binary's etcd needs to serve gRPC over TLS):
	// its gRPC to etcd over TLS must not need it.
	path, sock := config("gw-1", good, good)
	p := e.startAgentBin("gw-1", shippedBuild(t), path)
	st := e.waitHolding(p, sock)
	if !st.Etcd.Session {
		t.Fatalf("holding without a session?\n%+v", st)
	}
	for deadline := time.Now().Add(10 * time.Second); st.Transport["connected"] != true; {
		if time.Now().After(deadline) {
			t.Fatalf("gw-1 holds its devices but its broker link is down\n%+v", st)
		}
		time.Sleep(50 * time.Millisecond)
		st, _ = status(t, sock)
	}
	r := edgefence(t, "send", "--json", "--socket", sock, "dev-1", "set", `{"setpoint":22}`)
	if res := sendResult(t, r); r.code != 0 || res.Verdict != "accepted" || res.Device != "dev-1" {
		t.Fatalf("send over mqtts: %+v, want accepted\n%s", res, r)
	}
	// The twin commands build their own etcd client from the config.
	r = edgefence(t, "twin", "get", "dev-1", "--config", path)
	if r.code != 0 || !strings.Contains(r.stdout, "desired: not written") {
		t.Fatalf("twin get over https\n%s", r)
	}
	bad, _ := config("gw-twin-no-cert", refusals[1].tls, good)
	r = edgefence(t, "twin", "get", "dev-1", "--config", bad)
	if r.code != 1 || !strings.Contains(r.stderr, "tls: certificate required") || !strings.Contains(r.stderr, "etcd.tls") {
		t.Fatalf("twin get without a client certificate: want exit 1 naming the TLS refusal\n%s", r)
	}

	// The broker refuses the handshake, or the agent the broker's
	// certificate: the agent runs on (etcd is fine, it campaigns), its
	// broker link stays down, and each attempt logs the TLS problem.
	for _, tc := range refusals {
		gw := "gw-mqtt-" + tc.name
		path, sock := config(gw, good, tc.tls)
		p := e.startAgent(gw, path)
		log := filepath.Join(dir, gw+".log")
		if line := waitLogLine(t, p, log, `"msg":"mqtt connect failed; retrying"`, tc.want); line == "" {
			b, _ := os.ReadFile(log)
			t.Fatalf("%s: no connect failure naming %q logged\n%s", gw, tc.want, b)
		}
		st, r := status(t, sock)
		if st == nil || st.Transport["connected"] != false || !st.Etcd.Session {
			t.Fatalf("%s: want an etcd session and no broker\n%s", gw, r)
		}
		if err := p.Stop(10 * time.Second); err != nil {
			t.Errorf("%s did not stop cleanly: %v", gw, err)
		}
	}
}

// waitLogLine returns the first line of the log at path holding every one
// of subs, waiting up to 30 s; "" if none comes or p exits.
func waitLogLine(t *testing.T, p *sandbox.Proc, path string, subs ...string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, _ := os.ReadFile(path)
	lines:
		for line := range strings.Lines(string(b)) {
			for _, s := range subs {
				if !strings.Contains(line, s) {
					continue lines
				}
			}
			return line
		}
		select {
		case <-p.Done():
			return ""
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return ""
		}
	}
}

// yamlString quotes s for YAML (a JSON string is a YAML double-quoted scalar).
func yamlString(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}
