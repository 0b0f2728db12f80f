package daemon

import (
	"log/slog"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// MQTTClientConfig is the MQTT client configuration the agent would use
// for c (brokers, credentials, TLS, limits), for a command that talks to
// the broker itself (edgefence fence reset). Give it a client id of its own.
func MQTTClientConfig(c agent.MQTTConfig, log *slog.Logger) (mqtt.Config, error) {
	return mqttConfig(c, log)
}

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
