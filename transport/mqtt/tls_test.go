package mqtt

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"log/slog"
	"math/big"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// selfSigned returns a certificate for 127.0.0.1, good for a server and
// a client, and a pool that trusts it.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "edgefence test broker"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}

func TestTLS(t *testing.T) {
	cert, pool := selfSigned(t)
	b := newBroker(t, freeAddr(t))
	b.tls = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	b.start()
	url := "mqtts://" + b.addr
	withRoots := func(c *Config) { c.TLSConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12} }

	got := make(chan Message, 1)
	sub := dial(t, url, "tls-sub", withRoots)
	sub.Subscribe("tls/#", func(m Message) { got <- m })
	pub := dial(t, url, "tls-pub", withRoots)
	if err := sub.AwaitSubscribed(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := pub.AwaitConnection(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(timeout(t, 5*time.Second), Message{Topic: "tls/a", Payload: []byte("secret"), CorrelationData: []byte("c")}); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-got:
		if string(m.Payload) != "secret" || string(m.CorrelationData) != "c" {
			t.Errorf("got %+v", m)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("not received over TLS")
	}

	// A client that does not trust the certificate never connects.
	untrusting := dial(t, url, "tls-untrusting")
	if err := untrusting.AwaitConnection(timeout(t, 300*time.Millisecond)); err == nil {
		t.Error("connected without trusting the broker's certificate")
	}
}

// alertLog collects the errors of failed connection attempts.
type alertLog struct {
	mu   sync.Mutex
	errs []string
}

func (l *alertLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *alertLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *alertLog) WithGroup(string) slog.Handler            { return l }
func (l *alertLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "mqtt connect failed; retrying" {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "err" {
			l.mu.Lock()
			l.errs = append(l.errs, a.Value.String())
			l.mu.Unlock()
		}
		return true
	})
	return nil
}

func (l *alertLog) snapshot() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.errs...)
}

// A broker that requires a client certificate refuses a client without
// one after the client's TLS 1.3 handshake is done: every failed attempt
// names the broker's alert, not just the "broken pipe" of the CONNECT
// written into the closed connection. With the certificate it connects.
func TestTLSClientCertRequired(t *testing.T) {
	cert, pool := selfSigned(t)
	b := newBroker(t, freeAddr(t))
	b.tls = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12,
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool}
	b.start()
	url := "mqtts://" + b.addr

	log := new(alertLog)
	noCert := dial(t, url, "tls-no-cert", func(c *Config) {
		c.TLSConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13}
		c.Logger = slog.New(log)
	})
	deadline := time.Now().Add(10 * time.Second)
	for len(log.snapshot()) < 5 {
		if time.Now().After(deadline) {
			t.Fatalf("want 5 failed attempts, got %q", log.snapshot())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if noCert.Connected() {
		t.Fatal("connected without a client certificate")
	}
	for _, e := range log.snapshot() {
		if !strings.Contains(e, "tls: certificate required") {
			t.Errorf("attempt error does not name the TLS refusal: %s", e)
		}
	}

	// The self-signed certificate is its own CA: good as a client's too.
	withCert := dial(t, url, "tls-cert", func(c *Config) {
		c.TLSConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}}
	})
	if err := withCert.AwaitConnection(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
}
