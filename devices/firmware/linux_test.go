package firmware

import (
	"os"
	"os/exec"
	"testing"
	"time"
)

// TestLinuxDeviceCppcheck runs cppcheck over the C device (linux/: efsdev,
// its flash file and its thermostat), every check on, as TestCppcheck does
// for the library. The device itself is built and run by internal/sandbox
// (BuildCDevice: TestFigure1CDevice, TestCDeviceKill9).
func TestLinuxDeviceCppcheck(t *testing.T) {
	p, err := exec.LookPath("cppcheck")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("no cppcheck: run make deps")
		}
		t.Skip("no cppcheck; under CI=true this fails")
	}
	run(t, 2*time.Minute, p, "--std=c99", "--enable=all", "--suppress=missingIncludeSystem", "--error-exitcode=1",
		"--inline-suppr", "--quiet", "-Iinclude", "-Ilinux", "linux/")
}
