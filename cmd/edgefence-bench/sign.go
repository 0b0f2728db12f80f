package main

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/internal/sandbox"
)

// signing is a bench world's trust chain with --sign (invariant I7), as a
// signed fleet runs: the operator's root, the agent's gateway key
// certified for every device, and a key per device whose certificate is in
// etcd. The agent then signs every command and checks every ack, the
// devices verify every command and sign every ack and state report.
type signing struct {
	kit     *sandbox.TrustKit
	gateway *sandbox.GatewayKey
	trust   *auth.Trust // the devices' trust: the root and the gateway's certificate
	devKeys string      // the enrolled devices' keys and certificates (TrustKit.DeviceKeys)
}

// newSigning makes the chain in dir/trust for the gateway named gw.
func newSigning(dir, gw string) (*signing, error) {
	kit, err := sandbox.NewTrustKit(filepath.Join(dir, "trust"))
	if err != nil {
		return nil, err
	}
	s := &signing{kit: kit}
	if s.gateway, err = kit.Gateway(gw, "*"); err != nil {
		return nil, err
	}
	if s.trust, err = kit.Trust(); err != nil {
		return nil, err
	}
	return s, nil
}

// authConfig is the agent config's auth section.
func (s *signing) authConfig() agent.AuthConfig {
	return gatewayAuth(s.gateway)
}

// gatewayAuth is the auth section of an agent config for g.
func gatewayAuth(g *sandbox.GatewayKey) agent.AuthConfig {
	return agent.AuthConfig{KeyFile: g.KeyFile, KeyID: g.KeyID, Certificate: g.Certificate, TrustRoot: g.TrustRoot, TrustRootKID: g.TrustRootKID}
}

// authYAML is a's auth section as a config file's YAML.
func authYAML(a agent.AuthConfig) string {
	return fmt.Sprintf("auth:\n  key_file: %q\n  key_id: %q\n  certificate: %q\n  trust_root: %q\n  trust_root_kid: %q\n",
		a.KeyFile, a.KeyID, a.Certificate, a.TrustRoot, a.TrustRootKID)
}

// requester is what a bare requester needs to sign as this gateway and
// verify the enrolled devices' acks (the fan-out's signed baseline).
func (s *signing) requester() *bareSign {
	return &bareSign{KeyFile: s.gateway.KeyFile, KeyID: s.gateway.KeyID, RootPub: s.kit.RootPub(), RootKID: s.kit.RootKID, DeviceKeys: s.devKeys}
}

// enrol makes devs' keys, publishes their certificates in the etcd at
// endpoints under the agent's etcd prefix, and returns what the devices
// run with.
func (s *signing) enrol(ctx context.Context, endpoints []string, etcdPrefix string, devs []string) (fleetAuth, error) {
	dir, certs, err := s.kit.DeviceKeys(devs...)
	if err != nil {
		return fleetAuth{}, err
	}
	s.devKeys = dir
	if err := sandbox.PublishDevices(ctx, endpoints, etcdPrefix, certs); err != nil {
		return fleetAuth{}, err
	}
	signers, err := s.kit.DeviceSigners(devs...)
	if err != nil {
		return fleetAuth{}, err
	}
	return fleetAuth{keys: s.trust, signers: signers}, nil
}

// fleetAuth is what simulated devices verify commands with and sign acks
// and state reports with; the zero value: plain envelopes both ways.
type fleetAuth struct {
	keys    auth.Keys
	signers map[string]*auth.Signer
}

// signWorld, with sign, makes the chain under dir for cfg's agent, sets
// cfg's auth section and enrols its devices; without, the zero fleetAuth.
func signWorld(ctx context.Context, sign bool, dir string, cfg *agent.Config) (fleetAuth, error) {
	if !sign {
		return fleetAuth{}, nil
	}
	s, err := newSigning(dir, cfg.Gateway)
	if err != nil {
		return fleetAuth{}, fmt.Errorf("sign: %w", err)
	}
	cfg.Auth = s.authConfig()
	devs := make([]string, len(cfg.Devices))
	for i, d := range cfg.Devices {
		devs[i] = d.ID
		cfg.Devices[i].Auth = agent.AuthRequired
	}
	return s.enrol(ctx, cfg.Etcd.Endpoints, cfg.Etcd.Prefix, devs)
}

// clusterTrust is the cluster benchmark's trust chain with --sign: the
// operator's root, a key and certificate per agent (the same across its
// restarts) and a key per device, whose certificates are in etcd. The
// devsim processes get the root and their device keys only: a gateway's
// certificate reaches a device as the trust update the agent publishes
// when it acquires it, so a takeover's updates are part of its time.
type clusterTrust struct {
	kit      *sandbox.TrustKit
	devKeys  string
	gateways map[string]agent.AuthConfig
}

// newClusterTrust makes the chain in dir/trust, enrols devs and publishes
// their certificates in the etcd at endpoints under prefix.
func newClusterTrust(ctx context.Context, dir string, endpoints []string, prefix string, devs []string) (*clusterTrust, error) {
	kit, err := sandbox.NewTrustKit(filepath.Join(dir, "trust"))
	if err != nil {
		return nil, fmt.Errorf("sign: %w", err)
	}
	devKeys, certs, err := kit.DeviceKeys(devs...)
	if err != nil {
		return nil, fmt.Errorf("sign: %w", err)
	}
	if err := sandbox.PublishDevices(ctx, endpoints, prefix, certs); err != nil {
		return nil, fmt.Errorf("sign: %w", err)
	}
	return &clusterTrust{kit: kit, devKeys: devKeys, gateways: map[string]agent.AuthConfig{}}, nil
}

// devsimArgs are edgefence-devsim's flags for the root and the device keys
// (none for a nil t: unsigned).
func (t *clusterTrust) devsimArgs() []string {
	if t == nil {
		return nil
	}
	return []string{"--trust-root", t.kit.RootPub(), "--trust-root-kid", t.kit.RootKID, "--device-keys", t.devKeys}
}

// auth returns gw's auth section, its key and a certificate for every
// device made at the first call; nil for a nil t (unsigned).
func (t *clusterTrust) auth(gw string) (*agent.AuthConfig, error) {
	if t == nil {
		return nil, nil
	}
	a, ok := t.gateways[gw]
	if !ok {
		g, err := t.kit.Gateway(gw, "*")
		if err != nil {
			return nil, fmt.Errorf("sign: %w", err)
		}
		a = gatewayAuth(g)
		t.gateways[gw] = a
	}
	return &a, nil
}
