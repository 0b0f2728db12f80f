package deploy_test

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgefence/edgefence/internal/sandbox"
)

// checkConfig is the subcommand that validates a config file.
var checkConfig = []string{"config", "check"}

// The gateway builds run: each is cross-built the way `make cross` builds
// it (static, trimpath, the Makefile's SHIPTAGS) and run under
// qemu-user-static, called explicitly (binfmt_misc may not be registered),
// to print its version and validate the example config.
func TestCrossQemu(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: cross-builds the agent three times")
	}
	tags, err := sandbox.ShipTags(repoRoot + "/Makefile")
	if err != nil {
		t.Fatal(err)
	}
	config, err := filepath.Abs(filepath.Join(repoRoot, "configs/edgefence.example.yaml"))
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
			run(t, time.Minute, ".", nil, qemu, append(append([]string{bin}, checkConfig...), config)...)
			t.Logf("%s: build %.1f s, two runs under %s %.1f s", c.name, built.Seconds(), c.qemu, (time.Since(start) - built).Seconds())
		})
	}
}
