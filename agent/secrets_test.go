package agent

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TLSConfig.Load reads a CA bundle and a client key pair; bad files are
// ConfigErrors naming the key.
func TestTLSConfigLoad(t *testing.T) {
	dir := t.TempDir()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "gw-1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	certPEM := write("cert.pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	keyPEM := write("key.pem", pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}))
	junk := write("junk.pem", []byte("not pem"))

	if c, err := (TLSConfig{}).Load("mqtt.tls"); c != nil || err != nil {
		t.Fatalf("empty: %v %v", c, err)
	}
	c, err := TLSConfig{CAFile: certPEM, CertFile: certPEM, KeyFile: keyPEM}.Load("mqtt.tls")
	if err != nil || c.RootCAs == nil || len(c.Certificates) != 1 {
		t.Fatalf("%+v %v", c, err)
	}
	for _, tc := range []struct {
		cfg  TLSConfig
		want string
	}{
		{TLSConfig{CAFile: junk}, "etcd.tls.ca_file: " + junk + ": no PEM certificate"},
		{TLSConfig{CAFile: filepath.Join(dir, "none.pem")}, "etcd.tls.ca_file: open "},
		{TLSConfig{CertFile: certPEM, KeyFile: junk}, "etcd.tls.cert_file: tls: "},
	} {
		_, err := tc.cfg.Load("etcd.tls")
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.cfg, err, tc.want)
		}
	}
}
