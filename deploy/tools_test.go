// Package deploy_test checks what ships to gateways: the .deb packages
// (`make package`, deploy/nfpm*.yaml) and the cross-built binaries under
// qemu-user-static; and the guards over the whole repository (license,
// tidy go.mod, function length). There is no Go code in deploy/, only
// these tests.
package deploy_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if packages.dist != "" {
		os.RemoveAll(packages.dist)
	}
	os.Exit(code)
}

// repoRoot is the repository, seen from this package's directory.
const repoRoot = ".."

// tool returns the path of an external program the test needs. Without it
// the test is skipped, except under CI=true, where it fails: CI runs
// `make deps`, which installs it (hint says how).
func tool(t *testing.T, name, hint string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is required in CI (%s): %v", name, hint, err)
		}
		t.Skipf("%s not installed (%s): %v", name, hint, err)
	}
	return p
}

// skipUnlessCI skips the test, except under CI=true, where what it would
// skip must be there (CI runs on linux/amd64 with `make deps` done).
func skipUnlessCI(t *testing.T, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("required in CI: "+format, args...)
	}
	t.Skipf(format, args...)
}

// run runs a command in dir with extra environment and returns its
// combined output, failing the test if it does not exit 0 in time.
func run(t *testing.T, timeout time.Duration, dir string, env []string, name string, args ...string) []byte {
	t.Helper()
	out, err := runErr(t, timeout, dir, env, name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

func runErr(t *testing.T, timeout time.Duration, dir string, env []string, name string, args ...string) ([]byte, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	return cmd.CombinedOutput()
}
