package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The key lifecycle from the command line: an operator root and a gateway
// key, a certificate for some devices, a revocation list; verify as a fence
// point would, and refuse what it should. The root key is --root-key
// (FILE, or PREFIX) in every verb.
func TestKeysLifecycle(t *testing.T) {
	dir := t.TempDir()
	p := func(name string) string { return filepath.Join(dir, name) }
	ok := func(args ...string) result {
		t.Helper()
		r := edgefence(t, args...)
		if r.code != 0 {
			t.Fatalf("%s", r)
		}
		return r
	}
	ok("keys", "new", "--out", p("operator"))
	ok("keys", "new", "--out", p("gw-a"))
	ok("keys", "new", "--out", p("mallory"))
	if fi, err := os.Stat(p("operator.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("operator.key: %v %v", fi, err)
	}
	if r := edgefence(t, "keys", "new", "--out", p("operator")); r.code == 0 {
		t.Fatalf("overwrote a key: %s", r)
	}
	ok("keys", "certify", "--root-key", p("operator"), "--pub", p("gw-a.pub"), "--kid", "gw-a/1", "--devices", "dev-1,plc-*", "--out", p("gw-a.cert"))
	r := ok("keys", "verify", "--root-pub", p("operator.pub"), p("gw-a.cert"))
	if !strings.Contains(r.stdout, "ok: key gw-a/1 may command dev-1,plc-*") {
		t.Fatalf("verify: %s", r)
	}
	// A certificate the operator did not sign.
	ok("keys", "certify", "--root-key", p("mallory"), "--pub", p("mallory.pub"), "--kid", "mallory", "--devices", "*", "--out", p("mallory.cert"))
	if r := edgefence(t, "keys", "verify", "--root-pub", p("operator.pub"), p("mallory.cert")); r.code != 1 || !strings.Contains(r.stdout, "REFUSED") {
		t.Fatalf("self-signed certificate: %s", r)
	}
	// Revoked.
	ok("keys", "revoke", "--root-key", p("operator"), "--version", "1", "--kid", "gw-a/1", "--out", p("revoked.cose"))
	if r := edgefence(t, "keys", "verify", "--root-pub", p("operator.pub"), "--revocations", p("revoked.cose"), p("gw-a.cert")); r.code != 1 || !strings.Contains(r.stdout, "revoked") {
		t.Fatalf("revoked certificate: %s", r)
	}
	// Usage errors.
	if r := edgefence(t, "keys", "certify", "--root-key", p("operator")); r.code != 2 {
		t.Fatalf("missing flags: %s", r)
	}
	// The old spellings of the root key's flags still work, with a notice;
	// the usage names only the new ones.
	r = ok("keys", "certify", "--root", p("operator"), "--pub", p("gw-a.pub"), "--kid", "gw-a/2", "--devices", "dev-1", "--out", p("gw-a2.cert"))
	if r.stderr != "edgefence keys certify: --root is deprecated, use --root-key\n" {
		t.Errorf("--root: want one notice line on stderr\n%s", r)
	}
	ok("keys", "manifest", "--root-key", p("operator.key"), "--image", p("gw-a.pub"), "--version", "1", "-o", p("m.cose"))
	r = ok("keys", "manifest", "--show", p("m.cose"), "--root", p("operator.pub"))
	if !strings.Contains(r.stdout, "signature ok") || r.stderr != "edgefence keys manifest: --root is deprecated, use --root-pub\n" {
		t.Errorf("manifest --show --root: %s", r)
	}
	if r := edgefence(t, "keys"); strings.Contains(r.stdout+r.stderr, "--root ") {
		t.Errorf("the usage names --root:\n%s", r)
	}
}
