package chaos

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/edgefence/edgefence/agent/jobs"
	"github.com/edgefence/edgefence/devices/fwjob"
)

// TestFirmwareEndChecks: the firmware round's end checks pass devices
// committed on the job's image with succeeded executions, and fail each
// way a device or an execution can end otherwise.
func TestFirmwareEndChecks(t *testing.T) {
	img, old := sha256.Sum256([]byte("new image")), sha256.Sum256([]byte("factory image"))
	sum := hex.EncodeToString(img[:])
	good := func() (map[string]deviceEnd, []jobs.Execution) {
		st := fwjob.Status{Job: fwJobID, State: fwjob.Committed, Slot: "b", Active: "b", ActiveImage: img[:]}
		return map[string]deviceEnd{"d1": {st: st, slot: img[:]}},
			[]jobs.Execution{{Job: fwJobID, Device: "d1", Status: jobs.Succeeded}}
	}
	ends, execs := good()
	if vs := firmwareEnd([]string{"d1"}, execs, ends, sum); len(vs) != 0 {
		t.Fatalf("clean end: %v", vs)
	}
	for _, tc := range []struct {
		name, inv, detail string
		spoil             func(e *deviceEnd, x *jobs.Execution)
	}{
		{"execution failed", InvariantJobEnd, `ended "failed" (boom)`, func(_ *deviceEnd, x *jobs.Execution) {
			x.Status, x.Reason = jobs.Failed, "boom"
		}},
		{"rolled back", InvariantImage, "not committed", func(e *deviceEnd, _ *jobs.Execution) {
			e.st.State, e.st.Active, e.st.Slot, e.st.ActiveImage = fwjob.RolledBack, "a", "a", old[:]
		}},
		{"still on trial", InvariantImage, `trial "b"`, func(e *deviceEnd, _ *jobs.Execution) {
			e.st.Active, e.st.Trial = "a", "b"
		}},
		{"slot bytes differ", InvariantImage, "active slot b holds", func(e *deviceEnd, _ *jobs.Execution) {
			e.slot = old[:]
		}},
		{"state unreadable", InvariantImage, "unreadable: no db", func(e *deviceEnd, _ *jobs.Execution) {
			e.err = errors.New("no db")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ends, execs := good()
			e := ends["d1"]
			tc.spoil(&e, &execs[0])
			ends["d1"] = e
			vs := firmwareEnd([]string{"d1"}, execs, ends, sum)
			if len(vs) != 1 || vs[0].Invariant != tc.inv || vs[0].Device != "d1" || !strings.Contains(vs[0].Detail, tc.detail) {
				t.Fatalf("want one %s about d1 with %q, got %v", tc.inv, tc.detail, vs)
			}
		})
	}
	if vs := firmwareEnd([]string{"d1", "d2"}, execs, ends, sum); len(vs) != 2 {
		t.Fatalf("a device without execution nor state: %v", vs)
	}
}
