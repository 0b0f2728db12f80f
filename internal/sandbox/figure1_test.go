package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgefence/edgefence/fence"
)

// The Figure 1 tests run the real binaries: two agents (edgefence run) and
// the device simulator (edgefence-devsim) as subprocesses, against a real
// etcd and a real broker, and freeze the holder with SIGSTOP.

var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

// binaries builds cmd/edgefence and cmd/edgefence-devsim once per test run
// (with the race detector when the tests have it).
func binaries(t testing.TB) (agentBin, devsimBin string) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the real binaries; skipped with -short")
	}
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "edgefence-e2e-bin-")
		if binErr != nil {
			return
		}
		binErr = BuildCommands(context.Background(), binDir, raceEnabled, "edgefence", "edgefence-devsim")
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return filepath.Join(binDir, "edgefence"), filepath.Join(binDir, "edgefence-devsim")
}

// runFigure1 runs the scenario on a fresh world: etcd and an in-process mochi
// broker that requires credentials (mutate may swap the broker).
func runFigure1(t *testing.T, mutate func(*Figure1Config)) *Figure1Result {
	t.Helper()
	agentBin, devsimBin := binaries(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	e := startEtcd(t, EtcdConfig{Dir: t.TempDir(), Fast: true})
	auth, err := NewBrokerAuth("")
	if err != nil {
		t.Fatal(err)
	}
	b := startBroker(t, BrokerConfig{Auth: auth}) // every process logs in (Figure1Config.Auth)
	var narration strings.Builder
	cfg := Figure1Config{AgentBin: agentBin, DevsimBin: devsimBin, Dir: t.TempDir(), Etcd: e.Endpoint(), MQTT: b.URL(), Narrate: &narration,
		Auth: auth}
	if mutate != nil {
		mutate(&cfg)
	}
	res, err := RunFigure1(ctx, cfg)
	t.Logf("timeline:\n%s", narration.String())
	if os.Getenv("FIG1_DUMP") != "" {
		dumpLogs(t, cfg.Dir)
	}
	if err != nil {
		dumpLogs(t, cfg.Dir)
		t.Fatal(err)
	}
	return res
}

func dumpLogs(t *testing.T, dir string) {
	for _, f := range []string{"gw-a.log", "gw-b.log", "devsim.log"} {
		if b, err := os.ReadFile(filepath.Join(dir, f)); err == nil {
			t.Logf("--- %s\n%s", f, b)
		}
	}
}

// checkLateRefusedAtDevice asserts that the device itself saw and refused
// A's late commands: the fence point, not the agent, stopped them.
func checkLateRefusedAtDevice(t *testing.T, res *Figure1Result) {
	t.Helper()
	for d, late := range res.Late {
		if late.Verdict != "stale" {
			t.Errorf("%s: late command verdict %q (%s), want stale", d, late.Verdict, late.Error)
		}
		found := false
		for _, v := range res.Verdicts {
			if v.Device == d && v.Token == res.TokenA[d] && v.Verdict == fence.Stale && v.MaxToken == res.TokenB[d] {
				found = true
			}
		}
		if !found {
			t.Errorf("%s: no stale verdict for token %d in the device's log", d, res.TokenA[d])
		}
	}
}

func TestFigure1FrozenHolderIsFenced(t *testing.T) {
	res := runFigure1(t, nil)
	if err := res.CheckFenced(); err != nil {
		t.Fatal(err)
	}
	checkLateRefusedAtDevice(t, res)
	checkEveryCommandHasOneVerdict(t, res)
}

// TestFigure1WithoutFenceCorrupts runs the same schedule with the device
// fence switched off: the stale holder's write lands and overwrites B's. It
// shows the test above would fail without the fence.
func TestFigure1WithoutFenceCorrupts(t *testing.T) {
	res := runFigure1(t, func(c *Figure1Config) { c.NoFence = true })
	if n := res.Corrupted(); n != len(res.Values) || n == 0 {
		t.Fatalf("%d of %d devices corrupted without the fence; want all", n, len(res.Values))
	}
	if err := res.CheckFenced(); err == nil {
		t.Fatal("CheckFenced passed without the fence: the check cannot fail")
	}
}

// TestFigure1DeviceRestart kills the devices (SIGKILL) after B's command and
// restarts them on their stored state before A's late command arrives: the
// high-water mark survived, so the command is still refused.
func TestFigure1DeviceRestart(t *testing.T) {
	res := runFigure1(t, func(c *Figure1Config) { c.RestartDevicesBeforeLate = true })
	if err := res.CheckFenced(); err != nil {
		t.Fatal(err)
	}
	checkLateRefusedAtDevice(t, res)
}

// TestFigure1NormalAgent runs A without the failpoint: it may notice its
// loss and refuse locally (I6) or send and be refused at the device (I1);
// either way nothing stale lands.
func TestFigure1NormalAgent(t *testing.T) {
	res := runFigure1(t, func(c *Figure1Config) { c.AgentAFailpoints = "none" })
	if err := res.CheckFenced(); err != nil {
		t.Fatal(err)
	}
	for d, l := range res.Late {
		t.Logf("%s: late command: verdict %q error %q", d, l.Verdict, l.Error)
	}
}

func TestFigure1Mosquitto(t *testing.T) {
	m, err := StartMosquitto(t.Context(), t.TempDir())
	if errors.Is(err, ErrNoMosquitto) {
		if os.Getenv("CI") == "true" {
			t.Fatal("mosquitto is required under CI=true (make deps installs it)")
		}
		t.Skip("mosquitto not installed (make deps installs it)")
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	res := runFigure1(t, func(c *Figure1Config) { c.MQTT, c.Auth = m.URL(), nil })
	if err := res.CheckFenced(); err != nil {
		t.Fatal(err)
	}
	checkLateRefusedAtDevice(t, res)
	checkEveryCommandHasOneVerdict(t, res)
}

// checkEveryCommandHasOneVerdict: every command id in the device log ends
// with one decision; redeliveries are duplicates of an accepted command,
// never a second accept.
func checkEveryCommandHasOneVerdict(t *testing.T, res *Figure1Result) {
	t.Helper()
	accepted := map[string]int{}
	ids := map[string]bool{}
	for _, v := range res.Verdicts {
		ids[v.ID] = true
		if v.Verdict == fence.Accepted {
			accepted[v.ID]++
		}
	}
	for id, n := range accepted {
		if n > 1 {
			t.Errorf("command %s accepted %d times", id, n)
		}
	}
	// A's first, B's, and A's late command for every device reached the
	// device and got a verdict.
	want := 3 * len(res.TokenA)
	if len(ids) != want {
		t.Errorf("%d distinct commands in the device log, want %d", len(ids), want)
	}
}

// TestFigure1SerialGatewayFence: the same timeline against a legacy device
// on a serial line that cannot check tokens. B is its home gateway; A's late
// write goes through B's fence table, is refused as stale, and never reaches
// the wire: the device's applied log has no write of A after B's first.
func TestFigure1SerialGatewayFence(t *testing.T) {
	res := runFigure1(t, func(c *Figure1Config) { c.Serial = true; c.Devices = []string{"plc-1"} })
	if err := res.CheckFenced(); err != nil {
		t.Fatal(err)
	}
	if v := res.Late["plc-1"].Verdict; v != "stale" {
		t.Fatalf("late write: %+v", res.Late["plc-1"])
	}
	sawB := false
	for _, a := range res.Applied {
		if a.Values[0] == uint16(SetpointB) {
			sawB = true
		}
		if sawB && a.Values[0] == uint16(SetpointLate) {
			t.Fatalf("A's write applied after B's: %+v", res.Applied)
		}
	}
	if len(res.Applied) != 2 {
		t.Fatalf("applied %+v, want A's first and B's", res.Applied)
	}
}

// TestFigure1SerialWithoutTableCorrupts: B's fence table switched off, the
// same schedule lands A's stale write on the device.
func TestFigure1SerialWithoutTableCorrupts(t *testing.T) {
	res := runFigure1(t, func(c *Figure1Config) { c.Serial = true; c.Devices = []string{"plc-1"}; c.NoFence = true })
	if res.Corrupted() != 1 {
		t.Fatalf("final %v, want the stale holder's %g", res.Values, SetpointLate)
	}
	if err := res.CheckFenced(); err == nil {
		t.Fatal("CheckFenced passed without the table")
	}
}
