package auth_test

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"strings"
	"testing"

	"github.com/veraison/go-cose"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
)

func manifest() auth.Manifest {
	sum := sha256.Sum256([]byte("firmware 2.1.0"))
	return auth.Manifest{Image: sum[:], Size: 14, Version: 7, Name: "thermo 2.1.0", Issued: 1_800_000_000_000}
}

// sign1 signs payload as a COSE_Sign1 with any algorithm and headers, as a
// forger would.
func sign1(t *testing.T, alg cose.Algorithm, key any, hdr cose.ProtectedHeader, payload []byte) []byte {
	t.Helper()
	var s cose.Signer
	var err error
	switch k := key.(type) {
	case *ecdsa.PrivateKey:
		s, err = cose.NewSigner(alg, k)
	case ed25519.PrivateKey:
		s, err = cose.NewSigner(alg, k)
	}
	if err != nil {
		t.Fatal(err)
	}
	hdr[cose.HeaderLabelAlgorithm] = alg
	raw, err := cose.Sign1(rand.Reader, s, cose.Headers{Protected: hdr}, payload, nil)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// A manifest round-trips through the root and verifies against a whole
// Trust and a bare RootKey; PeekManifest reads it unverified.
func TestManifestRoundTrip(t *testing.T) {
	c := newChain(t)
	raw, err := c.root.Manifest(manifest())
	if err != nil {
		t.Fatal(err)
	}
	if len(raw) > auth.MaxManifestSize {
		t.Fatalf("manifest of %d bytes", len(raw))
	}
	bare, err := auth.NewRootKey([]byte("operator"), &c.rk.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	want := manifest()
	for name, v := range map[string]auth.ManifestVerifier{"trust": c.trust, "root key": bare} {
		m, err := v.VerifyManifest(raw)
		if err != nil || string(m.Image) != string(want.Image) || m.Size != want.Size || m.Version != want.Version || m.Name != want.Name || m.Issued != want.Issued {
			t.Fatalf("%s: %+v, %v", name, m, err)
		}
	}
	if m, err := auth.PeekManifest(raw); err != nil || m.Version != 7 {
		t.Fatalf("PeekManifest: %+v, %v", m, err)
	}
	// The encoding is deterministic: the payload is the same bytes each time.
	again, _ := c.root.Manifest(manifest())
	var a, b cose.Sign1Message
	if a.UnmarshalCBOR(raw) != nil || b.UnmarshalCBOR(again) != nil || string(a.Payload) != string(b.Payload) {
		t.Fatal("two signings of one manifest carry different payloads")
	}
	noName := manifest()
	noName.Name = ""
	if _, err := c.root.Manifest(noName); err != nil {
		t.Fatalf("a manifest without a name: %v", err)
	}
}

// Every forgery is refused with fence.ErrInvalid and the reason's sentinel.
func TestManifestForgeries(t *testing.T) {
	c := newChain(t)
	raw, err := c.root.Manifest(manifest())
	if err != nil {
		t.Fatal(err)
	}
	var good cose.Sign1Message
	if err := good.UnmarshalCBOR(raw); err != nil {
		t.Fatal(err)
	}
	payload := good.Payload

	// A gateway key the root certified: it may command every device, and
	// still cannot release an image, neither in its own name nor the root's.
	gwKey := newKey(t)
	cert, err := c.root.Certify([]byte("gw-a/1"), &gwKey.PublicKey, []string{"*"}, c.now.AddDate(0, 0, -1), c.now.AddDate(1, 0, 0), 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.trust.AddCertificate(cert); err != nil {
		t.Fatal(err)
	}
	gwAsItself, _ := auth.NewRoot([]byte("gw-a/1"), gwKey)
	gwAsRoot, _ := auth.NewRoot([]byte("operator"), gwKey)
	gwSigner, _ := auth.NewSigner([]byte("gw-a/1"), gwKey)
	devKey := newKey(t)
	devAsRoot, _ := auth.NewRoot([]byte("operator"), devKey)
	other := newChain(t) // another operator's root, same kid
	mustSign := func(r *auth.Root) []byte {
		b, err := r.Manifest(manifest())
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	cmd, err := gwSigner.Sign(env("dev-1", 9, 1))
	if err != nil {
		t.Fatal(err)
	}
	reset, _ := c.root.Reset(reset("dev-1", 812, 5))
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	_, edKey, _ := ed25519.GenerateKey(rand.Reader)
	hdr := func(ctype any) cose.ProtectedHeader {
		h := cose.ProtectedHeader{cose.HeaderLabelKeyID: []byte("operator")}
		if ctype != nil {
			h[cose.HeaderLabelContentType] = ctype
		}
		return h
	}
	for _, tc := range []struct {
		name string
		raw  []byte
		want error
	}{
		{"gateway key, its own kid", mustSign(gwAsItself), auth.ErrUnknownKey},
		{"gateway key under the root's kid", mustSign(gwAsRoot), auth.ErrBadSignature},
		{"device key under the root's kid", mustSign(devAsRoot), auth.ErrBadSignature},
		{"another operator's root", mustSign(other.root), auth.ErrBadSignature},
		{"a signed command", cmd, auth.ErrMalformed},
		{"a reset", reset, auth.ErrMalformed},
		{"a certificate", cert, auth.ErrMalformed},
		{"the manifest under no content type", sign1(t, cose.AlgorithmES256, c.rk, hdr(nil), payload), auth.ErrMalformed},
		{"the manifest as a reset", sign1(t, cose.AlgorithmES256, c.rk, hdr(auth.ContentReset), payload), auth.ErrMalformed},
		{"a numeric content type", sign1(t, cose.AlgorithmES256, c.rk, hdr(int64(60)), payload), auth.ErrMalformed},
		{"ES384", sign1(t, cose.AlgorithmES384, p384, hdr(auth.ContentManifest), payload), auth.ErrAlgorithm},
		{"EdDSA", sign1(t, cose.AlgorithmEdDSA, edKey, hdr(auth.ContentManifest), payload), auth.ErrAlgorithm},
		{"unsigned payload", payload, auth.ErrUnsigned},
		{"trailing bytes", append(append([]byte(nil), raw...), 0x00), auth.ErrMalformed},
		{"truncated", raw[:len(raw)-1], auth.ErrMalformed},
		{"oversized", append(append([]byte(nil), raw...), make([]byte, auth.MaxManifestSize)...), auth.ErrMalformed},
	} {
		m, err := c.trust.VerifyManifest(tc.raw)
		if m != nil || !errors.Is(err, tc.want) || !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("%s: %+v, %v; want %v", tc.name, m, err, tc.want)
		}
	}
	// Every single-bit flip is refused.
	for i := range len(raw) * 8 {
		b := append([]byte(nil), raw...)
		b[i/8] ^= 1 << (i % 8)
		if _, err := c.trust.VerifyManifest(b); !errors.Is(err, fence.ErrInvalid) {
			t.Fatalf("bit %d flipped: %v", i, err)
		}
	}
	// Nothing invalid is signed.
	long := manifest()
	long.Name = strings.Repeat("x", auth.MaxManifestName+1)
	for name, m := range map[string]auth.Manifest{
		"short hash": {Image: make([]byte, 31), Size: 1},
		"size 0":     {Image: make([]byte, 32)},
		"long name":  long,
		"control":    {Image: make([]byte, 32), Size: 1, Name: "a\nb"},
	} {
		if _, err := c.root.Manifest(m); !errors.Is(err, auth.ErrMalformed) {
			t.Errorf("signed a manifest with a %s: %v", name, err)
		}
	}
}

func FuzzVerifyManifest(f *testing.F) {
	c := newChain(f)
	good, err := c.root.Manifest(manifest())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add([]byte{0xd2, 0x84, 0x40, 0xa0, 0x40, 0x40})
	f.Fuzz(func(t *testing.T, raw []byte) {
		m, err := c.trust.VerifyManifest(raw)
		if err == nil && (m == nil || m.Validate() != nil) {
			t.Fatalf("accepted %+v", m)
		}
		if err != nil && !errors.Is(err, fence.ErrInvalid) {
			t.Fatalf("refusal does not wrap fence.ErrInvalid: %v", err)
		}
		if p, err := auth.PeekManifest(raw); err == nil && p == nil {
			t.Fatal("PeekManifest: nil without an error")
		}
	})
}
