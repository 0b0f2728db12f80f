package sandbox

import (
	"context"
	"crypto/ecdsa"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/edgefence/edgefence/fence/auth"
)

// TrustKit is an operator's trust chain for a sandbox world (invariant I7),
// as the files `edgefence keys` makes, in Dir: the operator's root key
// (root.key, root.pub), and per gateway its signing key (<gw>.key,
// <gw>.pub) and certificate (<gw>.cert), and revocation lists. The sandbox
// provisions it itself, so its runs are signed with nothing to set up.
type TrustKit struct {
	Dir     string
	RootKID string // the root key's id (RootTrustKID)

	root *auth.Root

	mu    sync.Mutex
	certs []string // certificate files issued, in order
}

// RootTrustKID is the sandbox operator key's id.
const RootTrustKID = "operator"

// trustValidity is how long a sandbox certificate is valid, from an hour
// before it was issued.
const trustValidity = 30 * 24 * time.Hour

// GatewayKey is one gateway's signing key and certificate as files, and
// the root it chains to: the agent config's auth section.
type GatewayKey struct {
	KeyFile, KeyID, Certificate string
	TrustRoot, TrustRootKID     string
	Revocations                 string // a revocation list (optional)
}

// NewTrustKit creates dir (if missing) and an operator root key in it, or
// takes the one an earlier run left there.
func NewTrustKit(dir string) (*TrustKit, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("sandbox: trust: %w", err)
	}
	key, err := keyPair(filepath.Join(dir, "root"))
	if err != nil {
		return nil, err
	}
	root, err := auth.NewRoot([]byte(RootTrustKID), key)
	if err != nil {
		return nil, err
	}
	return &TrustKit{Dir: dir, RootKID: RootTrustKID, root: root}, nil
}

// RootPub is the root public key's file.
func (k *TrustKit) RootPub() string { return filepath.Join(k.Dir, "root.pub") }

// Manifest returns the operator's signed manifest of an image (the root
// signs it): what fw.begin carries to a device provisioned with the root.
func (k *TrustKit) Manifest(m auth.Manifest) ([]byte, error) { return k.root.Manifest(m) }

// Gateway makes gateway's signing key (key id "<gateway>/1"; an earlier
// run's is taken again) and a new certificate for it that may command
// devices (ids, "prefix*" or "*").
func (k *TrustKit) Gateway(gateway string, devices ...string) (*GatewayKey, error) {
	return k.GatewayKey(gateway, 1, devices...)
}

// GatewayKey makes gateway's signing key number n (key id
// "<gateway>/<n>", files <gateway>.* for n = 1, <gateway>.<n>.* after; an
// earlier run's is taken again) and a new certificate for it of serial n:
// n > 1 is a key rotated in ("Rotate a gateway key with overlap").
func (k *TrustKit) GatewayKey(gateway string, n uint64, devices ...string) (*GatewayKey, error) {
	if len(devices) == 0 {
		return nil, errors.New("sandbox: trust: a gateway certificate names the devices it may command")
	}
	if n == 0 {
		return nil, errors.New("sandbox: trust: gateway keys are numbered from 1")
	}
	prefix := filepath.Join(k.Dir, gateway)
	if n > 1 {
		prefix += fmt.Sprintf(".%d", n)
	}
	key, err := keyPair(prefix)
	if err != nil {
		return nil, err
	}
	kid := fmt.Sprintf("%s/%d", gateway, n)
	now := time.Now()
	cert, err := k.root.Certify([]byte(kid), &key.PublicKey, devices, now.Add(-time.Hour), now.Add(trustValidity), n)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(prefix+".cert", cert, 0o644); err != nil {
		return nil, fmt.Errorf("sandbox: trust: %w", err)
	}
	k.mu.Lock()
	if !slices.Contains(k.certs, prefix+".cert") {
		k.certs = append(k.certs, prefix+".cert")
	}
	k.mu.Unlock()
	return &GatewayKey{KeyFile: prefix + ".key", KeyID: kid, Certificate: prefix + ".cert", TrustRoot: k.RootPub(), TrustRootKID: k.RootKID}, nil
}

// keyPair reads prefix.key, or makes a new key pair there (prefix.key,
// prefix.pub).
func keyPair(prefix string) (*ecdsa.PrivateKey, error) {
	if _, err := os.Stat(prefix + ".key"); err == nil {
		return auth.ReadKey(prefix + ".key")
	}
	key, err := auth.NewKey()
	if err != nil {
		return nil, err
	}
	if err := auth.WriteKeyPair(prefix, key); err != nil {
		return nil, err
	}
	return key, nil
}

