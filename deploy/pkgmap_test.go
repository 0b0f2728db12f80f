package deploy_test

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestPackageMapMatchesTree: the package table of docs/ARCHITECTURE.md
// ("## Packages") names every package of the module, and nothing that is
// not one, so that a reader of the map finds the tree it describes.
func TestPackageMapMatchesTree(t *testing.T) {
	out, err := exec.Command("go", "list", "-tags", "edgefence_unsafe", "-f", "{{.ImportPath}}", "../...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	const module = "github.com/edgefence/edgefence/"
	var tree []string
	for _, p := range strings.Fields(string(out)) {
		tree = append(tree, strings.TrimPrefix(p, module))
	}
	docs, err := packageMap(filepath.Join("..", "docs", "ARCHITECTURE.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range tree {
		if !slices.Contains(docs, p) {
			t.Errorf("package %s is not in docs/ARCHITECTURE.md's package table", p)
		}
	}
	for _, p := range docs {
		if !slices.Contains(tree, p) {
			t.Errorf("docs/ARCHITECTURE.md's package table names %s, which go list does not know", p)
		}
	}
}

// packageMap returns the packages the "## Packages" table of the
// architecture document names: the first backquoted word of each row,
// without a trailing slash.
func packageMap(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var pkgs []string
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "## "):
			in = line == "## Packages"
		case in && strings.HasPrefix(line, "| `"):
			name, _, _ := strings.Cut(strings.TrimPrefix(line, "| `"), "`")
			pkgs = append(pkgs, strings.TrimSuffix(name, "/"))
		}
	}
	return pkgs, sc.Err()
}
