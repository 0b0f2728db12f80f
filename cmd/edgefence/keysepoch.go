package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/fence/auth"
)

// An epoch statement (fence/auth) raises the epoch of every device whose
// commands must be signed, at once: after an etcd rebuild, one statement
// closes every command signed before it instead of a reset per device. The
// agents relay it from <prefix>/trust/epoch to their devices.

// errEpochNotNewer: etcd holds an epoch statement at least as high.
var errEpochNotNewer = errors.New("etcd holds an epoch statement at least as high")

type epochOpts struct {
	rootKey, rootKid, rootPub, out, from string
	epoch                                uint64
	config, etcd, prefix                 string
	now                                  func() time.Time
}

// cmdKeysEpoch signs the fleet's epoch statement with the root key (or reads
// one signed elsewhere, --from), writes it to --out and/or, with --config
// or --etcd, publishes it at agent.TrustEpochKey over a lower one only,
// verified against the root first.
func cmdKeysEpoch(args []string, stdout, stderr io.Writer) error {
	o := &epochOpts{now: time.Now}
	fs := keysFlagSet("epoch", stderr)
	fs.StringVar(&o.rootKey, "root-key", "", "the operator's root private key (PEM, edgefence keys new)")
	fs.StringVar(&o.rootKid, "root-kid", "", "the root key's id, as the fence points were provisioned with it (default the config's auth.trust_root_kid, else operator)")
	fs.StringVar(&o.rootPub, "root-pub", "", "the operator's public key, to verify against before publishing (default the config's auth.trust_root)")
	fs.Uint64Var(&o.epoch, "epoch", 0, "the epoch `N` (default: the current Unix time in milliseconds, or one above the highest epoch etcd holds if that is higher)")
	fs.StringVar(&o.out, "out", "", "write the signed statement to `FILE` (new file)")
	fs.StringVar(&o.from, "from", "", "publish the statement in `FILE` (made with --out) instead of signing one")
	fs.StringVar(&o.config, "config", "", "agent config file: etcd endpoints, prefix, credentials and auth.trust_root; publish there")
	fs.StringVar(&o.etcd, "etcd", "", "etcd endpoints, comma-separated (overrides the config's); publish there")
	fs.StringVar(&o.prefix, "prefix", "", "etcd key prefix (overrides the config's; default "+agent.DefaultEtcdPrefix+")")
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	publish := o.config != "" || o.etcd != ""
	switch {
	case o.from != "" && (o.rootKey != "" || o.epoch != 0 || o.out != ""):
		return keysUsageError(stderr, "keys epoch: --from publishes a signed statement as it is: no --root-key, --epoch or --out")
	case o.from != "" && !publish:
		return keysUsageError(stderr, "keys epoch: --from wants --config or --etcd to publish to")
	case o.from == "" && o.rootKey == "":
		return keysUsageError(stderr, "keys epoch: --root-key is required (or --from FILE)")
	case o.from == "" && o.out == "" && !publish:
		return keysUsageError(stderr, "keys epoch: want --out FILE and/or --config FILE or --etcd URLS")
	}
	return o.run(stdout)
}

// run signs or reads the statement, then writes and publishes it.
func (o *epochOpts) run(stdout io.Writer) error {
	var target *etcdTarget
	var trust *auth.Trust
	var err error
	if o.config != "" || o.etcd != "" {
		if target, err = resolveEtcd(o.config, o.etcd, o.prefix); err != nil {
			return err
		}
		if trust, err = publishTrust(target.config, o.rootPub, o.rootKid); err != nil {
			return err
		}
	}
	var cli *clientv3.Client
	if target != nil {
		if cli, err = target.dial(); err != nil {
			return err
		}
		defer cli.Close()
	}
	raw, err := o.statement(cli, target, trust)
	if err != nil {
		return err
	}
	st, err := checkEpoch(trust, raw)
	if err != nil {
		return err
	}
	if o.out != "" {
		if err := writeNewFile(o.out, raw); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote epoch %d statement to %s (%d bytes)\n", st.Number, o.out, len(raw))
	}
	if cli == nil {
		return nil
	}
	key := agent.TrustEpochKey(target.prefix)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := putNewerEpoch(ctx, cli, trust, key, raw, st.Number); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "published epoch %d at %s: running agents relay it to their devices; every command signed in an earlier epoch is refused stale from then on\n", st.Number, key)
	return nil
}

