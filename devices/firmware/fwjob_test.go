package firmware

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestFirmwareJobHost builds the C firmware job (src/efs_fw*.c, on the
// fence point) with its host runner (test/fw_host.c) under AddressSanitizer
// and UBSan, warnings as errors, and runs it: the scenarios of
// testdata/fw_vectors.h answered by the Go devices/fwjob (TestFwVectorsCurrent),
// a job begin to commit with every refusal, the boot loader's verdicts, and a
// power cut at every byte every step of a job programs (and through its
// erases), after which the device must boot a verified image with its mark
// and job record in agreement and finish the job. The signed manifests'
// scenarios need mbedTLS for the port's ES256 (skipped without it, but
// under CI=true).
func TestFirmwareJobHost(t *testing.T) {
	compiler := cc(t)
	bin := filepath.Join(t.TempDir(), "fw_host")
	args := []string{"-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", "-g", "-O1",
		"-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-Iinclude", "-o", bin, "test/fw_host.c"}
	args = append(args, librarySources(t)...)
	if hasMbedTLS(t) { // the root's signatures (manifests, resets): ES256 on mbedTLS
		args = append(args, "-DEFS_FW_CRYPTO", "-lmbedcrypto")
	}
	run(t, 2*time.Minute, compiler, args...)
	out := strings.TrimSpace(run(t, 5*time.Minute, bin))
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "power cuts:") || strings.HasPrefix(line, "firmware vectors:") ||
			strings.HasPrefix(line, "reset on the firmware") || strings.Contains(line, " checks, ") {
			t.Log(line)
		}
	}
}

// mcuFwStride is the power cuts' stride on Cortex-M under QEMU (every
// byte on the host, TestFirmwareJobHost).
const mcuFwStride = 3

// TestMCUFirmwareJob cross-builds the firmware job's runner for
// Cortex-M3 and Cortex-M4 (mcu/fw_runner.c: test/fw_host.c on the board,
// -Os) and runs it on QEMU: the Go scenarios, the refusals and boots, and
// the power cuts at every third byte; with the measured peak stack of
// efs_fw_handle, efs_fw_process, efs_fw_open and efs_fw_boot (mcu/board.h's
// probe); with mbedTLS's source the root's signatures are verified on the
// target.
func TestMCUFirmwareJob(t *testing.T) {
	gcc, _, qemu := mcuTools(t, true)
	src := mbedtlsSource(t)
	for _, b := range mcuBoards {
		t.Run(b.cpu, func(t *testing.T) {
			elf := filepath.Join(t.TempDir(), b.cpu+".elf")
			args := append(mcuFlags(b.cpu), "-g", "--specs=nosys.specs", fmt.Sprintf("-DEFS_FW_TEAR_STRIDE=%d", mcuFwStride),
				"-Wl,--wrap=efs_fw_handle,--wrap=efs_fw_process,--wrap=efs_fw_open,--wrap=efs_fw_boot", "-o", elf,
				"mcu/startup.c", "mcu/fw_runner.c")
			if src != "" { // the root's signatures verified on the target (ES256 on mbedTLS)
				args = append(append(args, "-DEFS_FW_CRYPTO"), mbedtlsArgs(src)...)
			}
			run(t, 3*time.Minute, gcc, append(args, librarySources(t)...)...)
			start := time.Now()
			out := run(t, 5*time.Minute, qemu, "-M", b.machine, "-nographic", "-monitor", "none",
				"-semihosting-config", "enable=on,target=native", "-kernel", elf)
			m := mcuSummary.FindStringSubmatch(out)
			if m == nil || m[2] != "0" || strings.Contains(out, "FAIL") {
				t.Fatalf("firmware job runner on QEMU: no clean summary\n%s", out)
			}
			stacks := mcuStack.FindAllStringSubmatch(out, -1)
			if len(stacks) != 4 {
				t.Fatalf("firmware job runner on QEMU: %d stack figures, want 4\n%s", len(stacks), out)
			}
			t.Logf("%s checks, 0 failures in %v on QEMU", m[1], time.Since(start).Round(100*time.Millisecond))
			for _, s := range stacks {
				if s[2] == "0" {
					t.Errorf("stack probe %q: no calls", s[3])
				}
				t.Logf("peak stack %s B over %s calls: %s", s[1], s[2], s[3])
			}
			for _, line := range strings.Split(out, "\n") {
				if strings.HasPrefix(line, "power cuts:") || strings.HasPrefix(line, "sizeof efs_fw") ||
					strings.HasPrefix(line, "firmware vectors:") || strings.HasPrefix(line, "reset on the firmware") {
					t.Log(line)
				}
			}
		})
	}
}

// fwFuzzRuns bounds the firmware job's fuzzer in `make test` (its seeds,
// the vectors' scenarios, and mutations; about 3,000 inputs a second).
const fwFuzzRuns = 10000

// TestCFuzzFirmwareJob builds the libFuzzer target fuzz/fuzz_fw.c
// (sequences of firmware steps and reboots with a power cut, the job's
// invariants checked inside it; clang -fsanitize=fuzzer,address,undefined)
// and runs it for fwFuzzRuns inputs with a fixed seed, or for EFS_FUZZTIME
// (`make fuzz`). Skips without clang and libFuzzer, fails under CI=true.
func TestCFuzzFirmwareJob(t *testing.T) {
	runCFuzzer(t, buildCFuzzer(t, "fuzz/fuzz_fw.c", nil), fwFuzzRuns)
}

// hasMbedTLS reports whether Debian's mbedTLS headers are there; under
// CI=true their absence fails the test.
func hasMbedTLS(t *testing.T) bool {
	t.Helper()
	if _, err := os.Stat("/usr/include/mbedtls/ecdsa.h"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("no mbedTLS headers (libmbedtls-dev): run make deps")
		}
		t.Log("no mbedTLS headers (libmbedtls-dev): the signed manifests' scenarios are skipped")
		return false
	}
	return true
}
