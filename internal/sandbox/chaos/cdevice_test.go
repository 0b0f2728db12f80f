package chaos

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/edgefence/edgefence/fence/history"
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

// TestFirmwareRoundCDevice runs the firmware-failover round with the C
// device (efsdev --firmware under edgefence-devsim's supervisor, one per
// device): holders stopped and killed mid-job, devices killed (power
// loss) and restarted; the history its fence points wrote (a step's accept
// before its mark, with its job) passes I1, I4 and FW1, every device
// activated the job once and every execution succeeded. No sanitizer
// report in the devices' logs.
func TestFirmwareRoundCDevice(t *testing.T) {
	bin := sandbox.CDeviceForTest(t)
	dir := t.TempDir()
	res := runRound(t, Config{CDeviceBin: bin, Dir: dir}, FaultFirmware)
	checkFirmwareRound(t, res)
	logs, _ := filepath.Glob(filepath.Join(dir, "devices", "*", "devsim.log"))
	if len(logs) == 0 {
		t.Fatal("no device logs")
	}
	for _, l := range logs {
		b, err := os.ReadFile(l)
		if err != nil {
			t.Fatal(err)
		}
		if r := sandbox.SanitizerReport(b); r != "" {
			t.Fatalf("%s: %s", l, r)
		}
	}
}

// TestKeyRotatedRoundCDevice runs the key-rotated round with the C device
// serving the shim devices: its history names the signer of each accept
// and the revocation list it took over the air, so T1 covers it, and the
// round's command signed by the revoked key reaches it and is refused.
func TestKeyRotatedRoundCDevice(t *testing.T) {
	bin := sandbox.CDeviceForTest(t)
	dir := t.TempDir()
	res := runRound(t, Config{CDeviceBin: bin, Dir: dir, Load: 4 * time.Second}, FaultRotated)
	signers, lists := map[string]int{}, 0
	for _, e := range res.Events {
		switch {
		case e.Source == "shim" && e.Op == history.OpTrust && slices.Contains(e.Revoked, "gw-a/1"):
			lists++
		case e.Source == "shim" && e.Verdict == "accepted":
			signers[e.Signer]++
		}
	}
	if lists == 0 || signers["gw-a/1"] == 0 || signers["gw-a/2"]+signers["gw-b/1"] == 0 || signers[""] != 0 {
		t.Fatalf("the C device's history: %d lists revoking gw-a/1, accepts by signer %v", lists, signers)
	}
	if res.Faults[FaultLate] != 1 {
		t.Fatalf("no late command of the revoked key sent: %v", res.Faults)
	}
	t.Logf("accepts by signer %v; %d revocation lists recorded", signers, lists)
}
