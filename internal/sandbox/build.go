package sandbox

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
)

// UnsafeTag is the build tag of test and demo builds: with it, the agent
// reads EDGEFENCE_FAILPOINTS and the device simulator has --unsafe-no-fence
// (the unfenced device kind).
// The shipped binaries are built without it.
const UnsafeTag = "edgefence_unsafe"

// BuildCommands builds the module's commands (names under ./cmd, e.g.
// "edgefence") into dir with `go build -tags edgefence_unsafe` (a test
// build, failpoints compiled in), with the race detector if race. Tests that
// run the real binaries use it; it needs the go tool and the module's source
// (run from inside the module).
func BuildCommands(ctx context.Context, dir string, race bool, names ...string) error {
	args := []string{"build", "-tags", UnsafeTag, "-o", dir + "/"}
	if race {
		args = append(args, "-race")
	}
	for _, n := range names {
		args = append(args, "github.com/edgefence/edgefence/cmd/"+n)
	}
	out, err := exec.CommandContext(ctx, "go", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("sandbox: go build: %w\n%s", err, out)
	}
	return nil
}

// QuickRaceExit makes the race-built binaries this process starts from now
// on exit at once. The race detector sleeps atexit_sleep_ms (1 s by
// default) before a process exits so that late reports get out; a test pays
// it on every CLI call, device reboot and stop of a child. Races are still
// reported as they are detected. GORACE is read when a process starts, so
// this changes only the children; a GORACE that sets atexit_sleep_ms is
// kept. Test mains that run the real binaries call it before m.Run.
func QuickRaceExit() error {
	g := os.Getenv("GORACE")
	if strings.Contains(g, "atexit_sleep_ms") {
		return nil
	}
	return os.Setenv("GORACE", strings.TrimSpace(g+" atexit_sleep_ms=0"))
}

// ShipTags returns the build tags what ships is built with: the Makefile's
// SHIPTAGS line, its $(GOTAGS) expanded from the GOTAGS line, read from
// makefile (the repository's Makefile), so that the tests that build or
// check the shipped binaries and `make cross` cannot drift apart.
func ShipTags(makefile string) (string, error) {
	b, err := os.ReadFile(makefile)
	if err != nil {
		return "", fmt.Errorf("sandbox: ship tags: %w", err)
	}
	get := func(name string) (string, error) {
		m := regexp.MustCompile(`(?m)^` + name + ` :?= *(\S*)\s*$`).FindSubmatch(b)
		if m == nil {
			return "", fmt.Errorf("sandbox: ship tags: %s has no %s line", makefile, name)
		}
		return string(m[1]), nil
	}
	ship, err := get("SHIPTAGS")
	if err != nil {
		return "", err
	}
	base, err := get("GOTAGS")
	if err != nil {
		return "", err
	}
	return strings.ReplaceAll(ship, "$(GOTAGS)", base), nil
}
