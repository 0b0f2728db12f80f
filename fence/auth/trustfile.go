package auth

import (
	"fmt"
	"os"
)

// AddCertificateFile reads a certificate file (`edgefence keys certify`)
// and adds it (AddCertificate); errors name the file.
func (t *Trust) AddCertificateFile(path string) (*Certificate, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	c, err := t.AddCertificate(raw)
	if err != nil {
		return nil, fmt.Errorf("auth: %s: %w", path, err)
	}
	return c, nil
}

// ApplyEpochFile reads an epoch statement file (`edgefence keys epoch`)
// and takes it in if it is newer than the one held (Apply); errors name
// the file.
func (t *Trust) ApplyEpochFile(path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	st, err := t.Check(raw)
	if err == nil && st.Epoch == nil {
		err = refuse(ErrMalformed, "statement of content type %q, want %q", st.Content, ContentEpoch)
	}
	if err == nil {
		err = t.Adopt(st)
	}
	if err != nil {
		return fmt.Errorf("auth: %s: %w", path, err)
	}
	return nil
}

// ApplyRevocationsFile reads a revocation list file (`edgefence keys
// revoke`) and applies it (ApplyRevocations); errors name the file.
func (t *Trust) ApplyRevocationsFile(path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	if err := t.ApplyRevocations(raw); err != nil {
		return fmt.Errorf("auth: %s: %w", path, err)
	}
	return nil
}
