package chaos

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/internal/sandbox"
)

// roundTrust is a signed round's operator trust chain (sandbox.TrustKit in
// <dir>/trust): per gateway the key it runs with, the device keys, and
// the key ids the operator revoked. The devices are provisioned with the
// root only: they learn the gateways' certificates and the lists over the
// air, from the agents' trust updates.
type roundTrust struct {
	kit     *sandbox.TrustKit
	devKeys string   // the device keys' directory (edgefence-devsim --device-keys)
	devices []string // every device of the round: what a gateway certificate names

	mu      sync.Mutex
	keys    map[string]*sandbox.GatewayKey // gateway → the key its config names
	gen     map[string]uint64              // gateway → its key's number (key id <gw>/<n>)
	revoked []string                       // key ids revoked, in order
	version uint64                         // the newest revocation list's
}

// provisionTrust makes the round's trust chain (Config.Unsigned: none):
// the root, a key and certificate for gw-a and gw-b naming every device,
// and an enrolled key per shim device. The device certificates are
// published in etcd by publishDeviceCerts, once etcd is up.
func (r *round) provisionTrust(devices, shim []string) error {
	if r.cfg.Unsigned {
		return nil
	}
	kit, err := sandbox.NewTrustKit(r.path("trust"))
	if err != nil {
		return err
	}
	t := &roundTrust{kit: kit, devices: devices, keys: map[string]*sandbox.GatewayKey{}, gen: map[string]uint64{}}
	for _, gw := range []string{"gw-a", "gw-b"} {
		if t.keys[gw], err = kit.GatewayKey(gw, 1, devices...); err != nil {
			return err
		}
		t.gen[gw] = 1
	}
	if len(shim) > 0 {
		if t.devKeys, _, err = kit.DeviceKeys(shim...); err != nil {
			return err
		}
	}
	r.trust = t
	return nil
}

// key returns the key gw runs with now (nil when unsigned).
func (t *roundTrust) key(gw string) *sandbox.GatewayKey {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.keys[gw]
}

// authYAML is gw's config's auth section ("" when unsigned): its key,
// certificate and the root; every device is `auth: required` (the
// default with a key).
func (t *roundTrust) authYAML(gw string) string {
	k := t.key(gw)
	if k == nil {
		return ""
	}
	return fmt.Sprintf("auth:\n  key_file: %q\n  key_id: %q\n  certificate: %q\n  trust_root: %q\n  trust_root_kid: %q\n",
		k.KeyFile, k.KeyID, k.Certificate, k.TrustRoot, k.TrustRootKID)
}

// devsimArgs provision the shim devices (edgefence-devsim, efsdev): the
// root, and each device's own key to sign its acks and state reports.
// No certificate: the gateways' come over the air.
func (t *roundTrust) devsimArgs() []string {
	if t == nil {
		return nil
	}
	args := []string{"--trust-root", t.kit.RootPub(), "--trust-root-kid", t.kit.RootKID}
	if t.devKeys != "" {
		args = append(args, "--device-keys", t.devKeys)
	}
	return args
}

// publishDeviceCerts puts the shim devices' certificates in etcd with
// `edgefence keys publish --certs`, as an operator enrols devices (from
// gw-a's network node, which reaches etcd).
func (r *round) publishDeviceCerts(ctx context.Context, shim []string) error {
	if r.trust == nil || len(shim) == 0 {
		return nil
	}
	var certs []string
	for _, d := range shim {
		certs = append(certs, filepath.Join(r.trust.devKeys, d+".cert"))
	}
	_, err := r.edgefenceAt(ctx, nodeA, "keys", "publish", "--etcd", r.etcdURL, "--root-pub", r.trust.kit.RootPub(),
		"--root-kid", r.trust.kit.RootKID, "--certs", strings.Join(certs, ","))
	return err
}

// revoke has the operator revoke kid: a newer list naming every key
// revoked so far, published in etcd with `edgefence keys publish
// --revocations` through via's config (its etcd and root). Running agents
// relay it to the devices they hold.
func (r *round) revoke(ctx context.Context, via *agentProc, kid string) error {
	t := r.trust
	t.mu.Lock()
	t.version++
	t.revoked = append(t.revoked, kid)
	version, kids := t.version, slices.Clone(t.revoked)
	t.mu.Unlock()
	path, err := t.kit.Revoke(version, kids...)
	if err != nil {
		return err
	}
	if _, err := r.edgefenceAt(ctx, via.node, "keys", "publish", "--config", via.cfgPath, "--revocations", path); err != nil {
		return err
	}
	r.logf("operator revoked %s (list version %d, published through %s)", kid, version, via.name)
	return nil
}

// rotate certifies gw's next key (key id <gw>/<n+1>, serial n+1) while the
// old one is still valid and makes it the one gw's config names; the
// caller restarts gw with it.
func (r *round) rotate(gw string) (old, next *sandbox.GatewayKey, err error) {
	t := r.trust
	t.mu.Lock()
	defer t.mu.Unlock()
	n := t.gen[gw] + 1
	k, err := t.kit.GatewayKey(gw, n, t.devices...)
	if err != nil {
		return nil, nil, err
	}
	old, t.keys[gw], t.gen[gw] = t.keys[gw], k, n
	return old, k, nil
}

// canCommand reports whether the key kid may command dev by the
// operator's own records: issued by this round, naming dev (every
// certificate of the round names every device), not revoked.
func (t *roundTrust) canCommand(kid, dev string) bool {
	if t == nil {
		return true
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if slices.Contains(t.revoked, kid) || !slices.Contains(t.devices, dev) {
		return false
	}
	gw, n, ok := strings.Cut(kid, "/")
	num, err := strconv.ParseUint(n, 10, 64)
	return ok && err == nil && num >= 1 && num <= t.gen[gw]
}

// writeManifest signs the firmware image's manifest with the root
// (`edgefence keys manifest`, as the operator releases an image) and
// returns its file, for `job create --manifest`; "" when unsigned.
func (r *round) writeManifest(img []byte, sum []byte, version uint64) (string, error) {
	if r.trust == nil {
		return "", nil
	}
	raw, err := r.trust.kit.Manifest(auth.Manifest{Image: sum, Size: uint64(len(img)), Version: version})
	if err != nil {
		return "", err
	}
	path := r.path("fw-chaos.manifest")
	return path, os.WriteFile(path, raw, 0o644)
}
