package auth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/fxamacker/cbor/v2"
	"github.com/veraison/go-cose"
)

// The trust chain a fence point checks offline: the operator's root key is
// provisioned on it; a gateway key is certified by the root (a
// Certificate: the key, the devices it may command, a validity window);
// revocations come as a signed, versioned list whose version only goes up.
// Certificates and revocation lists are COSE_Sign1 messages signed by the
// root (ES256, the root's kid protected), payloads in deterministic CBOR
// with small integer keys, as envelopes are. Each names what it is in a
// protected content type (COSE header 3, text: ContentCertificate,
// ContentRevocations), so a statement of one kind is never read as another.

// Errors of the trust chain; each wraps fence.ErrInvalid, as Verify's.
var (
	ErrExpired    = errors.New("auth: certificate not valid now")
	ErrStaleTrust = errors.New("auth: revocation list not newer than the one held")
)

// Certificate is the operator's statement that a gateway key may command
// some devices for a while.
type Certificate struct {
	KeyID     []byte           `cbor:"1,keyasint"`
	Key       coseKey          `cbor:"2,keyasint"`
	Devices   []string         `cbor:"3,keyasint"` // device ids; "prefix*" covers every id with the prefix; "*" all
	NotBefore int64            `cbor:"4,keyasint"` // Unix seconds
	NotAfter  int64            `cbor:"5,keyasint"` // Unix seconds
	Serial    uint64           `cbor:"6,keyasint"`
	Role      Role             `cbor:"7,keyasint,omitempty"` // RoleGateway (absent) or RoleDevice
	pub       *ecdsa.PublicKey `cbor:"-"`
	raw       []byte           `cbor:"-"` // the signed statement, for Trust.Statements
}

// coseKey is an EC2 P-256 public key as COSE_Key (RFC 9052 §7, RFC 9053 §7.1).
type coseKey struct {
	Kty int64  `cbor:"1,keyasint"`  // 2: EC2
	Crv int64  `cbor:"-1,keyasint"` // 1: P-256
	X   []byte `cbor:"-2,keyasint"`
	Y   []byte `cbor:"-3,keyasint"`
}

func newCoseKey(pub *ecdsa.PublicKey) (coseKey, error) {
	b, err := pub.Bytes() // 0x04 || X || Y
	if err != nil || len(b) != 65 {
		return coseKey{}, fmt.Errorf("auth: public key: %v", err)
	}
	return coseKey{Kty: 2, Crv: 1, X: b[1:33], Y: b[33:]}, nil
}

func (k coseKey) public() (*ecdsa.PublicKey, error) {
	if k.Kty != 2 || k.Crv != 1 || len(k.X) != 32 || len(k.Y) != 32 {
		return nil, errors.New("want an EC2 P-256 key with 32-byte coordinates")
	}
	return ecdsa.ParseUncompressedPublicKey(elliptic.P256(), append(append([]byte{4}, k.X...), k.Y...)) // refuses a point off the curve
}

// covers reports whether the certificate names device.
func (c *Certificate) covers(device string) bool {
	for _, d := range c.Devices {
		if d == device || strings.HasSuffix(d, "*") && strings.HasPrefix(device, strings.TrimSuffix(d, "*")) {
			return true
		}
	}
	return false
}

// Revocations is the operator's list of revoked gateway key ids, versioned.
type Revocations struct {
	Version uint64   `cbor:"1,keyasint"`
	KeyIDs  [][]byte `cbor:"2,keyasint"`
	Issued  int64    `cbor:"3,keyasint"` // Unix seconds, information only
}

var (
	trustEnc = func() cbor.EncMode {
		m, err := cbor.CoreDetEncOptions().EncMode()
		if err != nil {
			panic(err)
		}
		return m
	}()
	trustDec = func() cbor.DecMode {
		m, err := cbor.DecOptions{
			DupMapKey:         cbor.DupMapKeyEnforcedAPF,
			IndefLength:       cbor.IndefLengthForbidden,
			TagsMd:            cbor.TagsForbidden,
			MaxNestedLevels:   4,
			MaxArrayElements:  4096,
			MaxMapPairs:       16,
			ExtraReturnErrors: cbor.ExtraDecErrorUnknownField,
		}.DecMode()
		if err != nil {
			panic(err)
		}
		return m
	}()
)

