package offline_test

import (
	"errors"
	"testing"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/offline"
)

// TestLeaseAndIssuedSurviveReopen: the session lease and each device's
// highest issued (token, seq) are read back after the file is closed and
// opened again (what a restarted agent needs to re-attach), Issued only
// ever rises — a reissued or late-appended lower command does not lower it
// — and both are readable from a read-only open.
func TestLeaseAndIssuedSurviveReopen(t *testing.T) {
	path := dbPath(t)
	ob, err := offline.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if id, err := ob.Lease(); err != nil || id != 0 {
		t.Fatalf("lease of a new file: %d %v", id, err)
	}
	if err := ob.SetLease(0x4828a2339c6d1b04); err != nil {
		t.Fatal(err)
	}
	appendOK(t, ob, entry("d1", "a", 5, 1))
	appendOK(t, ob, entry("d1", "b", 5, 2))
	appendOK(t, ob, entry("d1", "c", 4, 9)) // an older token, appended later
	appendOK(t, ob, entry("d2", "d", 7, 3))
	ob.Close()

	for _, ro := range []bool{false, true} {
		ob := open(t, path, &offline.Options{ReadOnly: ro})
		if id, err := ob.Lease(); err != nil || id != 0x4828a2339c6d1b04 {
			t.Fatalf("read-only %v: lease %x %v", ro, id, err)
		}
		for dev, want := range map[string]fence.Mark{"d1": {Token: 5, Seq: 2}, "d2": {Token: 7, Seq: 3}, "d3": {}} {
			tok, seq, err := ob.Issued(dev)
			if err != nil || tok != want.Token || seq != want.Seq {
				t.Fatalf("read-only %v: issued %s = %d/%d %v, want %+v", ro, dev, tok, seq, err, want)
			}
		}
		if ro {
			if err := ob.SetLease(1); !errors.Is(err, offline.ErrReadOnly) {
				t.Fatalf("SetLease on a read-only open: %v", err)
			}
		}
		ob.Close()
	}
}
