package shadow

import "testing"

// The twin cache's commits are fsynced (see offline.TestOpenSyncs).
func TestOpenCacheSyncs(t *testing.T) {
	c, err := OpenCache(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.db.NoSync || c.db.NoGrowSync {
		t.Fatalf("twin cache opened with NoSync=%v NoGrowSync=%v", c.db.NoSync, c.db.NoGrowSync)
	}
}
