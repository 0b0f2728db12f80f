package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/fence/auth"
)

// `edgefence keys init` is a single site's start of signed commands: in
// one directory (0700) the operator's root key pair, this gateway's key
// pair and its certificate, as `keys new` and `keys certify` would make
// them, and the agent config's auth: block pointing at them.
const (
	keysInitDir = "/etc/edgefence/keys"
	initRoot    = "root"    // root.key, root.pub
	initGateway = "gateway" // gateway.key, gateway.pub
	initCert    = "gateway.cert"
)

type keysInitOpts struct {
	dir, config, gateway, kid, devices, rootKid string
	valid                                       time.Duration
	force                                       bool
	noEdit                                      error // why the config file is not edited in place (agent.ErrConfigEdit)
}

func parseKeysInitFlags(args []string, stderr io.Writer) (*keysInitOpts, error) {
	o := &keysInitOpts{}
	fs := keysFlagSet("init", stderr)
	fs.StringVar(&o.dir, "dir", keysInitDir, "directory of the keys and the certificate (created 0700)")
	fs.StringVar(&o.config, "config", "", "agent config FILE: its gateway id, and its auth: block written in place (else printed)")
	fs.StringVar(&o.gateway, "gateway", "", "this gateway's id (default: the config's gateway:)")
	fs.StringVar(&o.kid, "kid", "", "the gateway key's id (default GATEWAY/1)")
	fs.StringVar(&o.devices, "devices", "*", "the devices the gateway may command: comma-separated ids, prefix*, or *")
	fs.StringVar(&o.rootKid, "root-kid", "operator", "the root key's id, as the fence points will know it")
	fs.DurationVar(&o.valid, "valid", 365*24*time.Hour, "the certificate's validity from now")
	fs.BoolVar(&o.force, "force", false, "replace existing keys (every device provisioned with the old root must be provisioned again)")
	if err := parseFlags(fs, args, 0); err != nil {
		return nil, err
	}
	if o.config == "" && o.gateway == "" {
		return nil, keysUsageError(stderr, "keys init: give --config FILE (or --gateway ID, to print the auth: block)")
	}
	return o, nil
}

func cmdKeysInit(args []string, stdout, stderr io.Writer) error {
	o, err := parseKeysInitFlags(args, stderr)
	if err != nil {
		return err
	}
	if o.config != "" {
		if err := initConfig(o); err != nil {
			return err
		}
	}
	if o.kid == "" {
		o.kid = o.gateway + "/1"
	}
	dir, err := filepath.Abs(o.dir)
	if err != nil {
		return err
	}
	if err := initKeysDir(dir, o.force); err != nil {
		return err
	}
	root, until, err := initKeys(dir, o)
	if err != nil {
		return err
	}
	a := agent.AuthConfig{KeyFile: filepath.Join(dir, initGateway+".key"), KeyID: o.kid, Certificate: filepath.Join(dir, initCert),
		TrustRoot: filepath.Join(dir, initRoot+".pub"), TrustRootKID: o.rootKid}
	fmt.Fprintf(stdout, "wrote in %s: the operator's root key pair (%s.key, %s.pub, key id %s), this gateway's key pair (%s.key, %s.pub)\n"+
		"and its certificate %s: key %s may command %s until %s (renew with keys certify)\n",
		dir, initRoot, initRoot, o.rootKid, initGateway, initGateway, initCert, o.kid, o.devices, until)
	if err := initAuthBlock(o, a, stdout); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nThe root key %s signs certificates, revocations, fence resets and firmware manifests. For a fleet,\n"+
		"keep it offline: copy it off this gateway and delete it here (give it back with --root-key when needed).\n"+
		"Devices: provision each with %s (key id %s) to verify commands, and for signed acks and state\n"+
		"reports a key of its own: edgefence keys enrol DEVICE --root-key %s --out BUNDLE --config FILE\n",
		root, a.TrustRoot, o.rootKid, root)
	return nil
}

