package firmware

import (
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
// and job record in agreement and finish the job.
func TestFirmwareJobHost(t *testing.T) {
	compiler := cc(t)
	bin := filepath.Join(t.TempDir(), "fw_host")
	args := []string{"-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", "-g", "-O1",
		"-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-Iinclude", "-o", bin, "test/fw_host.c"}
	run(t, 2*time.Minute, compiler, append(args, librarySources(t)...)...)
	out := strings.TrimSpace(run(t, 5*time.Minute, bin))
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "power cuts:") || strings.HasPrefix(line, "firmware vectors:") ||
			strings.Contains(line, " checks, ") {
			t.Log(line)
		}
	}
}