// Revoke writes a revocation list of version naming the key ids kids to
// Dir/revocations-<version>, and returns its path.
func (k *TrustKit) Revoke(version uint64, kids ...string) (string, error) {
	var ids [][]byte
	for _, id := range kids {
		ids = append(ids, []byte(id))
	}
	raw, err := k.root.Revoke(version, ids, time.Now())
	if err != nil {
		return "", err
	}
	path := filepath.Join(k.Dir, fmt.Sprintf("revocations-%d", version))
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		return "", fmt.Errorf("sandbox: trust: %w", err)
	}
	return path, nil
}

// Certificates are the certificate files issued so far.
func (k *TrustKit) Certificates() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.certs...)
}

// DevsimArgs are edgefence-devsim's flags provisioning its devices with
// this trust: the root, every certificate issued so far and, if not "",
// the revocation list at revocations.
func (k *TrustKit) DevsimArgs(revocations string) []string {
	args := []string{"--trust-root", k.RootPub(), "--trust-root-kid", k.RootKID, "--certs", strings.Join(k.Certificates(), ",")}
	if revocations != "" {
		args = append(args, "--revocations", revocations)
	}
	return args
}

// Trust is a fence point's trust for in-process devices (sim.FleetConfig.
// Keys): the root and every certificate issued so far.
func (k *TrustKit) Trust() (*auth.Trust, error) {
	pub, err := auth.ReadPublic(k.RootPub())
	if err != nil {
		return nil, err
	}
	t, err := auth.NewTrust([]byte(k.RootKID), pub, nil)
	if err != nil {
		return nil, err
	}
	for _, c := range k.Certificates() {
		if _, err := t.AddCertificateFile(c); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// DeviceKeys enrols a key for each device, as `edgefence keys enrol` does:
// <Dir>/devices/<id>.key (0600) and <id>.cert (role device, for that one
// device), keeping keys an earlier run left there. It returns the
// directory, the bundle edgefence-devsim's --device-keys reads, and the
// certificates by device, for PublishDevices.
func (k *TrustKit) DeviceKeys(ids ...string) (dir string, certs map[string][]byte, err error) {
	dir = filepath.Join(k.Dir, "devices")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", nil, fmt.Errorf("sandbox: trust: %w", err)
	}
	now := time.Now()
	certs = make(map[string][]byte, len(ids))
	for _, id := range ids {
		key, err := keyPair(filepath.Join(dir, id))
		if err != nil {
			return "", nil, err
		}
		cert, err := k.root.CertifyDevice([]byte(id+"/1"), &key.PublicKey, id, now.Add(-time.Hour), now.Add(trustValidity), 1)
		if err != nil {
			return "", nil, err
		}
		if err := os.WriteFile(filepath.Join(dir, id+".cert"), cert, 0o644); err != nil {
			return "", nil, fmt.Errorf("sandbox: trust: %w", err)
		}
		certs[id] = cert
	}
	return dir, certs, nil
}

// DeviceSigners are the in-process devices' own signers (sim.FleetConfig.
// Signers) for ids, enrolled by DeviceKeys.
func (k *TrustKit) DeviceSigners(ids ...string) (map[string]*auth.Signer, error) {
	out := make(map[string]*auth.Signer, len(ids))
	for _, id := range ids {
		key, err := auth.ReadKey(filepath.Join(k.Dir, "devices", id+".key"))
		if err != nil {
			return nil, err
		}
		if out[id], err = auth.NewSigner([]byte(id+"/1"), key); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// PublishDevices puts each device certificate at <prefix>/trust/devices/<id>
// in the etcd at endpoints, where agents look for them (etcd prefix "":
// the agent's default).
func PublishDevices(ctx context.Context, endpoints []string, prefix string, certs map[string][]byte) error {
	if prefix == "" {
		prefix = "/edgefence/v1" // agent.DefaultEtcdPrefix (agent tests import this package)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return fmt.Errorf("sandbox: trust: %w", err)
	}
	defer cli.Close()
	ids := slices.Sorted(maps.Keys(certs))
	for len(ids) > 0 {
		n := min(len(ids), 64) // etcd's default max txn ops is 128
		var ops []clientv3.Op
		for _, id := range ids[:n] {
			// agent.TrustDeviceKey (agent's tests import this package).
			ops = append(ops, clientv3.OpPut(prefix+"/trust/devices/"+id, string(certs[id])))
		}
		if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
			return fmt.Errorf("sandbox: trust: publish device certificates: %w", err)
		}
		ids = ids[n:]
	}
	return nil
}