// initConfig reads the config file, before any key is written: the
// gateway id, unless --gateway gave one; whether its auth: block can be
// written in place (o.noEdit); and it refuses to replace a signing key the
// file names, unless --force.
func initConfig(o *keysInitOpts) error {
	src, err := os.ReadFile(o.config)
	if err != nil {
		return err
	}
	var peek struct {
		Gateway string           `yaml:"gateway"`
		Auth    agent.AuthConfig `yaml:"auth"`
	}
	if err := yaml.Unmarshal(src, &peek); err != nil {
		return fmt.Errorf("%s: %w", o.config, err)
	}
	if o.gateway == "" {
		o.gateway = peek.Gateway
	}
	if o.gateway == "" {
		return fmt.Errorf("%s has no gateway: set it first (or give --gateway)", o.config)
	}
	if peek.Auth.KeyFile != "" && !o.force {
		return fmt.Errorf("%s already has a signing key (auth.key_file: %s): --force replaces its auth: block", o.config, peek.Auth.KeyFile)
	}
	_, o.noEdit = agent.WithAuth(src, agent.AuthConfig{KeyFile: "k", KeyID: "k", Certificate: "c", TrustRoot: "r", TrustRootKID: "r"})
	return nil
}

// initKeysDir makes dir, 0700; its key files must not exist, unless force
// (they are removed).
func initKeysDir(dir string, force bool) error {
	var exist []string
	for _, name := range []string{initRoot + ".key", initRoot + ".pub", initGateway + ".key", initGateway + ".pub", initCert} {
		p := filepath.Join(dir, name)
		if _, err := os.Lstat(p); err == nil {
			if !force {
				exist = append(exist, p)
			} else if err := os.Remove(p); err != nil {
				return err
			}
		}
	}
	if len(exist) > 0 {
		return fmt.Errorf("keys exist, not overwritten: %v (--force replaces them: every device provisioned with the old root must then be provisioned again)", exist)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return os.Chmod(dir, 0o700) // private keys: whatever mode an existing directory had
}

// initKeys writes the root and gateway key pairs and the certificate, and
// returns the root key's path and the certificate's end.
func initKeys(dir string, o *keysInitOpts) (rootKey, until string, err error) {
	rk, err := auth.NewKey()
	if err != nil {
		return "", "", err
	}
	if err := auth.WriteKeyPair(filepath.Join(dir, initRoot), rk); err != nil {
		return "", "", err
	}
	root, err := auth.NewRoot([]byte(o.rootKid), rk)
	if err != nil {
		return "", "", err
	}
	gk, err := auth.NewKey()
	if err != nil {
		return "", "", err
	}
	if err := auth.WriteKeyPair(filepath.Join(dir, initGateway), gk); err != nil {
		return "", "", err
	}
	cert, until, err := certifyGateway(root, o.kid, &gk.PublicKey, o.devices, o.valid, 1)
	if err != nil {
		return "", "", err
	}
	if err := writeBundleFile(filepath.Join(dir, initCert), cert, false); err != nil {
		return "", "", err
	}
	return filepath.Join(dir, initRoot+".key"), until, nil
}

// initAuthBlock writes a's auth: block into the config file in place
// (agent.EditConfigAuth keeps every other byte of it), or prints it with
// what to do: without --config, or for a file that cannot be edited so.
func initAuthBlock(o *keysInitOpts, a agent.AuthConfig, stdout io.Writer) error {
	block := agent.AuthBlock(a)
	switch {
	case o.config == "":
		fmt.Fprintf(stdout, "\nPut this auth: block in the agent's config in place of its own (or give --config FILE):\n\n%s", block)
		return nil
	case o.noEdit != nil:
		fmt.Fprintf(stdout, "\n%s is not edited (%v).\nReplace its auth: block with this one, then: edgefence config check %s\n\n%s",
			o.config, o.noEdit, o.config, block)
		return nil
	}
	if err := agent.EditConfigAuth(o.config, a); err != nil {
		fmt.Fprintf(stdout, "\nReplace the auth: block of %s with this one:\n\n%s", o.config, block)
		return fmt.Errorf("keys written, config not: %w", err)
	}
	fmt.Fprintf(stdout, "wrote its auth: block into %s (the rest of the file as it was):\n\n%s", o.config, block)
	return nil
}
