package fence

import (
	"path/filepath"
	"testing"
)

// The gateway fence table's admits are fsynced before the command can
// reach the wire: the file is never opened with NoSync or NoGrowSync
// (kill -9 tests cannot see a missing fsync; this guards the setting).
func TestOpenTableSyncs(t *testing.T) {
	tb, err := OpenTable(filepath.Join(t.TempDir(), "fence.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tb.Close()
	if tb.db.NoSync || tb.db.NoGrowSync {
		t.Fatalf("fence table opened with NoSync=%v NoGrowSync=%v", tb.db.NoSync, tb.db.NoGrowSync)
	}
}
