package bridge

import (
	"errors"
	"testing"
)

// TestUnsafeNoTableRefused: a shipped build has no way to run the bridge
// without its fence table (make test runs this without the tag).
func TestUnsafeNoTableRefused(t *testing.T) {
	tbl, err := NoTable(nil)
	if unsafeBuild {
		if err != nil || tbl == nil {
			t.Fatalf("NoTable in a test build: %v, %v", tbl, err)
		}
		return
	}
	if !errors.Is(err, ErrUnsafeBuild) || tbl != nil {
		t.Fatalf("NoTable in a shipped build: %v, %v; want ErrUnsafeBuild", tbl, err)
	}
}
