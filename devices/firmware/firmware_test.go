package firmware

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// cc returns the C compiler, or skips the test without one (fails under
// CI=true: `make deps` installs gcc).
func cc(t *testing.T) string {
	t.Helper()
	for _, name := range []string{os.Getenv("CC"), "cc", "gcc", "clang"} {
		if name == "" {
			continue
		}
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("no C compiler (cc, gcc or clang): run make deps")
	}
	t.Skip("no C compiler (cc, gcc or clang); under CI=true this fails")
	return ""
}

func librarySources(t *testing.T) []string {
	t.Helper()
	srcs, err := filepath.Glob(filepath.Join("src", "*.c"))
	if err != nil || len(srcs) == 0 {
		t.Fatalf("library sources: %v (%d)", err, len(srcs))
	}
	return srcs
}

func run(t *testing.T, timeout time.Duration, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestHostConformance builds the C fence point with the host runner under
// AddressSanitizer and UBSan, warnings as errors, and runs every
// conformance vector (plain and signed commands) and the flash tear tests
// (test/host.c).
//
// The signed commands' crypto is Debian's mbedTLS (libmbedtls-dev): the
// test skips without it, and fails under CI=true.
func TestHostConformance(t *testing.T) {
	compiler := cc(t)
	if _, err := os.Stat("/usr/include/mbedtls/ecdsa.h"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("no mbedTLS headers (libmbedtls-dev): run make deps")
		}
		t.Skip("no mbedTLS headers (libmbedtls-dev); under CI=true this fails")
	}
	bin := filepath.Join(t.TempDir(), "host")
	args := []string{"-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", "-g", "-O1",
		"-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-Iinclude", "-o", bin, "test/host.c"}
	args = append(args, librarySources(t)...)
	run(t, 2*time.Minute, compiler, append(args, "-lmbedcrypto")...)
	out := run(t, 2*time.Minute, bin)
	t.Log(strings.TrimSpace(out[strings.LastIndexByte(strings.TrimSpace(out), '\n')+1:]))
}

// TestLibraryHygiene checks what the header promises: built for a target
// without position-independent code, the library's objects call nothing
// outside the library but memcpy and memset (no heap, no other libc) and
// hold no writable data (no globals).
func TestLibraryHygiene(t *testing.T) {
	compiler := cc(t)
	nm, err := exec.LookPath("nm")
	if err != nil {
		t.Skip("no nm (binutils)")
	}
	dir := t.TempDir()
	defined := map[string]bool{"memcpy": true, "memset": true}
	undefined := map[string]string{}
	for _, src := range librarySources(t) {
		obj := filepath.Join(dir, strings.TrimSuffix(filepath.Base(src), ".c")+".o")
		run(t, time.Minute, compiler, "-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", "-Os", "-fno-pic",
			"-ffreestanding", "-Iinclude", "-c", "-o", obj, src)
		for _, line := range strings.Split(strings.TrimSpace(run(t, time.Minute, nm, obj)), "\n") {
			f := strings.Fields(line)
			switch {
			case len(f) == 2 && f[0] == "U":
				undefined[f[1]] = src
			case len(f) == 3 && strings.ContainsAny(f[1], "DdBbCGgSs"):
				t.Errorf("%s has writable data %s (%s): the library keeps no globals", src, f[2], f[1])
			case len(f) == 3 && f[1] == "T":
				defined[f[2]] = true
			}
		}
	}
	for sym, src := range undefined {
		if !defined[sym] {
			t.Errorf("%s calls %s: outside the library, only memcpy and memset may be called", src, sym)
		}
	}
}

// TestCppcheck runs cppcheck over the library, the Cortex-M board
// (mcu/) and the fuzz target (fuzz/), every check but unused functions
// (the library's API is called by its users), warnings as failures.
func TestCppcheck(t *testing.T) {
	p, err := exec.LookPath("cppcheck")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("no cppcheck: run make deps")
		}
		t.Skip("no cppcheck; under CI=true this fails")
	}
	run(t, 2*time.Minute, p, "--std=c99", "--enable=all", "--suppress=missingIncludeSystem",
		"--suppress=unusedFunction", "--error-exitcode=1", "--inline-suppr", "--quiet", "-Iinclude", "src/", "mcu/", "fuzz/")
}