// Content types of root-signed statements (the protected COSE content type).
const (
	ContentCertificate = "application/edgefence-cert+cbor"
	ContentRevocations = "application/edgefence-revocations+cbor"
)

// MaxTrustSize bounds a certificate or revocation list on the wire.
const MaxTrustSize = 64 << 10

// Root signs certificates and revocation lists: the operator's key.
type Root struct{ s *Signer }

// NewRoot returns the operator's signer for trust statements.
func NewRoot(kid []byte, key *ecdsa.PrivateKey) (*Root, error) {
	s, err := NewSigner(kid, key)
	if err != nil {
		return nil, err
	}
	return &Root{s}, nil
}

// sign returns v as a root-signed statement of content type ctype.
func (r *Root) sign(ctype string, v any) ([]byte, error) {
	payload, err := trustEnc.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	return r.s.signContent(ctype, payload)
}

// Certify returns a certificate for a gateway key (RoleGateway).
func (r *Root) Certify(kid []byte, pub *ecdsa.PublicKey, devices []string, notBefore, notAfter time.Time, serial uint64) ([]byte, error) {
	if len(kid) == 0 || len(kid) > MaxKeyID || pub == nil || pub.Curve != elliptic.P256() || len(devices) == 0 || !notAfter.After(notBefore) {
		return nil, errors.New("auth: certify: want a kid, a P-256 key, devices and a validity window")
	}
	key, err := newCoseKey(pub)
	if err != nil {
		return nil, err
	}
	return r.sign(ContentCertificate, Certificate{KeyID: kid, Key: key, Devices: devices, NotBefore: notBefore.Unix(), NotAfter: notAfter.Unix(), Serial: serial})
}

// Revoke returns a signed revocation list.
func (r *Root) Revoke(version uint64, kids [][]byte, issued time.Time) ([]byte, error) {
	return r.sign(ContentRevocations, Revocations{Version: version, KeyIDs: kids, Issued: issued.Unix()})
}

// Trust is a fence point's view of the trust chain: the root's public key,
// the certificates it has seen, the newest revocation list, the newest
// epoch statement (epoch.go). It implements
// Keys. Its methods are safe for concurrent use.
type Trust struct {
	rootKid []byte
	root    cose.Verifier
	now     func() time.Time

	mu       sync.Mutex
	certs    map[string]*Certificate
	revoked  map[string]bool
	version  uint64
	revRaw   []byte // the revocation list held, as received
	epoch    uint64 // the newest epoch statement's (epoch.go)
	epochRaw []byte // and the statement, as received
}

// NewTrust returns a Trust anchored at the operator's root key. now is the
// clock certificates are checked against (nil: time.Now).
func NewTrust(rootKid []byte, root *ecdsa.PublicKey, now func() time.Time) (*Trust, error) {
	if root == nil || root.Curve != elliptic.P256() {
		return nil, errors.New("auth: root key must be ECDSA P-256")
	}
	v, err := cose.NewVerifier(cose.AlgorithmES256, root)
	if err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	if now == nil {
		now = time.Now
	}
	return &Trust{rootKid: append([]byte(nil), rootKid...), root: v, now: now, certs: map[string]*Certificate{}, revoked: map[string]bool{}}, nil
}

// open verifies a root-signed statement of content type ctype and decodes
// its payload into v.
func (t *Trust) open(raw []byte, ctype string, v any) error {
	got, payload, err := t.verifyStatement(raw)
	if err != nil {
		return err
	}
	if got != ctype {
		return refuse(ErrMalformed, "statement of content type %q, want %q", got, ctype)
	}
	if err := trustDec.Unmarshal(payload, v); err != nil {
		return refuse(ErrMalformed, "trust statement payload: %v", err)
	}
	return nil
}

