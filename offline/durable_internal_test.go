package offline

import (
	"path/filepath"
	"testing"
)

// Every commit of the outbox is fsynced before it returns: the file is
// never opened with bbolt's NoSync or NoGrowSync. (kill -9 tests cannot
// see a missing fsync — the page cache survives them — so this guards the
// setting itself.)
func TestOpenSyncs(t *testing.T) {
	ob, err := Open(filepath.Join(t.TempDir(), File), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ob.Close()
	if ob.db.NoSync || ob.db.NoGrowSync {
		t.Fatalf("outbox opened with NoSync=%v NoGrowSync=%v", ob.db.NoSync, ob.db.NoGrowSync)
	}
}
