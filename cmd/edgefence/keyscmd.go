package main

import (
	"crypto/ecdsa"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/edgefence/edgefence/fence/auth"
)

const keysUsage = `usage: edgefence keys init|new|certify|enrol|revoke|epoch|verify|publish|manifest [flags]

The key lifecycle of signed commands (I7; fence points verify them offline).
--root-key is the operator's root private key (FILE, or PREFIX for PREFIX.key),
--root-pub its public key, --root-kid its key id (default operator):

  keys init [--config FILE] [--dir /etc/edgefence/keys] [--gateway ID] [--kid ID]
            [--devices LIST] [--root-kid ID] [--valid 8760h] [--force]
                                         a single site's start: the operator's root key pair
                                         (root.key, root.pub), this gateway's key (gateway.key,
                                         gateway.pub) and its certificate (gateway.cert, for
                                         --devices, default *) in --dir (0700, keys 0600); the
                                         auth: block written into --config FILE, or printed.
                                         A fleet keeps root.key offline: copy it off, delete it
                                         here. Devices then need root.pub, and for signed acks
                                         a key of their own: keys enrol
  keys new --out PREFIX                  a new ES256 key pair: PREFIX.key (0600), PREFIX.pub;
                                         the operator's root key and each gateway's key alike
  keys certify --root-key FILE --root-kid ID --pub GW.pub --kid ID --devices LIST
               [--valid 8760h] [--serial N] --out FILE
                                         the operator certifies a gateway key for devices
                                         (ids, prefix*, or *) for a while; rotate by certifying
                                         a new key (new kid) before revoking the old one
  keys enrol DEVICE --root-key FILE --root-kid ID --out DIR [--pub DEV.pub] [--kid ID]
             [--valid 43800h] [--serial N] [--config FILE | --etcd URLS] [--prefix P]
                                         a device's own key (signs its acks and state reports,
                                         never commands), certified by the operator; writes the
                                         bundle to flash (DIR/DEVICE.key, .cert, trust-root.pub,
                                         trust-root.kid) and with --config/--etcd publishes the
                                         certificate at <prefix>/trust/devices/DEVICE
  keys revoke --root-key FILE --root-kid ID --version N [--kid LIST] --out FILE
                                         a signed revocation list; N must exceed the last one's
  keys epoch --root-key FILE [--root-kid ID] [--epoch N] [--out FILE]
             [--config FILE | --etcd URLS [--prefix P]] [--root-pub FILE]
  keys epoch --from FILE (--config FILE | --etcd URLS [--prefix P]) [--root-pub FILE]
                                         the fleet's epoch statement (default N: now in unix ms,
                                         or above the highest in etcd): every device whose
                                         commands are signed refuses those of an earlier epoch;
                                         published at <prefix>/trust/epoch over a lower one only
  keys verify --root-pub FILE --root-kid ID [--revocations FILE] CERT...
                                         check certificates as a fence point would, now
  keys publish [--config FILE | --etcd URLS] [--root-pub FILE --root-kid ID]
               [--revocations FILE] [--certs LIST]
                                         verify against the root, then write to etcd
                                         (<prefix>/trust/revocations, only over an older list;
                                         <prefix>/trust/certs/<kid>, a device's at
                                         <prefix>/trust/devices/<device>): running agents relay
                                         the list to every device they hold; after an etcd
                                         rebuild, the agents put back what they kept
  keys manifest --root-key FILE [--root-kid ID] --image FILE --version N [--name TEXT] -o FILE
                                         the operator releases a firmware image: a manifest of
                                         its sha256, size and security version signed by the
                                         root; devices provisioned with the root install
                                         nothing else
  keys manifest --show FILE [--root-pub FILE [--root-kid ID]] [--image FILE]
                                         print a manifest; verify it against the root, and
                                         that the image file is the one it names
`

