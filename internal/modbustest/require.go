package modbustest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"
)

var (
	requireOnce sync.Once
	requireErr  error
)

// Require skips t unless pymodbus (under /usr/bin/python3), mbpoll and
// socat are all there; under CI=true it fails t instead.
func Require(t testing.TB) {
	t.Helper()
	requireOnce.Do(func() { requireErr = missing(Python, "mbpoll", "socat") })
	if requireErr == nil {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%v (CI=true: make deps installs python3-pymodbus, mbpoll and socat)", requireErr)
	}
	t.Skipf("%v (make deps installs python3-pymodbus, mbpoll and socat)", requireErr)
}

// missing says which of pymodbus (under python) and tools are not there.
func missing(python string, tools ...string) error {
	var errs []error
	if out, err := exec.Command(python, "-c", "import pymodbus.server.async_io, serial_asyncio").CombinedOutput(); err != nil {
		errs = append(errs, fmt.Errorf("pymodbus not importable by %s: %v: %s", python, err, out))
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			errs = append(errs, fmt.Errorf("%s not found: %w", tool, err))
		}
	}
	if errs != nil {
		return fmt.Errorf("modbustest: %w", errors.Join(errs...))
	}
	return nil
}
