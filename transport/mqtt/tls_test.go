package mqtt

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"testing"
	"time"
)

// selfSigned returns a server certificate for 127.0.0.1 and a pool that
// trusts it.
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
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
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