func cmdKeys(args []string, stdout, stderr io.Writer) error {
	return subcommand("keys", keysUsage, map[string]command{"init": cmdKeysInit, "new": cmdKeysNew, "certify": cmdKeysCertify, "enrol": cmdKeysEnrol,
		"revoke": cmdKeysRevoke, "epoch": cmdKeysEpoch, "verify": cmdKeysVerify, "publish": cmdKeysPublish, "manifest": cmdKeysManifest}, args, stdout, stderr)
}

func keysFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("keys "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, keysUsage) }
	return fs
}

func cmdKeysNew(args []string, stdout, stderr io.Writer) error {
	fs := keysFlagSet("new", stderr)
	out := fs.String("out", "", "write PREFIX.key and PREFIX.pub")
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	if *out == "" {
		return keysUsageError(stderr, "keys new: --out is required")
	}
	k, err := auth.NewKey()
	if err != nil {
		return err
	}
	if err := auth.WriteKeyPair(*out, k); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s.key (private, keep it off etcd) and %s.pub\n", *out, *out)
	return nil
}

// rootFlags are the operator's root key flags of certify, enrol and
// revoke: --root-key FILE (PREFIX.key, or PREFIX) and --root-kid ID.
func rootFlags(fs *flag.FlagSet) (key, kid *string) {
	key = fs.String("root-key", "", "the operator's root private key: FILE (PREFIX.key, or PREFIX)")
	deprecatedAlias(fs, "root", "root-key", key)
	return key, fs.String("root-kid", "operator", "the operator key's id, as the fence points know it")
}

// deprecatedAlias makes --old, a flag's old spelling, set *v as --now
// does, with a one-line notice. Usage texts name only --now.
func deprecatedAlias(fs *flag.FlagSet, old, now string, v *string) {
	fs.Func(old, "deprecated: use --"+now, func(s string) error {
		fmt.Fprintf(fs.Output(), "edgefence %s: --%s is deprecated, use --%s\n", fs.Name(), old, now)
		*v = s
		return nil
	})
}

// openRoot returns the operator's root of the private key at key
// (PREFIX.key, or PREFIX).
func openRoot(key, kid string) (*auth.Root, error) {
	k, err := auth.ReadKey(strings.TrimSuffix(key, ".key") + ".key")
	if err != nil {
		return nil, err
	}
	return auth.NewRoot([]byte(kid), k)
}

func cmdKeysCertify(args []string, stdout, stderr io.Writer) error {
	fs := keysFlagSet("certify", stderr)
	root, rootKid := rootFlags(fs)
	pub := fs.String("pub", "", "the gateway's public key (PEM)")
	kid := fs.String("kid", "", "the gateway key's id (what its signed commands name)")
	devices := fs.String("devices", "", "comma-separated device ids, prefix*, or *")
	valid := fs.Duration("valid", 365*24*time.Hour, "validity from now")
	serial := fs.Uint64("serial", 1, "serial: a higher one replaces a lower one for the same kid")
	out := fs.String("out", "", "certificate file to write")
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	if *root == "" || *pub == "" || *kid == "" || *devices == "" || *out == "" {
		return keysUsageError(stderr, "keys certify: --root-key, --pub, --kid, --devices and --out are required")
	}
	r, err := openRoot(*root, *rootKid)
	if err != nil {
		return err
	}
	gw, err := auth.ReadPublic(*pub)
	if err != nil {
		return err
	}
	raw, until, err := certifyGateway(r, *kid, gw, *devices, *valid, *serial)
	if err != nil {
		return err
	}
	if err := os.WriteFile(*out, raw, 0o644); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "certified %s for %s until %s (serial %d): %s\n", *kid, *devices, until, *serial, *out)
	return nil
}

// certifyGateway is the root's certificate for the gateway key gw (key id
// kid) to command devices (comma-separated ids, prefix*, or *) from five
// minutes ago (clock skew) for valid; and its end, RFC 3339.
func certifyGateway(r *auth.Root, kid string, gw *ecdsa.PublicKey, devices string, valid time.Duration, serial uint64) ([]byte, string, error) {
	now := time.Now()
	raw, err := r.Certify([]byte(kid), gw, strings.Split(devices, ","), now.Add(-5*time.Minute), now.Add(valid), serial)
	return raw, now.Add(valid).UTC().Format(time.RFC3339), err
}

