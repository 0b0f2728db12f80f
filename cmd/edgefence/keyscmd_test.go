package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The key lifecycle from the command line: an operator root and a gateway
// key, a certificate for some devices, a revocation list; verify as a fence
// point would, and refuse what it should.
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
	ok("keys", "certify", "--root", p("operator"), "--pub", p("gw-a.pub"), "--kid", "gw-a/1", "--devices", "dev-1,plc-*", "--out", p("gw-a.cert"))
	r := ok("keys", "verify", "--root-pub", p("operator.pub"), p("gw-a.cert"))
	if !strings.Contains(r.stdout, "ok: key gw-a/1 may command dev-1,plc-*") {
		t.Fatalf("verify: %s", r)
	}
	// A certificate the operator did not sign.
	ok("keys", "certify", "--root", p("mallory"), "--pub", p("mallory.pub"), "--kid", "mallory", "--devices", "*", "--out", p("mallory.cert"))
	if r := edgefence(t, "keys", "verify", "--root-pub", p("operator.pub"), p("mallory.cert")); r.code != 1 || !strings.Contains(r.stdout, "REFUSED") {
		t.Fatalf("self-signed certificate: %s", r)
	}
	// Revoked.
	ok("keys", "revoke", "--root", p("operator"), "--version", "1", "--kid", "gw-a/1", "--out", p("revoked.cose"))
	if r := edgefence(t, "keys", "verify", "--root-pub", p("operator.pub"), "--revocations", p("revoked.cose"), p("gw-a.cert")); r.code != 1 || !strings.Contains(r.stdout, "revoked") {
		t.Fatalf("revoked certificate: %s", r)
	}
	// Usage errors.
	if r := edgefence(t, "keys", "certify", "--root", p("operator")); r.code != 2 {
		t.Fatalf("missing flags: %s", r)
	}
}
