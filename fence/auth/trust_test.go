package auth_test

import (
	"crypto/ecdsa"
	"errors"
	"testing"
	"time"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
)

// chain is an operator root, a Trust anchored at it, and a clock.
type chain struct {
	root  *auth.Root
	trust *auth.Trust
	now   time.Time
	rk    *ecdsa.PrivateKey // the root's key
}

func newChain(t testing.TB) *chain {
	t.Helper()
	rk := newKey(t)
	root, err := auth.NewRoot([]byte("operator"), rk)
	if err != nil {
		t.Fatal(err)
	}
	c := &chain{root: root, now: time.Unix(1_800_000_000, 0), rk: rk}
	if c.trust, err = auth.NewTrust([]byte("operator"), &rk.PublicKey, func() time.Time { return c.now }); err != nil {
		t.Fatal(err)
	}
	return c
}

// gateway certifies a new gateway key for devices and returns its signer.
func (c *chain) gateway(t *testing.T, kid string, serial uint64, devices ...string) *auth.Signer {
	t.Helper()
	return c.certified(t, kid, func(k *ecdsa.PublicKey, nb, na time.Time) ([]byte, error) {
		return c.root.Certify([]byte(kid), k, devices, nb, na, serial)
	})
}

// certified makes a new key, has certify certify it for the day around
// c.now, adds the certificate to c.trust and returns the key's signer.
func (c *chain) certified(t testing.TB, kid string, certify func(k *ecdsa.PublicKey, notBefore, notAfter time.Time) ([]byte, error)) *auth.Signer {
	t.Helper()
	k := newKey(t)
	cert, err := certify(&k.PublicKey, c.now.Add(-time.Hour), c.now.Add(24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.trust.AddCertificate(cert); err != nil {
		t.Fatal(err)
	}
	s, err := auth.NewSigner([]byte(kid), k)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestTrustChain(t *testing.T) {
	c := newChain(t)
	gw := c.gateway(t, "gw-a/1", 1, "dev-1", "plc-*")
	verify := func(s *auth.Signer, dev string) error {
		t.Helper()
		raw, err := s.Sign(env(dev, 9, 1))
		if err != nil {
			t.Fatal(err)
		}
		_, err = auth.Verify(raw, c.trust)
		return err
	}
	for _, dev := range []string{"dev-1", "plc-7"} {
		if err := verify(gw, dev); err != nil {
			t.Fatalf("%s: %v", dev, err)
		}
	}
	if err := verify(gw, "dev-2"); !errors.Is(err, auth.ErrNotAuthorised) {
		t.Fatalf("dev-2: %v", err)
	}

	// A self-made certificate (another root) is refused, and so is its key.
	other := newChain(t)
	k := newKey(t)
	forged, err := other.root.Certify([]byte("mallory"), &k.PublicKey, []string{"*"}, c.now.Add(-time.Hour), c.now.Add(time.Hour), 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.trust.AddCertificate(forged); !errors.Is(err, auth.ErrBadSignature) || !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("forged certificate: %v", err)
	}
	mallory, err := auth.NewSigner([]byte("mallory"), k)
	if err != nil {
		t.Fatal(err)
	}
	if err := verify(mallory, "dev-1"); !errors.Is(err, auth.ErrUnknownKey) {
		t.Fatalf("mallory: %v", err)
	}

	// Expiry.
	c.now = c.now.Add(25 * time.Hour)
	if err := verify(gw, "dev-1"); !errors.Is(err, auth.ErrExpired) {
		t.Fatalf("expired: %v", err)
	}
	c.now = c.now.Add(-25 * time.Hour)

	// Revocation, versioned: an older list cannot un-revoke.
	v2, err := c.root.Revoke(2, [][]byte{[]byte("gw-a/1")}, c.now)
	if err != nil {
		t.Fatal(err)
	}
	v1, err := c.root.Revoke(1, nil, c.now)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.trust.ApplyRevocations(v2); err != nil {
		t.Fatal(err)
	}
	if err := verify(gw, "dev-1"); !errors.Is(err, auth.ErrRevoked) {
		t.Fatalf("revoked: %v", err)
	}
	for _, old := range [][]byte{v1, v2} {
		if err := c.trust.ApplyRevocations(old); !errors.Is(err, auth.ErrStaleTrust) || c.trust.Version() != 2 {
			t.Fatalf("replayed list: %v (version %d)", err, c.trust.Version())
		}
	}
	if err := verify(gw, "dev-1"); !errors.Is(err, auth.ErrRevoked) {
		t.Fatalf("still revoked after a replay: %v", err)
	}
	// Rotation: a new key for the gateway, certified, works; the old stays revoked.
	gw2 := c.gateway(t, "gw-a/2", 1, "dev-1")
	if err := verify(gw2, "dev-1"); err != nil {
		t.Fatalf("rotated key: %v", err)
	}
	// A revocation list signed by another root is refused.
	bad, err := other.root.Revoke(9, nil, c.now)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.trust.ApplyRevocations(bad); err == nil || c.trust.Version() != 2 {
		t.Fatalf("foreign revocation list: %v (version %d)", err, c.trust.Version())
	}
}

// A newer certificate for a key id replaces an older one; an older one
// replayed does not bring back what it allowed.
func TestCertificateSerial(t *testing.T) {
	c := newChain(t)
	k := newKey(t)
	cert := func(serial uint64, devices ...string) []byte {
		raw, err := c.root.Certify([]byte("gw"), &k.PublicKey, devices, c.now.Add(-time.Hour), c.now.Add(time.Hour), serial)
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	wide, narrow := cert(1, "*"), cert(2, "dev-1")
	for _, raw := range [][]byte{wide, narrow, wide} {
		if _, err := c.trust.AddCertificate(raw); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.trust.Key([]byte("gw"), "dev-2"); !errors.Is(err, auth.ErrNotAuthorised) {
		t.Fatalf("older, wider certificate replayed: %v", err)
	}
}

// FuzzAddCertificate: nothing but a root-signed statement is ever taken.
func FuzzAddCertificate(f *testing.F) {
	c := newChain(f)
	f.Add([]byte{0xd2, 0x84, 0x40, 0xa0, 0x40, 0x40})
	f.Fuzz(func(t *testing.T, raw []byte) {
		if _, err := c.trust.AddCertificate(raw); err == nil {
			t.Fatal("a certificate not signed by the root was accepted")
		}
		if err := c.trust.ApplyRevocations(raw); err == nil {
			t.Fatal("a revocation list not signed by the root was accepted")
		}
	})
}

// A statement is read only as the kind its protected content type names:
// a certificate is not a revocation list, and the root's statement is not
// a command.
func TestStatementContentType(t *testing.T) {
	c := newChain(t)
	k := newKey(t)
	cert, err := c.root.Certify([]byte("gw/1"), &k.PublicKey, []string{"*"}, c.now.Add(-time.Hour), c.now.Add(time.Hour), 1)
	if err != nil {
		t.Fatal(err)
	}
	list, err := c.root.Revoke(1, [][]byte{[]byte("gw/1")}, c.now)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.trust.ApplyRevocations(cert); !errors.Is(err, auth.ErrMalformed) || !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("certificate as revocation list: %v", err)
	}
	if _, err := c.trust.AddCertificate(list); !errors.Is(err, auth.ErrMalformed) {
		t.Errorf("revocation list as certificate: %v", err)
	}
	if _, err := auth.Verify(cert, c.trust); !errors.Is(err, auth.ErrMalformed) {
		t.Errorf("certificate as command: %v", err)
	}
	if c.trust.Version() != 0 {
		t.Errorf("revocation version %d after refusals", c.trust.Version())
	}
}

// Rotating a gateway's key with overlap: the new key (gw-a/2) is certified
// while the old one (gw-a/1) is still valid, so commands signed by either
// verify during the switch; once the operator revokes gw-a/1, only the new
// key's do, and replaying the old certificate (or an older list) changes
// nothing.
func TestRotationWithOverlap(t *testing.T) {
	c := newChain(t)
	old := c.gateway(t, "gw-a/1", 1, "dev-1")
	verify := func(s *auth.Signer) error {
		t.Helper()
		raw, err := s.Sign(env("dev-1", 9, 1))
		if err != nil {
			t.Fatal(err)
		}
		_, err = auth.Verify(raw, c.trust)
		return err
	}
	k := newKey(t)
	newCert, err := c.root.Certify([]byte("gw-a/2"), &k.PublicKey, []string{"dev-1"}, c.now.Add(-time.Minute), c.now.Add(365*24*time.Hour), 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.trust.AddCertificate(newCert); err != nil {
		t.Fatal(err)
	}
	next, err := auth.NewSigner([]byte("gw-a/2"), k)
	if err != nil {
		t.Fatal(err)
	}
	if err := verify(old); err != nil {
		t.Fatalf("old key during the overlap: %v", err)
	}
	if err := verify(next); err != nil {
		t.Fatalf("new key during the overlap: %v", err)
	}
	list, err := c.root.Revoke(1, [][]byte{[]byte("gw-a/1")}, c.now)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.trust.ApplyRevocations(list); err != nil {
		t.Fatal(err)
	}
	if err := verify(old); !errors.Is(err, auth.ErrRevoked) {
		t.Fatalf("old key after its revocation: %v", err)
	}
	if err := verify(next); err != nil {
		t.Fatalf("new key after the old one's revocation: %v", err)
	}
	empty, err := c.root.Revoke(0, nil, c.now)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.trust.ApplyRevocations(empty); !errors.Is(err, auth.ErrStaleTrust) {
		t.Fatalf("an older, empty list: %v", err)
	}
	if err := verify(old); !errors.Is(err, auth.ErrRevoked) {
		t.Fatalf("old key after an older list was replayed: %v", err)
	}
}
