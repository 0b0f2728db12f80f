package main

import (
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
)

// Who answers a reset delivered with --config, and how its ack is read:
// an `auth: off` device's plainly (a signed one unverified, as the agent
// reads it); any other's only if a key that may speak for the device
// signed it — its own key, enrolled at <prefix>/trust/devices/<device>,
// or for a `fence: gateway` device its home gateway's (auth.GatewayAcks:
// <prefix>/trust/certs/ and the config's auth.certificate) — anchored at
// the config's auth.trust_root, and only if it answers this reset (device,
// reset id, token, seq: auth.BoundTo).

// resetTarget is what the config says of the device a reset is for.
type resetTarget struct {
	authOff, gateway bool
}

// deviceOf looks dev up in the config: its auth and fence point; a device
// the config does not list is taken as the config's default (auth:
// required with a signing key, else off) behind a fence of its own.
func deviceOf(c *agent.Config, dev string) resetTarget {
	for _, d := range c.Devices {
		if d.ID == dev {
			return resetTarget{authOff: d.Auth == agent.AuthOff, gateway: d.Fence == agent.FenceGateway}
		}
	}
	return resetTarget{authOff: c.Auth.KeyFile == ""}
}

// etcd dials the config's etcd once.
func (f *resetFlags) etcd() (*clientv3.Client, error) {
	if f.cli != nil {
		return f.cli, nil
	}
	c := f.deliverCfg
	t := &etcdTarget{endpoints: c.Etcd.Endpoints, prefix: c.Etcd.Prefix, cfg: c.Etcd}
	cli, err := t.dial()
	if err != nil {
		return nil, err
	}
	f.cli = cli
	return cli, nil
}

// ackCheck returns how the ack of r is read at the device.
func (f *resetFlags) ackCheck(r *auth.Reset) (func(raw []byte) (*fence.Ack, error), error) {
	d := deviceOf(f.deliverCfg, r.Device)
	if d.authOff {
		return auth.ClaimedAck, nil
	}
	if f.trust == nil {
		return nil, fmt.Errorf("%s signs its acks (auth: required), and the config has no auth.trust_root to verify them against: set it, or auth: off for the device", r.Device)
	}
	if err := f.readCertificates(r.Device, d.gateway); err != nil {
		return nil, err
	}
	var keys auth.DeviceKeys = f.trust
	if d.gateway {
		keys = auth.GatewayAcks{Keys: f.trust}
	}
	bound := &fence.Envelope{Device: r.Device, ID: r.ID, Token: r.Token, Seq: r.Seq}
	return func(raw []byte) (*fence.Ack, error) {
		v, err := auth.VerifyAck(raw, keys)
		if err != nil {
			return nil, err
		}
		if err := auth.BoundTo(v.Ack, bound); err != nil {
			return nil, err
		}
		return v.Ack, nil
	}, nil
}

// readCertificates takes into f.trust the certificates that may speak for
// dev from etcd (the device's own; for a `fence: gateway` device the
// gateways') and the revocation list.
func (f *resetFlags) readCertificates(dev string, gateway bool) error {
	cli, err := f.etcd()
	if err != nil {
		return fmt.Errorf("read %s's certificate from etcd: %w", dev, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
	defer cancel()
	prefix := f.deliverCfg.Etcd.Prefix
	key, certs := agent.TrustDeviceKey(prefix, dev), clientv3.OpGet(agent.TrustDeviceKey(prefix, dev))
	if gateway {
		key = agent.TrustCertKey(prefix, "")
		certs = clientv3.OpGet(key, clientv3.WithPrefix(), clientv3.WithLimit(1024))
	}
	resp, err := cli.Txn(ctx).Then(certs, clientv3.OpGet(agent.TrustRevocationsKey(prefix))).Commit()
	if err != nil {
		return fmt.Errorf("read %s's certificate from etcd: %w", dev, err)
	}
	added := 0
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		if _, err := f.trust.AddCertificate(kv.Value); err != nil {
			fmt.Fprintf(f.stderr, "edgefence fence reset: certificate at %s refused: %v\n", kv.Key, err)
			continue
		}
		added++
	}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		if err := f.trust.ApplyRevocations(kv.Value); err != nil && !errors.Is(err, auth.ErrStaleTrust) {
			fmt.Fprintf(f.stderr, "edgefence fence reset: revocation list at %s refused: %v\n", kv.Key, err)
		}
	}
	if added == 0 && !gateway {
		return fmt.Errorf("%s signs its acks (auth: required) and etcd has no certificate for it at %s: enrol it (edgefence keys enrol)", dev, key)
	}
	return nil
}

// defaultEpoch is the reset's epoch when --epoch is not given: the current
// Unix time in milliseconds, or one above the highest epoch the root's
// statements in etcd name (the fleet's, the device's last reset) if that
// is higher. Without etcd to read (or a trust root to verify what it
// holds), the clock alone, said on stderr.
func (f *resetFlags) defaultEpoch() (uint64, error) {
	var highest uint64
	if f.deliverCfg != nil && f.trust != nil {
		cli, err := f.etcd()
		if err == nil {
			highest, err = highestEpoch(cli, f.trust, f.deliverCfg.Etcd.Prefix, f.device)
		}
		if err != nil {
			fmt.Fprintf(f.stderr, "edgefence fence reset: the epochs in etcd not read (%v): the epoch is the clock's\n", err)
		}
	}
	return nextEpoch(f.now(), highest)
}
