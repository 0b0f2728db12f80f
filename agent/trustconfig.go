package agent

import (
	"fmt"
	"time"

	"github.com/edgefence/edgefence/fence/auth"
)

// The operator's trust chain as the auth section names it (invariant I7):
// the one place the agent reads auth.trust_root, auth.certificate and
// auth.revocations. Errors are config errors naming the key.

// RootTrust returns an auth.Trust anchored at auth.trust_root (with
// auth.trust_root_kid) and nothing else yet, checking certificates against
// now (nil: time.Now); nil, nil without a trust root.
func (a AuthConfig) RootTrust(now func() time.Time) (*auth.Trust, error) {
	if a.TrustRoot == "" {
		return nil, nil
	}
	pub, err := auth.ReadPublic(a.TrustRoot)
	if err != nil {
		return nil, fmt.Errorf("%w: auth.trust_root: %w", ErrConfig, err)
	}
	t, err := auth.NewTrust([]byte(a.TrustRootKID), pub, now)
	if err != nil {
		return nil, fmt.Errorf("%w: auth.trust_root: %w", ErrConfig, err)
	}
	return t, nil
}

// OperatorTrust is RootTrust with this gateway's own certificate
// (auth.certificate) and the revocation list (auth.revocations) taken in,
// each verified against the root; nil, nil without a trust root.
func (a AuthConfig) OperatorTrust(now func() time.Time) (*auth.Trust, error) {
	t, err := a.RootTrust(now)
	if t == nil || err != nil {
		return nil, err
	}
	if a.Certificate != "" {
		if _, err := t.AddCertificateFile(a.Certificate); err != nil {
			return nil, fmt.Errorf("%w: auth.certificate: %w", ErrConfig, err)
		}
	}
	if a.Revocations != "" {
		if err := t.ApplyRevocationsFile(a.Revocations); err != nil {
			return nil, fmt.Errorf("%w: auth.revocations: %w", ErrConfig, err)
		}
	}
	return t, nil
}
