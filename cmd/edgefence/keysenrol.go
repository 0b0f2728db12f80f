package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
)

// Enrolment gives a device a key of its own (auth.RoleDevice): the device
// signs its acks and state reports with it, and agents verify them against
// its certificate, which they read from etcd (<prefix>/trust/devices/<id>).
// The provisioning bundle, for flashing, is four files in --out:
//
//	<id>.key         the device's private key (PKCS#8 PEM, 0600; absent with --pub)
//	<id>.cert        its certificate, signed by the operator's root
//	trust-root.pub   the operator's root public key (PKIX PEM)
//	trust-root.kid   the root's key id (one line)
//
// Several devices may share one --out directory: the root files are
// written once and must match after.

// Files of the provisioning bundle for the root.
const (
	bundleRootPub = "trust-root.pub"
	bundleRootKid = "trust-root.kid"
)

type enrolOpts struct {
	device, root, rootKid, pub, kid, out string
	valid                                time.Duration
	serial                               uint64
	config, etcd, prefix                 string
}

func parseEnrolFlags(args []string, stderr io.Writer) (*enrolOpts, error) {
	o := &enrolOpts{}
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") { // keys enrol DEVICE [flags]
		o.device, args = args[0], args[1:]
	}
	fs := keysFlagSet("enrol", stderr)
	root, rootKid := rootFlags(fs)
	fs.StringVar(&o.pub, "pub", "", "the device's public key (PEM), for a device that makes its key on chip (default: make a key pair)")
	fs.StringVar(&o.kid, "kid", "", "the device key's id (default DEVICE/1)")
	fs.StringVar(&o.out, "out", "", "directory of the provisioning bundle (created if missing)")
	fs.DurationVar(&o.valid, "valid", 5*365*24*time.Hour, "validity from now")
	fs.Uint64Var(&o.serial, "serial", 1, "serial: a higher one replaces a lower one for the same kid")
	addEtcdFlags(fs, &o.config, &o.etcd, &o.prefix)
	if err := parseFlags(fs, args, -1); err != nil {
		return nil, err
	}
	if o.device == "" && fs.NArg() == 1 {
		o.device = fs.Arg(0)
	} else if fs.NArg() != 0 {
		return nil, keysUsageError(stderr, "keys enrol: one device, then flags (or flags, then one device)")
	}
	o.root, o.rootKid = *root, *rootKid
	if o.device == "" || o.root == "" || o.out == "" {
		return nil, keysUsageError(stderr, "keys enrol: a device, --root-key and --out are required")
	}
	if err := fence.ValidateDeviceID(o.device); err != nil {
		return nil, keysUsageError(stderr, "keys enrol: "+err.Error())
	}
	if o.kid == "" {
		o.kid = o.device + "/1"
	}
	return o, nil
}

func cmdKeysEnrol(args []string, stdout, stderr io.Writer) error {
	o, err := parseEnrolFlags(args, stderr)
	if err != nil {
		return err
	}
	rootKey, err := auth.ReadKey(strings.TrimSuffix(o.root, ".key") + ".key")
	if err != nil {
		return err
	}
	root, err := auth.NewRoot([]byte(o.rootKid), rootKey)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(o.out, 0o700); err != nil {
		return err
	}
	// The root's files first: a directory of another root's bundles
	// gets nothing of this device.
	rootPub, err := auth.EncodePublic(&rootKey.PublicKey)
	if err != nil {
		return err
	}
	for name, b := range map[string][]byte{bundleRootPub: rootPub, bundleRootKid: []byte(o.rootKid + "\n")} {
		if err := writeBundleFile(filepath.Join(o.out, name), b, true); err != nil {
			return err
		}
	}
	pub, err := enrolKey(o, stdout)
	if err != nil {
		return err
	}
	now := time.Now()
	cert, err := root.CertifyDevice([]byte(o.kid), pub, o.device, now.Add(-5*time.Minute), now.Add(o.valid), o.serial)
	if err != nil {
		return err
	}
	if err := writeBundleFile(filepath.Join(o.out, o.device+".cert"), cert, false); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "enrolled %s: device key %s certified until %s (serial %d); bundle in %s\n", o.device, o.kid,
		now.Add(o.valid).UTC().Format(time.RFC3339), o.serial, o.out)
	if o.config == "" && o.etcd == "" {
		fmt.Fprintf(stdout, "not published: give --config or --etcd to put the certificate at <prefix>/trust/devices/%s\n", o.device)
		return nil
	}
	return publishDeviceCert(o, cert, stdout)
}

// enrolKey makes the device's key pair in the bundle, or reads the public
// key the device made itself (--pub), and returns the public key.
func enrolKey(o *enrolOpts, stdout io.Writer) (*ecdsa.PublicKey, error) {
	if o.pub != "" {
		return auth.ReadPublic(o.pub)
	}
	k, err := auth.NewKey()
	if err != nil {
		return nil, err
	}
	prefix := filepath.Join(o.out, o.device)
	if err := auth.WriteKeyPair(prefix, k); err != nil {
		return nil, err
	}
	fmt.Fprintf(stdout, "wrote %s.key (the device's private key: flash it, then delete it here) and %s.pub\n", prefix, prefix)
	return &k.PublicKey, nil
}

// writeBundleFile writes b to path, which must not exist — unless shared
// (the root's files), which may exist with the same content.
func writeBundleFile(path string, b []byte, shared bool) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if errors.Is(err, os.ErrExist) && shared {
		old, rerr := os.ReadFile(path)
		if rerr == nil && bytes.Equal(old, b) {
			return nil
		}
		return fmt.Errorf("%s exists and differs: this bundle directory belongs to another root", path)
	}
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// publishDeviceCert puts the device certificate at <prefix>/trust/devices/<id>.
func publishDeviceCert(o *enrolOpts, cert []byte, stdout io.Writer) error {
	t, err := resolveEtcd(o.config, o.etcd, o.prefix)
	if err != nil {
		return err
	}
	cli, err := t.dial()
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	key := agent.TrustDeviceKey(t.prefix, o.device)
	if _, err := cli.Put(ctx, key, string(cert)); err != nil {
		return fmt.Errorf("publish %s: %w", key, err)
	}
	fmt.Fprintf(stdout, "published the certificate at %s\n", key)
	return nil
}
