package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/edgefence/edgefence/internal/sandbox"
)

// shipTags reads the build tags the shipped binaries are built with from the
// Makefile (sandbox.ShipTags).
func shipTags(t *testing.T) string {
	t.Helper()
	tags, err := sandbox.ShipTags("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	return tags
}

// shippedBuild builds the agent as `make cross` ships it for this machine
// (the Makefile's SHIPTAGS, static, stripped) into t's temp dir.
func shippedBuild(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "edgefence-shipped")
	cmd := exec.Command("go", "build", "-tags", shipTags(t), "-trimpath", "-ldflags=-s -w", "-o", out, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build -tags %s: %v\n%s", shipTags(t), err, b)
	}
	return out
}

// TestDependencies guards what the gateway binary links: the sandbox's
// embedded etcd server and MQTT broker, test-only libraries, and packages
// whose reflection disables the linker's dead-code removal must stay out.
func TestDependencies(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	out, err := exec.Command("go", "list", "-tags", shipTags(t), "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	banned := []struct{ prefix, why string }{
		{"go.etcd.io/etcd/server/", "embedded etcd server (sandbox only)"},
		{"go.etcd.io/etcd/tests/", "etcd test framework"},
		{"github.com/mochi-mqtt/", "MQTT broker (sandbox only)"},
		{"github.com/anishathalye/porcupine", "linearizability checker (tests only)"},
		{"pgregory.net/rapid", "property testing (tests only)"},
		{"github.com/edgefence/edgefence/internal/sandbox", "sandbox (demos and tests)"},
		{"github.com/edgefence/edgefence/devices/sim", "device simulator (edgefence-devsim)"},
		{"github.com/edgefence/edgefence/fence/history/linear", "checker (tests only)"},
		{"golang.org/x/net/trace", "grpc tracing: build with -tags grpcnotrace"},
		{"html/template", "reflect method calls disable dead-code removal (+3 MB)"},
		{"text/template", "reflect method calls disable dead-code removal"},
		{"testing", "test code in the binary"},
		{"gopkg.in/yaml.v3", "archived: go.yaml.in/yaml/v3 is its successor, same API"},
		{"github.com/prometheus/", "the Prometheus client (0.6 MB): internal/promtext writes the exposition (BENCHMARKS §80)"},
	}
	var n int
	for _, pkg := range strings.Fields(string(out)) {
		n++
		for _, b := range banned {
			if pkg == b.prefix || strings.HasPrefix(pkg, b.prefix) && (strings.HasSuffix(b.prefix, "/") || strings.HasPrefix(pkg[len(b.prefix):], "/")) {
				t.Errorf("edgefence links %s: %s", pkg, b.why)
			}
		}
	}
	t.Logf("%d packages linked (tags %q)", n, shipTags(t))
}

// archived are modules no package of ours may import, in product or test
// code: archived upstream, each with a maintained successor.
var archived = map[string]string{
	"gopkg.in/yaml.v3": "go.yaml.in/yaml/v3",
}

// TestNoArchivedImports: no package of the module, tests included, imports
// an archived module. (gopkg.in/yaml.v3 may stay in go.mod as indirect: the
// sandbox's MQTT broker, mochi, imports it in its auth hook.)
func TestNoArchivedImports(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	cmd := exec.Command("go", "list", "-test", "-f", `{{.ImportPath}}{{"\t"}}{{join .Imports " "}}`, "github.com/edgefence/edgefence/...")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imps, _ := strings.Cut(l, "\t")
		for _, imp := range strings.Fields(imps) {
			for old, succ := range archived {
				if imp == old || strings.HasPrefix(imp, old+"/") {
					t.Errorf("%s imports %s (archived): import %s", pkg, imp, succ)
				}
			}
		}
	}
}

// TestBinarySize builds the agent as `make cross` ships it for a Raspberry Pi
// 4/5 (linux/arm64, static, stripped) and holds it to the 16 MB budget
// (docs/BENCHMARKS.md §14). A size, not a time: the machine's speed does not
// matter.
func TestBinarySize(t *testing.T) {
	if testing.Short() {
		t.Skip("cross-builds the agent")
	}
	const budget = 16_000_000
	out := filepath.Join(t.TempDir(), "edgefence")
	cmd := exec.Command("go", "build", "-tags", shipTags(t), "-trimpath", "-ldflags=-s -w", "-o", out, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=arm64")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	fi, err := os.Stat(out)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("linux/arm64 stripped: %d bytes (budget %d)", fi.Size(), budget)
	if fi.Size() > budget {
		t.Errorf("linux/arm64 agent is %d bytes, over the %d byte budget: see TestDependencies and `go tool nm -size -sort size`", fi.Size(), budget)
	}
}

// failpointMarks are what a build with the failpoints compiled in carries:
// symbols (`go tool nm`) and strings. The shipped binaries have none.
var failpointMarks = struct{ symbols, strings []string }{
	symbols: []string{"main.failpoint", "main.unsafeFlags", unfencedKindSymbol},
	strings: []string{"EDGEFENCE_FAILPOINTS", "unsafe-no-fence"},
}

// unfencedKindSymbol is the unfenced simulated device's constructor
// (devices/sim, -tags edgefence_unsafe only).
const unfencedKindSymbol = "github.com/edgefence/edgefence/devices/sim.openUnfenced"

// failpointsIn builds ./cmd/<name> with tags (not stripped: nm needs the
// symbol table) and returns the failpoint symbols and strings it carries.
func failpointsIn(t *testing.T, name, tags string) []string {
	t.Helper()
	out := filepath.Join(t.TempDir(), name)
	cmd := exec.Command("go", "build", "-tags", tags, "-trimpath", "-o", out, "../"+name)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", name, err, b)
	}
	nm, err := exec.Command("go", "tool", "nm", out).Output()
	if err != nil {
		t.Fatalf("go tool nm %s: %v", name, err)
	}
	var found []string
	for _, l := range strings.Split(string(nm), "\n") {
		if f := strings.Fields(l); len(f) >= 3 && slices.Contains(failpointMarks.symbols, f[len(f)-1]) {
			found = append(found, "symbol "+f[len(f)-1])
		}
	}
	bin, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range failpointMarks.strings {
		if bytes.Contains(bin, []byte(s)) {
			found = append(found, "string "+s)
		}
	}
	return found
}

// TestShippedBinaryHasNoFailpoints: the agent and the device simulator, as
// `make cross` ships them (the Makefile's SHIPTAGS), carry no failpoint; built
// with -tags edgefence_unsafe (`make build`, the tests' binaries) they do,
// which shows the check sees them.
func TestShippedBinaryHasNoFailpoints(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries")
	}
	for _, name := range []string{"edgefence", "edgefence-devsim"} {
		if found := failpointsIn(t, name, shipTags(t)); len(found) > 0 {
			t.Errorf("%s built with -tags %s carries failpoints: %s", name, shipTags(t), strings.Join(found, ", "))
		}
		found := failpointsIn(t, name, shipTags(t)+",edgefence_unsafe")
		if !slices.ContainsFunc(found, func(f string) bool { return strings.HasPrefix(f, "symbol ") }) {
			t.Errorf("%s built with edgefence_unsafe: %q, no failpoint symbol: the check does not see them (failpointMarks)", name, found)
		} else if name == "edgefence-devsim" && !slices.Contains(found, "symbol "+unfencedKindSymbol) {
			t.Errorf("%s built with edgefence_unsafe: %q, no %s: the check does not see the unfenced device kind", name, found, unfencedKindSymbol)
		} else {
			t.Logf("%s with edgefence_unsafe: %s", name, strings.Join(found, ", "))
		}
	}
}
