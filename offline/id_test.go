package offline_test

import (
	"regexp"
	"testing"
	"time"

	"github.com/edgefence/edgefence/offline"
)

// Command ids are 32 lowercase hex digits, sort by the millisecond they
// were made in, and do not repeat within one.
func TestNewCommandID(t *testing.T) {
	hex32 := regexp.MustCompile(`^[0-9a-f]{32}$`)
	t0 := time.UnixMilli(1_796_000_000_000)
	prev := ""
	for i := range 1000 {
		id := offline.NewCommandID(t0.Add(time.Duration(i) * time.Millisecond))
		if !hex32.MatchString(id) {
			t.Fatalf("%q: not 32 hex digits", id)
		}
		if id <= prev {
			t.Fatalf("%q made a millisecond after %q sorts before it", id, prev)
		}
		prev = id
	}
	if got, want := offline.NewCommandID(t0)[:12], "01a229f12800"; got != want {
		t.Fatalf("time part %s, want %s (%d ms)", got, want, t0.UnixMilli())
	}
	seen := map[string]bool{}
	for range 100_000 {
		id := offline.NewCommandID(t0)
		if seen[id] {
			t.Fatalf("%s made twice in one millisecond", id)
		}
		seen[id] = true
	}
}
