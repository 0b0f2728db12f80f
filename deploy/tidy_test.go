package deploy_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestTidyCheck: `make tidy-check` (run by `make lint`) passes on this tree
// and fails, naming the diff, on a copy whose go.mod marks a directly
// imported module indirect. The copy holds the Go files, go.mod, go.sum and
// the Makefile: all that go mod tidy reads.
func TestTidyCheck(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: go mod tidy may fetch test dependencies of dependencies")
	}
	mk := tool(t, "make", "apt-get install make")
	git := tool(t, "git", "apt-get install git")

	dir := t.TempDir()
	files := run(t, time.Minute, repoRoot, nil, git, "ls-files", "--cached", "--others", "--exclude-standard", "-z")
	for _, f := range strings.Split(strings.TrimRight(string(files), "\x00"), "\x00") {
		if !strings.HasSuffix(f, ".go") && f != "go.mod" && f != "go.sum" && f != "Makefile" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(repoRoot, f))
		if os.IsNotExist(err) {
			continue // deleted in the work tree, not yet in the index
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	if out, err := runErr(t, 5*time.Minute, dir, nil, mk, "-s", "tidy-check"); err != nil {
		t.Fatalf("make tidy-check on the tree: %v\n%s", err, out)
	}

	gomod := filepath.Join(dir, "go.mod")
	b, err := os.ReadFile(gomod)
	if err != nil {
		t.Fatal(err)
	}
	// go.etcd.io/etcd/client/v3 is imported by agent: a direct requirement.
	direct := regexp.MustCompile(`(?m)^\tgo\.etcd\.io/etcd/client/v3 v\S+$`).Find(b)
	if direct == nil {
		t.Fatal("go.mod requires no go.etcd.io/etcd/client/v3 directly: nothing to untidy")
	}
	indirect := append(slices.Clone(direct), " // indirect"...)
	b = bytes.Replace(b, direct, indirect, 1)
	if err := os.WriteFile(gomod, b, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := runErr(t, 5*time.Minute, dir, nil, mk, "-s", "tidy-check")
	var ee *exec.ExitError
	if !errors.As(err, &ee) || !bytes.Contains(out, []byte("not tidy")) || !bytes.Contains(out, append([]byte("-"), indirect...)) {
		t.Fatalf("make tidy-check with go.etcd.io/etcd/client/v3 marked indirect: %v, want a failure that shows the diff:\n%s", err, out)
	}
}
