package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/fence/auth"
)

// errNotNewer: etcd holds a revocation list at least as new.
var errNotNewer = errors.New("etcd holds a revocation list at least as new")

// cmdKeysPublish writes a revocation list and/or certificates to etcd
// (agent.TrustRevocationsKey; agent.TrustCertKey for a gateway's,
// agent.TrustDeviceKey for a device's), each verified against the
// operator's root first; the running agents relay the list to their
// devices. The list is written only over an older one.
func cmdKeysPublish(args []string, stdout, stderr io.Writer) error {
	fs := keysFlagSet("publish", stderr)
	var config, etcd, prefix string
	addEtcdFlags(fs, &config, &etcd, &prefix)
	rootPub := fs.String("root-pub", "", "the operator's public key (PEM; default the config's auth.trust_root)")
	rootKid := fs.String("root-kid", "", "the operator key's id (default the config's auth.trust_root_kid, else operator)")
	revocations := fs.String("revocations", "", "a revocation list (edgefence keys revoke) to publish")
	certs := fs.String("certs", "", "comma-separated certificates to publish: gateways' (edgefence keys certify), devices' (keys enrol's DEVICE.cert)")
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	if *revocations == "" && *certs == "" {
		return keysUsageError(stderr, "keys publish: give --revocations and/or --certs")
	}
	t, err := resolveEtcd(config, etcd, prefix)
	if err != nil {
		return err
	}
	trust, err := publishTrust(t.config, *rootPub, *rootKid)
	if err != nil {
		return err
	}
	// Verify everything before writing anything.
	items, err := certItems(trust, t.prefix, *certs)
	if err != nil {
		return err
	}
	var list *item
	if *revocations != "" {
		raw, err := os.ReadFile(*revocations)
		if err != nil {
			return err
		}
		st, err := trust.Check(raw)
		if err != nil || st.Revocations == nil {
			return fmt.Errorf("%s: not a revocation list of this root: %w", *revocations, err)
		}
		list = &item{key: agent.TrustRevocationsKey(t.prefix), path: *revocations, raw: raw, version: st.Revocations.Version}
	}

	cli, err := t.dial()
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, it := range items {
		if _, err := cli.Put(ctx, it.key, string(it.raw)); err != nil {
			return fmt.Errorf("etcd put %s: %w", it.key, err)
		}
		fmt.Fprintf(stdout, "published %s: %s\n", it.path, it.key)
	}
	if list != nil {
		if err := putNewerList(ctx, cli, trust, list.key, list.raw, list.version); err != nil {
			return fmt.Errorf("%s: %w", list.path, err)
		}
		fmt.Fprintf(stdout, "published revocation list version %d: %s\n", list.version, list.key)
	}
	return nil
}

// item is one statement keys publish writes to etcd.
type item struct {
	key, path string
	raw       []byte
	version   uint64 // revocation list
}

// certItems reads and verifies the comma-separated certificate files of
// certs: a gateway's goes to agent.TrustCertKey, a device's to
// agent.TrustDeviceKey.
func certItems(trust *auth.Trust, prefix, certs string) ([]item, error) {
	var items []item
	for _, path := range strings.Split(certs, ",") {
		if path == "" {
			continue
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		c, err := trust.AddCertificate(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		key := agent.TrustCertKey(prefix, string(c.KeyID))
		if c.Role == auth.RoleDevice {
			key = agent.TrustDeviceKey(prefix, c.Devices[0]) // CertifyDevice: exactly one device
		}
		items = append(items, item{key: key, path: path, raw: raw})
	}
	return items, nil
}

// publishTrust returns a Trust anchored at the root of --root-pub, or of
// the config's auth.trust_root.
func publishTrust(config, rootPub, rootKid string) (*auth.Trust, error) {
	if config != "" {
		c, err := agent.LoadConfig(config)
		if err != nil {
			return nil, err
		}
		if rootPub == "" {
			rootPub = c.Auth.TrustRoot
		}
		if rootKid == "" {
			rootKid = c.Auth.TrustRootKID
		}
	}
	if rootPub == "" {
		return nil, errors.New("keys publish: the operator's public key is needed to verify what is published: --root-pub, or auth.trust_root in --config")
	}
	if rootKid == "" {
		rootKid = "operator"
	}
	pub, err := auth.ReadPublic(rootPub)
	if err != nil {
		return nil, err
	}
	return auth.NewTrust([]byte(rootKid), pub, nil)
}

// putNewerList writes the list at key unless etcd holds one of the root at
// least as new (errNotNewer); a value there that is not the root's is
// overwritten.
func putNewerList(ctx context.Context, cli *clientv3.Client, trust *auth.Trust, key string, raw []byte, version uint64) error {
	return putNewer(ctx, cli, key, raw, func(held []byte) error {
		if st, err := trust.Check(held); err == nil && st.Revocations != nil && st.Revocations.Version >= version {
			return fmt.Errorf("%w: version %d, this one %d", errNotNewer, st.Revocations.Version, version)
		}
		return nil
	})
}

// putNewer writes raw at key unless refuse, given the value there, says
// why not. The write is a transaction on what was read.
func putNewer(ctx context.Context, cli *clientv3.Client, key string, raw []byte, refuse func(held []byte) error) error {
	resp, err := cli.Get(ctx, key)
	if err != nil {
		return fmt.Errorf("etcd get %s: %w", key, err)
	}
	cmp := clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
	if len(resp.Kvs) == 1 {
		kv := resp.Kvs[0]
		if err := refuse(kv.Value); err != nil {
			return err
		}
		cmp = clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision)
	}
	tr, err := cli.Txn(ctx).If(cmp).Then(clientv3.OpPut(key, string(raw))).Commit()
	if err != nil {
		return fmt.Errorf("etcd put %s: %w", key, err)
	}
	if !tr.Succeeded {
		return fmt.Errorf("etcd put %s: changed while publishing; run again", key)
	}
	return nil
}