func cmdKeysRevoke(args []string, stdout, stderr io.Writer) error {
	fs := keysFlagSet("revoke", stderr)
	root, rootKid := rootFlags(fs)
	version := fs.Uint64("version", 0, "list version, above the last one's (required)")
	kids := fs.String("kid", "", "comma-separated key ids revoked (the whole list: it replaces the last one)")
	out := fs.String("out", "", "revocation list file to write")
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	if *root == "" || *version == 0 || *out == "" {
		return keysUsageError(stderr, "keys revoke: --root-key, --version (≥ 1) and --out are required")
	}
	r, err := openRoot(*root, *rootKid)
	if err != nil {
		return err
	}
	var list [][]byte
	for _, k := range strings.Split(*kids, ",") {
		if k != "" {
			list = append(list, []byte(k))
		}
	}
	raw, err := r.Revoke(*version, list, time.Now())
	if err != nil {
		return err
	}
	if err := os.WriteFile(*out, raw, 0o644); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "revocation list version %d, %d key(s) revoked: %s\n", *version, len(list), *out)
	return nil
}

func cmdKeysVerify(args []string, stdout, stderr io.Writer) error {
	fs := keysFlagSet("verify", stderr)
	rootPub := fs.String("root-pub", "", "the operator's public key (PEM)")
	rootKid := fs.String("root-kid", "operator", "the operator key's id")
	revocations := fs.String("revocations", "", "a revocation list to apply first")
	if err := parseFlags(fs, args, -1); err != nil {
		return err
	}
	if *rootPub == "" || fs.NArg() == 0 {
		return keysUsageError(stderr, "keys verify: --root-pub and at least one certificate are required")
	}
	pub, err := auth.ReadPublic(*rootPub)
	if err != nil {
		return err
	}
	trust, err := auth.NewTrust([]byte(*rootKid), pub, nil)
	if err != nil {
		return err
	}
	if *revocations != "" {
		raw, err := os.ReadFile(*revocations)
		if err != nil {
			return err
		}
		if err := trust.ApplyRevocations(raw); err != nil {
			return fmt.Errorf("%s: %w", *revocations, err)
		}
	}
	var bad error
	for _, path := range fs.Args() {
		if err := verifyCert(trust, path, stdout); err != nil {
			fmt.Fprintf(stdout, "%s: REFUSED: %v\n", path, err)
			bad = errors.Join(bad, err)
		}
	}
	if bad != nil {
		return exitError{1}
	}
	return nil
}

// verifyCert adds the certificate at path to trust and says whether its
// key may command the devices it names, now.
func verifyCert(trust *auth.Trust, path string, stdout io.Writer) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	c, err := trust.AddCertificate(raw)
	if err != nil {
		return err
	}
	check, may := trust.Key, "may command"
	if c.Role == auth.RoleDevice {
		check, may = trust.DeviceKey, "speaks for device"
	}
	if _, err := check(c.KeyID, c.Devices[0]); err != nil { // revoked, not yet or no longer valid
		return err
	}
	fmt.Fprintf(stdout, "%s: ok: key %s %s %s from %s to %s (serial %d)\n", path, c.KeyID, may, strings.Join(c.Devices, ","),
		time.Unix(c.NotBefore, 0).UTC().Format(time.RFC3339), time.Unix(c.NotAfter, 0).UTC().Format(time.RFC3339), c.Serial)
	return nil
}

// keysUsageError prints msg and the keys usage and returns exit status 2.
func keysUsageError(stderr io.Writer, msg string) error {
	fmt.Fprintf(stderr, "edgefence %s\n\n%s", msg, keysUsage)
	return exitError{exitUsage}
}
