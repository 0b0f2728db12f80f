package firmware

import (
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fuzzRuns bounds the fuzzer's run in `make test`: the seed corpus (about
// 1,200 inputs, ~3 s under the sanitizers) and a few thousand mutations.
const fuzzRuns = 6000

// TestCFuzzProcess builds the libFuzzer target fuzz/fuzz_process.c (clang,
// -fsanitize=fuzzer,address,undefined; the fence point's invariants are
// checked inside it) with its seed corpus written from testdata/vectors.h,
// and runs it for fuzzRuns inputs with a fixed seed, so a run in `make
// test` is the same every time. EFS_FUZZTIME (a Go duration, set by `make
// fuzz` from FUZZTIME) runs it for that long instead, with a random seed.
// Skips without clang and libFuzzer, fails under CI=true.
func TestCFuzzProcess(t *testing.T) {
	var err error
	if _, err = os.Stat("/usr/include/mbedtls/ecdsa.h"); err != nil {
		err = fmt.Errorf("no mbedTLS headers (libmbedtls-dev)")
	}
	bin := buildCFuzzer(t, "fuzz/fuzz_process.c", err, "-lmbedcrypto")
	runCFuzzer(t, bin, fuzzRuns)
}

// trustFuzzRuns bounds TestCFuzzTrust in `make test`: the seeds (about
// 600, each valid update's signatures verified) and mutations, ~5 s.
const trustFuzzRuns = 20000

// TestCFuzzTrust builds the libFuzzer target fuzz/fuzz_trust.c (efsdev's
// trust.c: trust updates against the vectors' root, certificates,
// revocation lists, statements; its invariants checked inside it), seeded
// from testdata/trust_vectors.h (Go-made statements), and runs it as
// TestCFuzzProcess does (EFS_FUZZTIME: `make fuzz`).
func TestCFuzzTrust(t *testing.T) {
	var err error
	if _, err = os.Stat("/usr/include/mbedtls/ecdsa.h"); err != nil {
		err = fmt.Errorf("no mbedTLS headers (libmbedtls-dev)")
	}
	runCFuzzer(t, buildCFuzzer(t, "fuzz/fuzz_trust.c", err, "-lmbedcrypto"), trustFuzzRuns)
}

// buildCFuzzer builds the libFuzzer target src with the library (clang,
// -fsanitize=fuzzer,address,undefined, then libs) into a temporary
// directory of its own and returns its path. Without clang and libFuzzer,
// or with missing (what else the target needs), the test skips, and fails
// under CI=true.
func buildCFuzzer(t *testing.T, src string, missing error, libs ...string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), strings.TrimSuffix(filepath.Base(src), ".c"))
	clang, err := exec.LookPath("clang")
	if err == nil {
		err = missing
	}
	if err == nil {
		args := []string{"-std=c99", "-g", "-O1", "-Wall", "-Wextra", "-Werror",
			"-fsanitize=fuzzer,address,undefined", "-fno-sanitize-recover=all", "-Iinclude", "-o", bin, src}
		args = append(append(args, librarySources(t)...), libs...)
		var out []byte
		if out, err = exec.Command(clang, args...).CombinedOutput(); err != nil {
			err = fmt.Errorf("clang -fsanitize=fuzzer: %v\n%s", err, out)
		}
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%v: run make deps (clang, libfuzzer-14-dev, libmbedtls-dev)", err)
		}
		t.Skipf("%v; under CI=true this fails", err)
	}
	return bin
}

// runCFuzzer has the target bin (in its own temporary directory) write its
// seed corpus (EFS_FUZZ_SEEDS), then runs it for runs inputs with a fixed
// seed, or for EFS_FUZZTIME with a random one, and logs its statistics.
func runCFuzzer(t *testing.T, bin string, runs int) {
	t.Helper()
	dir := filepath.Dir(bin)
	seeds, work := filepath.Join(dir, "seeds"), filepath.Join(dir, "work")
	for _, d := range []string{seeds, work} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "EFS_FUZZ_SEEDS="+seeds)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("writing the seeds: %v\n%s", err, out)
	}
	args := []string{"-runs=" + fmt.Sprint(runs), "-seed=1"}
	timeout := 3 * time.Minute
	if s := os.Getenv("EFS_FUZZTIME"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d < time.Second {
			t.Fatalf("EFS_FUZZTIME=%q: want a Go duration of a second or more", s)
		}
		args = []string{fmt.Sprintf("-max_total_time=%d", int(d.Seconds()))}
		timeout = d + 2*time.Minute
	}
	args = append(args, "-artifact_prefix="+dir+"/", "-print_final_stats=1", work, seeds)
	out := runFuzzer(t, timeout, bin, args)
	var stats []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "stat::number_of_executed_units") || strings.HasPrefix(l, "stat::average_exec_per_sec") || strings.HasPrefix(l, "stat::new_units_added") {
			stats = append(stats, strings.Join(strings.Fields(l), " "))
		}
	}
	t.Log(strings.Join(stats, "; "))
}

// runFuzzer runs the fuzzer and, if it fails, reports its crash input in hex
// (to replay: write it to a file, then run the target on that file).
func runFuzzer(t *testing.T, timeout time.Duration, bin string, args []string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	if err == nil {
		return string(out)
	}
	if ctx.Err() != nil {
		t.Fatalf("fuzzer still running after %v\n%s", timeout, lastLines(string(out), 40))
	}
	msg := fmt.Sprintf("fuzzer: %v\n%s", err, lastLines(string(out), 60))
	for _, pattern := range []string{"crash-*", "leak-*", "timeout-*", "oom-*"} {
		found, _ := filepath.Glob(filepath.Join(filepath.Dir(bin), pattern))
		for _, c := range found {
			data, rerr := os.ReadFile(c)
			if rerr != nil {
				continue
			}
			if len(data) > 4096 {
				data = data[:4096]
			}
			msg += fmt.Sprintf("\n%s (%d bytes shown):\n%s", filepath.Base(c), len(data), hex.EncodeToString(data))
		}
	}
	t.Fatal(msg)
	return ""
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
