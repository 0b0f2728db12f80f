package daemon

import (
	"fmt"
	"os"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/fence/auth"
)

// trustUpdates returns what the agent publishes to its `auth: required`
// devices (agent.TrustUpdates) from auth.certificate, auth.revocations
// and auth.trust_root; nil without a certificate. With a trust root, the
// certificate and the list are verified against it here (a start with a
// certificate or list the root did not sign fails) and the list in etcd
// is followed.
func trustUpdates(a agent.AuthConfig, pub agent.TrustPublisher) (*agent.TrustUpdates, error) {
	if a.Certificate == "" {
		return nil, nil
	}
	tu := &agent.TrustUpdates{Publisher: pub}
	var err error
	if tu.Certificate, err = os.ReadFile(a.Certificate); err != nil {
		return nil, fmt.Errorf("auth.certificate: %w", err)
	}
	if a.Revocations != "" {
		if tu.Revocations, err = os.ReadFile(a.Revocations); err != nil {
			return nil, fmt.Errorf("auth.revocations: %w", err)
		}
	}
	if a.TrustRoot == "" {
		return tu, nil
	}
	root, err := auth.ReadPublic(a.TrustRoot)
	if err != nil {
		return nil, fmt.Errorf("auth.trust_root: %w", err)
	}
	if tu.Trust, err = auth.NewTrust([]byte(a.TrustRootKID), root, nil); err != nil {
		return nil, fmt.Errorf("auth.trust_root: %w", err)
	}
	c, err := tu.Trust.AddCertificate(tu.Certificate)
	if err != nil {
		return nil, fmt.Errorf("auth.certificate %s: %w", a.Certificate, err)
	}
	if string(c.KeyID) != a.KeyID {
		return nil, fmt.Errorf("auth.certificate %s certifies key %q, not auth.key_id %q", a.Certificate, c.KeyID, a.KeyID)
	}
	return tu, nil
}
