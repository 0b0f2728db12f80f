package deploy_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgefence/edgefence/internal/sandbox"
)

// checkConfig is the subcommand that validates a config file.
var checkConfig = []string{"config", "check"}

// exampleCopy copies the example config and the profiles it names into a
// temporary directory and returns the config's path there.
func exampleCopy(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{"edgefence.example.yaml", "profiles/energy-meter.yaml", "profiles/hvac-controller.yaml"} {
		b, err := os.ReadFile(filepath.Join(repoRoot, "configs", name))
		if err == nil {
			err = os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755)
		}
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, name), b, 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, "edgefence.example.yaml")
}

// The gateway builds run: each is cross-built the way `make cross` builds
// it (static, trimpath, the Makefile's SHIPTAGS) and run under
// qemu-user-static, called explicitly (binfmt_misc may not be registered),
// to print its version, give the example config its keys (keys init) and
// validate it.
func TestCrossQemu(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: cross-builds the agent three times")
	}
	tags, err := sandbox.ShipTags(repoRoot + "/Makefile")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, goarch, goarm, qemu, platform string }{
		{"arm64", "arm64", "", "qemu-aarch64-static", "linux/arm64"},
		{"armv7", "arm", "7", "qemu-arm-static", "linux/arm"},
		{"armv6", "arm", "6", "qemu-arm-static", "linux/arm"}, // Pi Zero/1
	} {
		t.Run(c.name, func(t *testing.T) {
			qemu := tool(t, c.qemu, "apt-get install qemu-user-static; make deps does")
			bin := filepath.Join(t.TempDir(), "edgefence")
			start := time.Now()
			run(t, 5*time.Minute, repoRoot, []string{"CGO_ENABLED=0", "GOOS=linux", "GOARCH=" + c.goarch, "GOARM=" + c.goarm},
				"go", "build", "-tags", tags, "-trimpath", "-ldflags", "-s -w -X main.version=qemu-smoke", "-o", bin, "./cmd/edgefence")
			built := time.Since(start)
			out := string(run(t, time.Minute, ".", nil, qemu, bin, "version"))
			if !strings.HasPrefix(out, "edgefence qemu-smoke ") || !strings.Contains(out, " "+c.platform+")") {
				t.Errorf("%s %s version: %q, want edgefence qemu-smoke ... %s", c.qemu, c.name, out, c.platform)
			}
			config := exampleCopy(t)
			run(t, time.Minute, ".", nil, qemu, bin, "keys", "init", "--config", config, "--dir", filepath.Join(filepath.Dir(config), "keys"))
			run(t, time.Minute, ".", nil, qemu, append(append([]string{bin}, checkConfig...), config)...)
			t.Logf("%s: build %.1f s, three runs under %s %.1f s", c.name, built.Seconds(), c.qemu, (time.Since(start) - built).Seconds())
		})
	}
}
