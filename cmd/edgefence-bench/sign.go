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
	g := s.gateway
	return agent.AuthConfig{KeyFile: g.KeyFile, KeyID: g.KeyID, Certificate: g.Certificate, TrustRoot: g.TrustRoot, TrustRootKID: g.TrustRootKID}
}

// enrol makes devs' keys, publishes their certificates in the etcd at
// endpoints under the agent's etcd prefix, and returns what the devices
// run with.
func (s *signing) enrol(ctx context.Context, endpoints []string, etcdPrefix string, devs []string) (fleetAuth, error) {
	_, certs, err := s.kit.DeviceKeys(devs...)
	if err != nil {
		return fleetAuth{}, err
	}
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