// statement returns the signed statement: read from --from, or signed now
// with the epoch --epoch or the default (nextEpoch).
func (o *epochOpts) statement(cli *clientv3.Client, target *etcdTarget, trust *auth.Trust) ([]byte, error) {
	if o.from != "" {
		return os.ReadFile(o.from)
	}
	key, err := auth.ReadKey(o.rootKey)
	if err != nil {
		return nil, err
	}
	kid := o.rootKid
	if kid == "" && trust == nil {
		kid = "operator"
	} else if kid == "" {
		kid = string(trust.RootKeyID())
	}
	root, err := auth.NewRoot([]byte(kid), key)
	if err != nil {
		return nil, err
	}
	n := o.epoch
	if n == 0 {
		var highest uint64
		if cli != nil {
			if highest, err = highestEpoch(cli, trust, target.prefix, ""); err != nil {
				return nil, err
			}
		}
		if n, err = nextEpoch(o.now(), highest); err != nil {
			return nil, err
		}
	}
	return root.Epoch(n, o.now())
}

// checkEpoch verifies raw as an epoch statement: against the root when
// publishing (trust), else only its form.
func checkEpoch(trust *auth.Trust, raw []byte) (*auth.Epoch, error) {
	if trust == nil {
		return auth.PeekEpoch(raw)
	}
	st, err := trust.Check(raw)
	if err == nil && st.Epoch == nil {
		err = fmt.Errorf("a %s statement, not an epoch statement", st.Content)
	}
	if err != nil {
		return nil, fmt.Errorf("not an epoch statement of this root: %w", err)
	}
	return st.Epoch, nil
}

// nextEpoch is the default epoch of a new statement or reset: the current
// Unix time in milliseconds, or one above highest if that is higher, so
// that a later statement is always above an earlier one.
func nextEpoch(now time.Time, highest uint64) (uint64, error) {
	if highest == math.MaxUint64 {
		return 0, errors.New("the highest epoch etcd holds is 2^64-1: no epoch is above it")
	}
	return max(uint64(max(now.UnixMilli(), 1)), highest+1), nil
}

// highestEpoch is the highest epoch the root's statements in etcd name:
// the fleet's epoch statement, and the resets of device (every device's
// with device ""). Statements that do not verify against trust are
// ignored (nil trust: none is read).
func highestEpoch(cli *clientv3.Client, trust *auth.Trust, prefix, device string) (uint64, error) {
	if trust == nil {
		return 0, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resets := clientv3.OpGet(agent.TrustResetKey(prefix, ""), clientv3.WithPrefix())
	if device != "" {
		resets = clientv3.OpGet(agent.TrustResetKey(prefix, device))
	}
	resp, err := cli.Txn(ctx).Then(clientv3.OpGet(agent.TrustEpochKey(prefix)), resets).Commit()
	if err != nil {
		return 0, fmt.Errorf("etcd: read the epochs: %w", err)
	}
	var highest uint64
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		if st, err := checkEpoch(trust, kv.Value); err == nil {
			highest = max(highest, st.Number)
		}
	}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		if r, err := auth.PeekReset(kv.Value); err == nil {
			if v, err := trust.VerifyReset(kv.Value, r.Device); err == nil {
				highest = max(highest, v.Epoch)
			}
		}
	}
	return highest, nil
}

// putNewerEpoch writes the statement at key unless etcd holds one of the
// root at least as high (errEpochNotNewer); a value there that is not the
// root's is overwritten.
func putNewerEpoch(ctx context.Context, cli *clientv3.Client, trust *auth.Trust, key string, raw []byte, epoch uint64) error {
	return putNewer(ctx, cli, key, raw, func(held []byte) error {
		if st, err := checkEpoch(trust, held); err == nil && st.Number >= epoch {
			return fmt.Errorf("%w: epoch %d, this one %d", errEpochNotNewer, st.Number, epoch)
		}
		return nil
	})
}
