package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/internal/sandbox"
)

// `keys init` writes a root, a gateway key and its certificate into a 0700
// directory (private keys 0600) and the auth: block into the config in
// place; it refuses to overwrite keys, or a config's key, without --force;
// a config it cannot edit safely gets the block printed instead, untouched.
func TestKeysInit(t *testing.T) {
	dir, p, ok := keysDir(t)
	cfg := p("config.yaml")
	if err := os.WriteFile(cfg, []byte(strings.Replace(goodConfig, "{id: dev-1, auth: off}", "{id: dev-1}", 1)), 0o640); err != nil {
		t.Fatal(err)
	}
	keys := p("keys")
	r := ok("keys", "init", "--config", cfg, "--dir", keys, "--devices", "dev-*")
	if !strings.Contains(r.stdout, "key gw-1/1 may command dev-*") || !strings.Contains(r.stdout, "copy it off this gateway and delete it") ||
		!strings.Contains(r.stdout, "edgefence keys enrol DEVICE --root-key "+filepath.Join(keys, "root.key")) {
		t.Errorf("keys init output:\n%s", r)
	}
	if fi, err := os.Stat(keys); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("%s: %v %v, want a 0700 directory", keys, fi, err)
	}
	for name, mode := range map[string]os.FileMode{"root.key": 0o600, "root.pub": 0o644, "gateway.key": 0o600, "gateway.pub": 0o644, "gateway.cert": 0o644} {
		if fi, err := os.Stat(filepath.Join(keys, name)); err != nil || fi.Mode().Perm() != mode {
			t.Errorf("%s: %v %v, want mode %o", name, fi, err, mode)
		}
	}
	c, err := agent.LoadConfig(cfg)
	if err != nil {
		t.Fatalf("the config after keys init: %v", err)
	}
	want := agent.AuthConfig{KeyFile: filepath.Join(keys, "gateway.key"), KeyID: "gw-1/1", Certificate: filepath.Join(keys, "gateway.cert"),
		TrustRoot: filepath.Join(keys, "root.pub"), TrustRootKID: "operator"}
	if c.Auth != want || c.Devices[0].Auth != agent.AuthRequired || c.Devices[1].Auth != agent.AuthOff {
		t.Fatalf("auth %+v, devices %+v", c.Auth, c.Devices)
	}
	if fi, _ := os.Stat(cfg); fi.Mode().Perm() != 0o640 {
		t.Errorf("config mode %v, want its 0640 kept", fi.Mode())
	}
	r = ok("keys", "verify", "--root-pub", filepath.Join(keys, "root.pub"), filepath.Join(keys, "gateway.cert"))
	if !strings.Contains(r.stdout, "ok: key gw-1/1 may command dev-*") {
		t.Fatalf("the certificate does not verify against the root: %s", r)
	}

	// Nothing is overwritten without --force; with it, a new root.
	before, _ := os.ReadFile(filepath.Join(keys, "root.key"))
	if r := edgefence(t, "keys", "init", "--gateway", "gw-1", "--dir", keys); r.code != 1 || !strings.Contains(r.stderr, "not overwritten") {
		t.Errorf("keys init over existing keys: %s", r)
	}
	if r := edgefence(t, "keys", "init", "--config", cfg, "--dir", p("other")); r.code != 1 || !strings.Contains(r.stderr, "already has a signing key") {
		t.Errorf("keys init over a config's key: %s", r)
	}
	if _, err := os.Stat(p("other")); !os.IsNotExist(err) {
		t.Errorf("a refused keys init wrote keys: %v", err)
	}
	ok("keys", "init", "--config", cfg, "--dir", keys, "--force")
	if after, _ := os.ReadFile(filepath.Join(keys, "root.key")); string(after) == string(before) {
		t.Error("--force kept the old root key")
	}
	if _, err := agent.LoadConfig(cfg); err != nil {
		t.Fatalf("the config after keys init --force: %v", err)
	}

	// A config in a form it does not edit: the block is printed, the file
	// left as it was; without --config, printed too.
	flow := p("flow.yaml")
	src := `{gateway: gw-2, etcd: {endpoints: ["http://127.0.0.1:2379"]}, mqtt: {brokers: ["mqtt://127.0.0.1:1883"]}, devices: [{id: d}]}` + "\n"
	if err := os.WriteFile(flow, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	r = ok("keys", "init", "--config", flow, "--dir", p("keys2"))
	if b, _ := os.ReadFile(flow); string(b) != src || !strings.Contains(r.stdout, flow+" is not edited") ||
		!strings.Contains(r.stdout, "Replace its auth: block with this one") || !strings.Contains(r.stdout, `key_id: "gw-2/1"`) {
		t.Errorf("a flow-style config:\n%s", r)
	}
	r = ok("keys", "init", "--gateway", "gw-3", "--kid", "gw-3/7", "--dir", p("keys3"))
	if !strings.Contains(r.stdout, `key_id: "gw-3/7"`) || !strings.Contains(r.stdout, "trust_root: \""+filepath.Join(dir, "keys3", "root.pub")) {
		t.Errorf("keys init without --config:\n%s", r)
	}
	if r := edgefence(t, "keys", "init", "--dir", p("keys4")); r.code != 2 {
		t.Errorf("keys init without --config or --gateway: %s", r)
	}
}

