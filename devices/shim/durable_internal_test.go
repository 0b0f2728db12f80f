package shim

import (
	"path/filepath"
	"testing"
)

// The shim persists its high-water mark with fsync before a command takes
// effect: the file is never opened with NoSync or NoGrowSync (kill -9
// tests cannot see a missing fsync; this guards the setting).
func TestOpenSyncs(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "shim.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.db.NoSync || s.db.NoGrowSync {
		t.Fatalf("shim opened with NoSync=%v NoGrowSync=%v", s.db.NoSync, s.db.NoGrowSync)
	}
}
