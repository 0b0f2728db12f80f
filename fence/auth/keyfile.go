package auth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
)

// NewKey returns a new ES256 (P-256) private key.
func NewKey() (*ecdsa.PrivateKey, error) {
	return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
}

// WriteKeyPair writes key as prefix.key (PKCS#8 PEM, mode 0600) and its
// public key as prefix.pub (PKIX PEM). It refuses to overwrite either.
func WriteKeyPair(prefix string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	pub, err := EncodePublic(&key.PublicKey)
	if err != nil {
		return err
	}
	if err := writeNew(prefix+".key", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return err
	}
	if err := writeNew(prefix+".pub", pub, 0o644); err != nil {
		os.Remove(prefix + ".key")
		return err
	}
	return nil
}

// EncodePublic returns pub as PKIX PEM (what ReadPublic reads).
func EncodePublic(pub *ecdsa.PublicKey) ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), nil
}

// writeNew writes b to a file that must not exist, fsynced.
func writeNew(path string, b []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("auth: write %s: %w", path, err)
	}
	return nil
}

// ReadKey reads a PKCS#8 PEM P-256 private key.
func ReadKey(path string) (*ecdsa.PrivateKey, error) {
	der, err := readPEM(path, "PRIVATE KEY")
	if err != nil {
		return nil, err
	}
	k, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return nil, fmt.Errorf("auth: %s: %w", path, err)
	}
	ek, ok := k.(*ecdsa.PrivateKey)
	if !ok || ek.Curve != elliptic.P256() {
		return nil, fmt.Errorf("auth: %s: not an ECDSA P-256 key", path)
	}
	return ek, nil
}

// ReadPublic reads a PKIX PEM P-256 public key.
func ReadPublic(path string) (*ecdsa.PublicKey, error) {
	der, err := readPEM(path, "PUBLIC KEY")
	if err != nil {
		return nil, err
	}
	k, err := x509.ParsePKIXPublicKey(der)
	if err != nil {
		return nil, fmt.Errorf("auth: %s: %w", path, err)
	}
	ek, ok := k.(*ecdsa.PublicKey)
	if !ok || ek.Curve != elliptic.P256() {
		return nil, fmt.Errorf("auth: %s: not an ECDSA P-256 key", path)
	}
	return ek, nil
}

func readPEM(path, typ string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != typ {
		return nil, fmt.Errorf("auth: %s: %w", path, errors.New("want a PEM "+typ+" block"))
	}
	return blk.Bytes, nil
}

// ParseCertificate decodes a certificate's payload without checking its
// signature (for display; Trust.AddCertificate is the check).
func ParseCertificate(raw []byte) (*Certificate, error) {
	var c Certificate
	if err := parseUnverified(raw, ContentCertificate, &c); err != nil {
		return nil, err
	}
	return &c, nil
}

// ParseRevocations decodes a revocation list without checking its
// signature (for display; Trust.ApplyRevocations is the check).
func ParseRevocations(raw []byte) (*Revocations, error) {
	var r Revocations
	if err := parseUnverified(raw, ContentRevocations, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

func parseUnverified(raw []byte, ctype string, v any) error {
	if len(raw) > MaxTrustSize {
		return refuse(ErrMalformed, "%d bytes, limit %d", len(raw), MaxTrustSize)
	}
	msg, _, got, err := decodeSign1(raw)
	if err != nil {
		return err
	}
	if got != ctype {
		return refuse(ErrMalformed, "statement of content type %q, want %q", got, ctype)
	}
	if err := trustDec.Unmarshal(msg.Payload, v); err != nil {
		return refuse(ErrMalformed, "payload: %v", err)
	}
	return nil
}
