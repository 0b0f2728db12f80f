package chaos

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgefence/edgefence/internal/sandbox"
)

// TestKillDeviceRoundCDevice runs the kill-devsim round with the C device
// serving the shim devices: it is SIGKILLed and restarted while both
// agents send, and the history its fence points wrote (accepts before the
// mark's commit, the durable mark at every start) passes I1 and I4 with
// the agents' records. No sanitizer report in its logs.
func TestKillDeviceRoundCDevice(t *testing.T) {
	bin := sandbox.CDeviceForTest(t)
	dir := t.TempDir()
	res := runRound(t, Config{CDeviceBin: bin, Dir: dir, Load: 4 * time.Second}, FaultKillDevsim)
	accepted := 0
	for _, e := range res.Events {
		if e.Source == "shim" && e.Verdict == "accepted" {
			accepted++
		}
	}
	if accepted == 0 {
		t.Fatal("the C device recorded no accept: the round proves nothing about it")
	}
	logs, _ := filepath.Glob(filepath.Join(dir, "devsim-*.log"))
	for _, l := range logs {
		b, err := os.ReadFile(l)
		if err != nil {
			t.Fatal(err)
		}
		if r := sandbox.SanitizerReport(b); r != "" {
			t.Fatalf("%s: %s", filepath.Base(l), r)
		}
	}
	t.Logf("%d accepts recorded by the C device's fence points; %d device logs clean", accepted, len(logs))
}