// verifyStatement verifies a statement signed by the root and returns its
// content type and payload.
func (t *Trust) verifyStatement(raw []byte) (ctype string, payload []byte, err error) {
	if len(raw) > MaxTrustSize {
		return "", nil, refuse(ErrMalformed, "trust statement of %d bytes, limit %d", len(raw), MaxTrustSize)
	}
	msg, kid, ctype, err := decodeSign1(raw)
	if err != nil {
		return "", nil, err
	}
	if string(kid) != string(t.rootKid) {
		return "", nil, refuse(ErrUnknownKey, "statement signed by %x, not the root %x", kid, t.rootKid)
	}
	if err := msg.Verify(nil, t.root); err != nil {
		return "", nil, refuse(ErrBadSignature, "trust statement")
	}
	return ctype, msg.Payload, nil
}

// decodeCertificate decodes and checks a verified certificate's payload.
func decodeCertificate(payload []byte) (*Certificate, error) {
	var c Certificate
	if err := trustDec.Unmarshal(payload, &c); err != nil {
		return nil, refuse(ErrMalformed, "certificate payload: %v", err)
	}
	pub, err := c.Key.public()
	if err != nil {
		return nil, refuse(ErrMalformed, "certificate key: %v", err)
	}
	if len(c.KeyID) == 0 || len(c.KeyID) > MaxKeyID || len(c.Devices) == 0 || c.NotAfter <= c.NotBefore {
		return nil, refuse(ErrMalformed, "certificate: want a kid, devices and a validity window")
	}
	if err := c.Role.check(c.Devices); err != nil {
		return nil, refuse(ErrMalformed, "certificate: %v", err)
	}
	c.pub = pub
	return &c, nil
}

// AddCertificate verifies a root-signed certificate and keeps it (a newer
// serial for the same key id replaces an older one; an older one is
// ignored). It returns the certificate.
func (t *Trust) AddCertificate(raw []byte) (*Certificate, error) {
	ctype, payload, err := t.verifyStatement(raw)
	if err != nil {
		return nil, err
	}
	if ctype != ContentCertificate {
		return nil, refuse(ErrMalformed, "statement of content type %q, want %q", ctype, ContentCertificate)
	}
	c, err := decodeCertificate(payload)
	if err != nil {
		return nil, err
	}
	c.raw = raw
	if err := t.Adopt(&Statement{Raw: raw, Content: ctype, Certificate: c}); err != nil && !errors.Is(err, ErrStaleTrust) {
		return nil, err
	}
	return c, nil
}

// ApplyRevocations verifies a root-signed revocation list and adopts it if
// its version is above the one held (ErrStaleTrust otherwise: a replayed
// older list cannot un-revoke a key).
func (t *Trust) ApplyRevocations(raw []byte) error {
	var r Revocations
	if err := t.open(raw, ContentRevocations, &r); err != nil {
		return err
	}
	return t.Adopt(&Statement{Raw: raw, Content: ContentRevocations, Revocations: &r})
}

// Version is the version of the revocation list held (0: none).
func (t *Trust) Version() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.version
}

// Key implements Keys: the certified gateway key kid, if it is not
// revoked, valid now, and covers device. A device key (RoleDevice) is
// refused (ErrWrongRole): a stolen device cannot command anything.
func (t *Trust) Key(kid []byte, device string) (*ecdsa.PublicKey, error) {
	return t.lookup(kid, device, RoleGateway)
}

// lookup returns the key kid if its certificate is of role, not revoked,
// valid now and covers device.
func (t *Trust) lookup(kid []byte, device string, role Role) (*ecdsa.PublicKey, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := t.certs[string(kid)]
	switch {
	case c == nil:
		return nil, refuse(ErrUnknownKey, "no certificate for %x", kid)
	case c.Role != role:
		return nil, refuse(ErrWrongRole, "%x is a %s key, not a %s key", kid, c.Role, role)
	case t.revoked[string(kid)]:
		return nil, refuse(ErrRevoked, "%x (revocation list %d)", kid, t.version)
	}
	if now := t.now().Unix(); now < c.NotBefore || now >= c.NotAfter {
		return nil, refuse(ErrExpired, "%x valid %s to %s", kid, time.Unix(c.NotBefore, 0).UTC(), time.Unix(c.NotAfter, 0).UTC())
	}
	if !c.covers(device) {
		return nil, refuse(ErrNotAuthorised, "%x may not %s %s", kid, role.verb(), device)
	}
	return c.pub, nil
}

var _ Keys = (*Trust)(nil)
