package main

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgefence/edgefence/fence/auth"
)

// The operator releases an image from the command line: the manifest names
// the image's sha256, size and security version and verifies against the
// root as a device checks it; --show prints it, verifies it and the image;
// a manifest of another key or for another image is refused.
func TestKeysManifest(t *testing.T) {
	dir := t.TempDir()
	p := func(name string) string { return filepath.Join(dir, name) }
	run := func(code int, args ...string) result {
		t.Helper()
		r := edgefence(t, args...)
		if r.code != code {
			t.Fatalf("exit %d, want %d: %s", r.code, code, r)
		}
		return r
	}
	run(0, "keys", "new", "--out", p("operator"))
	run(0, "keys", "new", "--out", p("mallory"))
	img := []byte(strings.Repeat("firmware 2.1.0 ", 1000))
	os.WriteFile(p("fw.bin"), img, 0o644)
	os.WriteFile(p("other.bin"), img[1:], 0o644)
	sum := sha256.Sum256(img)

	r := run(0, "keys", "manifest", "--root-key", p("operator.key"), "--image", p("fw.bin"), "--version", "7", "--name", "thermo 2.1.0", "-o", p("fw.manifest"))
	if !strings.Contains(r.stdout, fmt.Sprintf("sha256 %x, %d bytes, security version 7", sum, len(img))) {
		t.Fatalf("keys manifest: %s", r)
	}
	raw, err := os.ReadFile(p("fw.manifest"))
	if err != nil {
		t.Fatal(err)
	}
	pub, err := auth.ReadPublic(p("operator.pub"))
	if err != nil {
		t.Fatal(err)
	}
	root, _ := auth.NewRootKey([]byte("operator"), pub)
	m, err := root.VerifyManifest(raw)
	if err != nil || string(m.Image) != string(sum[:]) || m.Size != uint64(len(img)) || m.Version != 7 || m.Name != "thermo 2.1.0" {
		t.Fatalf("the manifest as a device reads it: %+v, %v", m, err)
	}

	r = run(0, "keys", "manifest", "--show", p("fw.manifest"))
	if !strings.Contains(r.stdout, fmt.Sprintf("sha256 %x", sum)) || !strings.Contains(r.stdout, "version  7") || !strings.Contains(r.stdout, "not checked") {
		t.Fatalf("--show: %s", r)
	}
	r = run(0, "keys", "manifest", "--show", p("fw.manifest"), "--root-pub", p("operator.pub"), "--image", p("fw.bin"))
	if !strings.Contains(r.stdout, "signature ok") || !strings.Contains(r.stdout, "matches") {
		t.Fatalf("--show --root-pub --image: %s", r)
	}

	// Refusals: another root, a forger under the operator's kid, another image.
	if r := run(1, "keys", "manifest", "--show", p("fw.manifest"), "--root-pub", p("mallory.pub")); !strings.Contains(r.stdout, "REFUSED: signature") {
		t.Fatalf("verified against another root: %s", r)
	}
	run(0, "keys", "manifest", "--root-key", p("mallory"), "--image", p("fw.bin"), "--version", "9", "-o", p("forged.manifest"))
	if r := run(1, "keys", "manifest", "--show", p("forged.manifest"), "--root-pub", p("operator.pub")); !strings.Contains(r.stdout, "bad signature") {
		t.Fatalf("a forged manifest: %s", r)
	}
	if r := run(1, "keys", "manifest", "--show", p("fw.manifest"), "--image", p("other.bin")); !strings.Contains(r.stdout, "not the one the manifest names") {
		t.Fatalf("another image: %s", r)
	}
	// Usage: --version is required (0 is a version, so it must be said).
	run(2, "keys", "manifest", "--root-key", p("operator"), "--image", p("fw.bin"), "-o", p("x"))
	if r := run(1, "keys", "manifest", "--show", p("operator.pub")); !strings.Contains(r.stderr, "COSE_Sign1") {
		t.Fatalf("--show of something else: %s", r)
	}
}
