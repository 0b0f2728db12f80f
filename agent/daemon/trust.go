package daemon

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// The gateway's part of invariant I7: which commands it signs (per device,
// `auth: required` or `auth: off`), and the operator's trust its own fence
// table checks commands against.

// TrustFile is the name of the agent's trust store in its state
// directory: the statements of the operator's root it has verified
// (agent.Options.TrustDB).
const TrustFile = "trust.db"

// gatewayTrust is the one place the daemon builds its view of the
// operator's trust chain: the root of auth.trust_root and
// auth.trust_root_kid, this gateway's own certificate (auth.certificate)
// and the newest revocation list (auth.revocations). It is nil without a
// trust root. The gateway fence verifies the commands for its `auth:
// required` devices against it (bridge.Config.Keys); trust updates extend
// it as they arrive. A file that cannot be read or does not verify is a
// config error naming its key.
func gatewayTrust(a agent.AuthConfig) (*auth.Trust, error) { return a.OperatorTrust(nil) }

// authOffDevices returns the devices whose policy is `auth: off`, in
// config order.
func authOffDevices(cfg *agent.Config) []string {
	var off []string
	for _, d := range cfg.Devices {
		if d.Auth == agent.AuthOff {
			off = append(off, d.ID)
		}
	}
	return off
}

// signCommands makes cmdr sign the commands to the `auth: required`
// devices with signer (nil: no signing key, every device is `auth: off`)
// and logs the policy: which key signs, and one WARN naming the devices
// whose commands go unsigned.
func signCommands(cmdr *mqtt.Commander, signer *auth.Signer, cfg *agent.Config, log *slog.Logger) {
	off := authOffDevices(cfg)
	if signer != nil {
		cmdr.SignWith(signer.Sign, off...) // signed envelopes (I7), plain to auth: off devices
		log.Info("commands are signed", "key_id", cfg.Auth.KeyID, "devices", len(cfg.Devices)-len(off))
	}
	if len(off) > 0 {
		log.Warn("auth: off: commands to these devices go unsigned, and a broker client can forge theirs (set a signing key and auth: required)",
			"devices", off, "count", len(off))
	}
}

// trustUpdates returns what the agent publishes to its `auth: required`
// devices (agent.TrustUpdates) from auth.certificate, auth.revocations
// and auth.trust_root; nil without a certificate. With a trust root, the
// certificate is verified against it here (a start with a certificate the
// root did not sign fails); the agent verifies the lists and follows
// etcd's.
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
	root, err := a.RootTrust(nil)
	if err != nil {
		return nil, err
	}
	c, err := root.AddCertificate(tu.Certificate)
	if err != nil {
		return nil, fmt.Errorf("auth.certificate %s: %w", a.Certificate, err)
	}
	if string(c.KeyID) != a.KeyID {
		return nil, fmt.Errorf("auth.certificate %s certifies key %q, not auth.key_id %q", a.Certificate, c.KeyID, a.KeyID)
	}
	return tu, nil
}
