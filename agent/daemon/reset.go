package daemon

import (
	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/fence/auth"
)

// resetRoot returns the operator's root key (auth.trust_root and
// auth.trust_root_kid) with which this gateway's fence table checks the
// operator's fence resets; nil without one (resets are refused).
func resetRoot(c agent.AuthConfig) (auth.ResetVerifier, error) {
	if c.TrustRoot == "" {
		return nil, nil
	}
	pub, err := auth.ReadPublic(c.TrustRoot)
	if err != nil {
		return nil, err
	}
	return auth.NewRootKey([]byte(c.TrustRootKID), pub)
}
