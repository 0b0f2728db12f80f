package sandbox

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgefence/edgefence/devices/fwjob"
)

// ErrNoCToolchain means the C device (efsdev) cannot be built here: no C
// compiler, or no libmosquitto or mbedTLS headers (Debian libmosquitto-dev,
// libmbedtls-dev, installed by `make deps`).
var ErrNoCToolchain = errors.New("sandbox: no C compiler, libmosquitto-dev or libmbedtls-dev")

// CDeviceName is the C device's binary: devices/firmware/linux's efsdev, a
// thermostat on libmosquitto fenced by the C firmware shim.
const CDeviceName = "efsdev"

// cFlags are the C device's warnings: any is an error.
var cFlags = []string{"-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic"}

// BuildCDevice compiles efsdev (devices/firmware/linux and the library in
// devices/firmware/src) into dir and returns its path; with sanitize, under
// AddressSanitizer and UBSan (a test build: any finding aborts the process
// and is printed to its stderr) and with the failpoint
// EFSDEV_KILL_AFTER_MARK=N (SIGKILL after the Nth mark written, before its
// effect is stored). It needs the module's source (run from
// inside the module) and returns an error wrapping ErrNoCToolchain
// without a compiler or the libmosquitto or mbedTLS headers.
func BuildCDevice(ctx context.Context, dir string, sanitize bool) (string, error) {
	compiler := ""
	for _, name := range []string{os.Getenv("CC"), "cc", "gcc", "clang"} {
		if p, err := exec.LookPath(name); name != "" && err == nil {
			compiler = p
			break
		}
	}
	if compiler == "" {
		return "", fmt.Errorf("%w: no cc, gcc or clang", ErrNoCToolchain)
	}
	for _, h := range []string{"/usr/include/mosquitto.h", "/usr/include/mbedtls/ecdsa.h"} {
		if _, err := os.Stat(h); err != nil {
			return "", fmt.Errorf("%w: %w", ErrNoCToolchain, err)
		}
	}
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil || strings.TrimSpace(string(out)) == "" || strings.TrimSpace(string(out)) == os.DevNull {
		return "", fmt.Errorf("sandbox: build %s: not inside the module: %v", CDeviceName, err)
	}
	fw := filepath.Join(filepath.Dir(strings.TrimSpace(string(out))), "devices", "firmware")
	srcs, err := filepath.Glob(filepath.Join(fw, "src", "*.c"))
	if err != nil {
		return "", err
	}
	linux, err := filepath.Glob(filepath.Join(fw, "linux", "*.c"))
	if err != nil || len(srcs) == 0 || len(linux) == 0 {
		return "", fmt.Errorf("sandbox: build %s: sources missing under %s", CDeviceName, fw)
	}
	bin := filepath.Join(dir, CDeviceName)
	args := append([]string{}, cFlags...)
	args = append(args, "-g", "-O2", "-I"+filepath.Join(fw, "include"), "-I"+filepath.Join(fw, "linux"), "-o", bin)
	if sanitize {
		args = append(args, "-O1", "-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-DEFSDEV_FAILPOINTS")
	}
	args = append(append(append(args, linux...), srcs...), "-lmosquitto", "-lmbedcrypto", "-lm")
	if b, err := exec.CommandContext(ctx, compiler, args...).CombinedOutput(); err != nil {
		return "", fmt.Errorf("sandbox: build %s: %w\n%s", CDeviceName, err, b)
	}
	return bin, nil
}

// SanitizerReport returns the first AddressSanitizer, LeakSanitizer or
// UBSan report in a C process's log, or "".
func SanitizerReport(log []byte) string {
	s := string(log)
	for _, w := range []string{"ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:"} {
		if i := strings.Index(s, w); i >= 0 {
			end := min(len(s), i+2000)
			return s[i:end]
		}
	}
	return ""
}

var testCDevice struct {
	once sync.Once
	dir  string
	bin  string
	err  error
}

// RemoveTestCDevice removes what CDeviceForTest built; call it from
// TestMain after the tests ran.
func RemoveTestCDevice() {
	if d := testCDevice.dir; d != "" {
		os.RemoveAll(d)
	}
}

// CDeviceForTest builds efsdev for tests, under ASan/UBSan with its failpoint
// (BuildCDevice with sanitize), once per test binary, and returns its path.
// It skips with -short, and without a C compiler or libmosquitto-dev but
// under CI=true (`make deps` installs them), where it fails.
func CDeviceForTest(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the C device; skipped with -short")
	}
	c := &testCDevice
	c.once.Do(func() {
		if c.dir, c.err = os.MkdirTemp("", "edgefence-efsdev-"); c.err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		c.bin, c.err = BuildCDevice(ctx, c.dir, true)
	})
	if errors.Is(c.err, ErrNoCToolchain) && os.Getenv("CI") != "true" {
		t.Skipf("%v; under CI=true this fails", c.err)
	}
	if c.err != nil {
		t.Fatal(c.err)
	}
	return c.bin
}

// CDeviceFirmwareStatus reads the firmware state of a stopped C device
// (efsdev --firmware) from its files in dir: efsdev --fw-status, which
// prints fwjob.Status's fields (the images in hex) without booting.
func CDeviceFirmwareStatus(bin, dir, dev string) (fwjob.Status, error) {
	out, err := exec.Command(bin, "--fw-status", "--dir", dir, "--devices", dev).Output()
	if err != nil {
		return fwjob.Status{}, fmt.Errorf("device %s: efsdev --fw-status: %w", dev, err)
	}
	var w struct {
		fwjob.Status
		Image, ActiveImage, TrialImage string
	}
	if err := json.Unmarshal(out, &w); err != nil {
		return fwjob.Status{}, fmt.Errorf("device %s: efsdev --fw-status: %w", dev, err)
	}
	st := w.Status
	for _, h := range []struct {
		s string
		b *[]byte
	}{{w.Image, &st.Image}, {w.ActiveImage, &st.ActiveImage}, {w.TrialImage, &st.TrialImage}} {
		if *h.b, err = hex.DecodeString(h.s); err != nil {
			return st, fmt.Errorf("device %s: efsdev --fw-status: %w", dev, err)
		}
	}
	return st, nil
}