// A single site from nothing, on the real binaries: the package's kind of
// config (devices signed by default, no key) is refused by `run`; `keys
// init --config` makes the keys and the auth: block; `keys enrol` gives a
// device its own key (published in etcd); an edgefence-devsim provisioned
// with the generated root and certificate (--trust-root, --certs: it takes
// only commands signed by a key that root certified) and the device's key
// takes the agent's signed command, and the agent takes the device's
// signed ack: accepted.
func TestKeysInitSignedEndToEnd(t *testing.T) {
	bin := t.TempDir()
	if err := sandbox.BuildCommands(t.Context(), bin, false, "edgefence-devsim"); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, "fleet-unused") // etcd and a broker; the agent's device is the devsim's
	e.devices = []string{"dev-1"}
	cfg, sock := e.config("gw-1", 5*time.Second)
	b, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, []byte(strings.ReplaceAll(string(b), "    auth: off\n", "")), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := edgefence(t, "run", "--config", cfg); r.code != 1 || !strings.Contains(r.stderr, "run `edgefence keys init --config "+cfg+"`") {
		t.Fatalf("run without a key: want exit 1 naming keys init\n%s", r)
	}

	keys, bundle := filepath.Join(e.dir, "keys"), filepath.Join(e.dir, "bundle")
	for _, args := range [][]string{
		{"keys", "init", "--config", cfg, "--dir", keys},
		{"keys", "enrol", "dev-1", "--root-key", filepath.Join(keys, "root.key"), "--out", bundle, "--config", cfg},
	} {
		if r := edgefence(t, args...); r.code != 0 {
			t.Fatalf("%s", r)
		}
	}
	dev, err := sandbox.StartProc("devsim", filepath.Join(e.dir, "devsim.log"), nil, filepath.Join(bin, "edgefence-devsim"),
		"--mqtt", e.world.Broker.URL(), "--devices", "dev-1", "--dir", filepath.Join(e.dir, "devsim"), "--client-id", "devsim-init",
		"--trust-root", filepath.Join(keys, "root.pub"), "--certs", filepath.Join(keys, "gateway.cert"), "--device-keys", bundle)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dev.Stop(10 * time.Second) })
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := dev.WaitLine(ctx, "ready"); err != nil {
		t.Fatal(err)
	}

	st := e.waitHolding(e.startAgent("gw-1", cfg), sock)
	if d := st.Devices[0]; d.Auth != agent.AuthRequired {
		t.Fatalf("dev-1: auth %q, want required", d.Auth)
	}
	if r, res := e.set(sock, "dev-1", 21); r.code != 0 || res.Verdict != "accepted" {
		t.Fatalf("the signed command\n%s", r)
	}
}
