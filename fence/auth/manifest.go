package auth

import (
	"crypto/sha256"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/veraison/go-cose"
)

// An image manifest is the operator's statement that a firmware image may
// be installed: its SHA-256, size and security version, signed by the
// operator's root key. The device checks it (its fence point holds the root
// when it is provisioned with a trust root), so a gateway — even one with a
// valid gateway certificate, even a compromised one — cannot install an
// image the operator did not release: a gateway key is never the root, and
// a manifest names the exact bytes. It is a COSE_Sign1 by the root (ES256,
// the root's kid and the content type ContentManifest protected), payload
// deterministic CBOR:
//
//	1 image SHA-256 (32 bytes)   2 size (uint ≥ 1)   3 security version (uint)
//	4 name (text, ≤ 64 bytes, optional)   5 issued, unix milliseconds (information only)

// ContentManifest is the content type of an image manifest.
const ContentManifest = "application/edgefence-manifest+cbor"

// Limits of a manifest.
const (
	// MaxManifestSize bounds a manifest on the wire (a real one is under
	// 300 bytes).
	MaxManifestSize = 1 << 10
	// MaxManifestName bounds Manifest.Name (bytes of UTF-8).
	MaxManifestName = 64
)

// Manifest is the payload of an image manifest.
type Manifest struct {
	Image   []byte `cbor:"1,keyasint"` // SHA-256, 32 bytes
	Size    uint64 `cbor:"2,keyasint"`
	Version uint64 `cbor:"3,keyasint"` // security version
	Name    string `cbor:"4,keyasint,omitempty"`
	Issued  int64  `cbor:"5,keyasint"` // unix milliseconds, information only
}

// Validate checks the manifest's fields; an error wraps fence.ErrInvalid
// and ErrMalformed.
func (m *Manifest) Validate() error {
	switch {
	case len(m.Image) != sha256.Size:
		return refuse(ErrMalformed, "manifest: image SHA-256 of %d bytes, want %d", len(m.Image), sha256.Size)
	case m.Size == 0:
		return refuse(ErrMalformed, "manifest: size 0")
	case len(m.Name) > MaxManifestName || !utf8.ValidString(m.Name) || strings.ContainsFunc(m.Name, unicode.IsControl):
		return refuse(ErrMalformed, "manifest: name must be up to %d bytes of text without control characters", MaxManifestName)
	}
	return nil
}

// Manifest returns the signed manifest m (validated first). The root key
// signs it: keep it offline.
func (root *Root) Manifest(m Manifest) ([]byte, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return root.sign(ContentManifest, m)
}

// ManifestVerifier checks an image manifest against the operator's root:
// *Trust and *RootKey implement it.
type ManifestVerifier interface {
	VerifyManifest(raw []byte) (*Manifest, error)
}

// VerifyManifest implements ManifestVerifier.
func (k *RootKey) VerifyManifest(raw []byte) (*Manifest, error) {
	return verifyManifest(raw, k.kid, k.v)
}

// VerifyManifest implements ManifestVerifier with the Trust's root.
func (t *Trust) VerifyManifest(raw []byte) (*Manifest, error) {
	return verifyManifest(raw, t.rootKid, t.root)
}

var (
	_ ManifestVerifier = (*RootKey)(nil)
	_ ManifestVerifier = (*Trust)(nil)
)

// verifyManifest checks raw: size, structure, content type, the root's
// kid, the signature, the payload. Every refusal wraps fence.ErrInvalid and
// a sentinel.
func verifyManifest(raw []byte, rootKid []byte, root cose.Verifier) (*Manifest, error) {
	var m Manifest
	msg, kid, err := openStatement(raw, MaxManifestSize, "manifest", ContentManifest, &m)
	if err != nil {
		return nil, err
	}
	if err := rootSigned(msg, kid, rootKid, root, "manifest"); err != nil {
		return nil, err
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

// PeekManifest returns the manifest raw claims to be, without checking its
// signature: for display. Never act on it.
func PeekManifest(raw []byte) (*Manifest, error) {
	var m Manifest
	if _, _, err := openStatement(raw, MaxManifestSize, "manifest", ContentManifest, &m); err != nil {
		return nil, err
	}
	return &m, nil
}
