package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Enrolment from the command line: a device key pair and its certificate
// in a bundle to flash, or only the certificate for a key made on chip
// (--pub); the root's files shared by the devices of one bundle
// directory; the certificate verifies as a device key, never as a key
// that may command. (Publishing to etcd: TestForgedAcksAndStateReports.)
func TestKeysEnrol(t *testing.T) {
	_, p, ok := keysDir(t)
	ok("keys", "new", "--out", p("operator"))
	ok("keys", "new", "--out", p("other-root"))
	ok("keys", "new", "--out", p("chip"))
	r := ok("keys", "enrol", "dev-1", "--root-key", p("operator"), "--out", p("bundle"))
	if !strings.Contains(r.stdout, "not published") {
		t.Errorf("without --config or --etcd: %s", r)
	}
	if fi, err := os.Stat(p("bundle/dev-1.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("dev-1.key: %v %v", fi, err)
	}
	if b, err := os.ReadFile(p("bundle/trust-root.kid")); err != nil || string(b) != "operator\n" {
		t.Fatalf("trust-root.kid: %q %v", b, err)
	}
	// A key made on chip: only its certificate; flags first, then the device.
	ok("keys", "enrol", "--root-key", p("operator"), "--pub", p("chip.pub"), "--kid", "plc-7/chip", "--out", p("bundle"), "dev-2")
	if _, err := os.Stat(p("bundle/dev-2.key")); !os.IsNotExist(err) {
		t.Fatalf("dev-2.key written for a key made on chip: %v", err)
	}
	r = ok("keys", "verify", "--root-pub", p("bundle/trust-root.pub"), p("bundle/dev-1.cert"), p("bundle/dev-2.cert"))
	if !strings.Contains(r.stdout, "ok: key dev-1/1 speaks for device dev-1") || !strings.Contains(r.stdout, "ok: key plc-7/chip speaks for device dev-2") {
		t.Fatalf("verify: %s", r)
	}
	for _, bad := range []struct {
		name string
		args []string
		code int
	}{
		{"enrolled again", []string{"keys", "enrol", "dev-1", "--root-key", p("operator"), "--out", p("bundle")}, 1},
		{"another root's bundle", []string{"keys", "enrol", "dev-3", "--root-key", p("other-root"), "--out", p("bundle")}, 1},
		{"no device", []string{"keys", "enrol", "--root-key", p("operator"), "--out", p("bundle")}, 2},
		{"a wildcard", []string{"keys", "enrol", "dev-*", "--root-key", p("operator"), "--out", p("bundle")}, 2},
		{"no --out", []string{"keys", "enrol", "dev-4", "--root-key", p("operator")}, 2},
	} {
		if r := edgefence(t, bad.args...); r.code != bad.code {
			t.Errorf("%s: %s, want exit %d", bad.name, r, bad.code)
		}
	}
	if _, err := os.Stat(p("bundle/dev-3.key")); !os.IsNotExist(err) {
		t.Errorf("another root's bundle directory got dev-3's key: %v", err)
	}
}

// keysDir returns a scratch directory for key files, a path in it, and a
// runner of edgefence commands that must succeed.
func keysDir(t *testing.T) (dir string, path func(name string) string, ok func(args ...string) result) {
	dir = t.TempDir()
	return dir, func(name string) string { return filepath.Join(dir, name) }, func(args ...string) result {
		t.Helper()
		r := edgefence(t, args...)
		if r.code != 0 {
			t.Fatalf("%s", r)
		}
		return r
	}
}
