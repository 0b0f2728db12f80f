package chaos

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgefence/edgefence/fence/history"
	"github.com/edgefence/edgefence/internal/sandbox"
)

var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

// binaries builds the agent, the device simulator and the sandbox once per
// test run (with the race detector when the tests have it).
func binaries(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("runs the real binaries against real servers; skipped with -short")
	}
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "edgefence-chaos-bin-")
		if binErr != nil {
			return
		}
		binErr = sandbox.BuildCommands(context.Background(), binDir, raceEnabled, "edgefence", "edgefence-devsim", "edgefence-sandbox")
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binDir
}

func TestMain(m *testing.M) {
	if err := sandbox.QuickRaceExit(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	sandbox.RemoveTestCDevice()
	os.Exit(code)
}

func logger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, nil))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// runRound runs one round and fails the test on an error or a violation,
// showing the logs of the round.
func runRound(t *testing.T, cfg Config, scenario string) *Result {
	t.Helper()
	if scenario == FaultPartition {
		if err := sandbox.NetLabSupported(); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("network namespaces are required under CI=true: %v", err)
			}
			t.Skipf("network namespaces unavailable here: %v", err)
		}
	}
	cfg.Bin = binaries(t)
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
		if keep := os.Getenv("CHAOS_KEEP"); keep != "" { // keep the round's files for a look
			cfg.Dir = filepath.Join(keep, strings.ReplaceAll(t.Name(), "/", "_"))
			os.RemoveAll(cfg.Dir)
		}
	}
	if cfg.Seed == 0 {
		cfg.Seed = uint64(time.Now().UnixNano())
	}
	cfg.Logger = logger(t)
	res, err := Run(t.Context(), cfg, scenario)
	if err != nil || !res.OK() {
		dumpLogs(t, cfg.Dir)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("seed %d, %v, faults %v, sends %d\n%s", res.Seed, res.Elapsed.Round(time.Millisecond), res.Faults, res.Sends, res.Report.String())
	if !res.OK() {
		t.Fatalf("%d violations", len(res.Report.Violations))
	}
	if res.Report.Created == 0 {
		t.Fatal("no command was created: the round proves nothing")
	}
	for k := range res.Faults {
		if res.Faults[k] == 0 {
			t.Fatalf("fault %s never injected", k)
		}
	}
	if len(res.Faults) == 0 {
		t.Fatal("no fault injected")
	}
	return res
}

func dumpLogs(t *testing.T, dir string) {
	t.Helper()
	logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		if len(b) > 6000 {
			b = b[len(b)-6000:]
		}
		t.Logf("==== %s (tail)\n%s", filepath.Base(l), b)
	}
}

// TestScenarios runs every fault scenario once, with randomized timing,
// and checks I1 and I4 on the recorded history. It runs beside
// TestBrokerOutageSixtySeconds, which mostly waits out its outage (every
// round has its own etcd, broker, ports, namespaces and directory).
func TestScenarios(t *testing.T) {
	t.Parallel()
	for _, sc := range Scenarios() {
		t.Run(sc, func(t *testing.T) {
			res := runRound(t, Config{}, sc)
			switch sc {
			case FaultFirmware:
				checkFirmwareRound(t, res)
			case FaultReset:
				checkResetRound(t, res)
			}
		})
	}
}

// checkFirmwareRound: the firmware round's history holds the devices'
// firmware steps (so I1 and FW1 were checked on them), every device
// activated the job once and every execution succeeded.
func checkFirmwareRound(t *testing.T, res *Result) {
	t.Helper()
	fw := res.Report.Firmware
	devs := 4 // Config.Devices' default
	if fw.Accepted["fw.begin"] < devs || fw.Accepted["fw.chunk"] < devs*fwImageSize/fwChunk || fw.Activated != devs || fw.Jobs != devs {
		t.Fatalf("firmware steps in the checked history: %+v", fw)
	}
	if res.Executions["succeeded"] != devs {
		t.Fatalf("executions %v", res.Executions)
	}
	t.Logf("executions %v; firmware steps accepted %v", res.Executions, fw.Accepted)
}

// checkResetRound: the reset round's history holds each reset at its fence
// point (history.OpEpoch with the reset's id) and commands accepted in the
// reset's epoch after it, so T2 was checked on them; commands captured
// before were replayed.
func checkResetRound(t *testing.T, res *Result) {
	t.Helper()
	moved := map[string]uint64{} // device → the epoch its reset moved it to
	after := map[string]int{}    // device → accepts in that epoch after the reset
	for _, e := range res.Events {
		switch {
		case e.Op == history.OpEpoch && e.ID != "" && e.Device != "":
			moved[e.Device] = e.Epoch
		case e.Op == history.OpVerdict && e.Verdict == "accepted" && moved[e.Device] != 0 && e.Epoch == moved[e.Device]:
			after[e.Device]++
		}
	}
	if len(moved) == 0 || res.Faults[FaultReset] != len(moved) || res.Faults[FaultReplayed] == 0 {
		t.Fatalf("resets recorded %v, faults %v", moved, res.Faults)
	}
	for dev := range moved {
		if after[dev] == 0 {
			t.Fatalf("%s: no command accepted in its reset's epoch %d", dev, moved[dev])
		}
	}
	t.Logf("resets recorded %v; accepts in their epochs after %v; %d captured commands replayed", moved, after, res.Faults[FaultReplayed])
}

// TestCheckerCatchesViolations: the checker the suite relies on fails a
// history with a stale accept and one with a lost command.
func TestCheckerCatchesViolations(t *testing.T) {
	ok := []history.Event{
		{Op: history.OpCreated, Device: "d1", ID: "a", Token: 5, Seq: 1},
		{Op: history.OpVerdict, Source: "shim", Device: "d1", ID: "a", Token: 5, Seq: 1, Verdict: "accepted"},
		{Op: history.OpTerminal, Device: "d1", ID: "a", Token: 5, Seq: 1, Verdict: "accepted"},
		{Op: history.OpCreated, Device: "d1", ID: "b", Token: 7, Seq: 1},
		{Op: history.OpVerdict, Source: "shim", Device: "d1", ID: "b", Token: 7, Seq: 1, Verdict: "accepted"},
		{Op: history.OpTerminal, Device: "d1", ID: "b", Token: 7, Seq: 1, Verdict: "accepted"},
	}
	if r := history.Check(ok); !r.OK() {
		t.Fatalf("clean history fails: %v", r.Violations)
	}
	stale := append(append([]history.Event(nil), ok...),
		history.Event{Op: history.OpCreated, Device: "d1", ID: "c", Token: 5, Seq: 2},
		history.Event{Op: history.OpVerdict, Source: "shim", Device: "d1", ID: "c", Token: 5, Seq: 2, Verdict: "accepted"},
		history.Event{Op: history.OpTerminal, Device: "d1", ID: "c", Token: 5, Seq: 2, Verdict: "accepted"})
	if r := history.Check(stale); r.OK() || r.Violations[0].Invariant != history.InvariantOrder {
		t.Fatalf("stale accept not caught: %+v", r.Violations)
	}
	lost := append(append([]history.Event(nil), ok...), history.Event{Op: history.OpCreated, Device: "d1", ID: "d", Token: 7, Seq: 2})
	if r := history.Check(lost); r.OK() || r.Violations[0].Invariant != history.InvariantFate {
		t.Fatalf("lost command not caught: %+v", r.Violations)
	}
}

// TestBrokerOutageSixtySeconds: the broker is down for 60 s while commands
// flow for 20 devices. After it returns every command has exactly one
// terminal state, none is applied twice, and each device applied its
// commands in order (I1 in the checker: accepted (token, seq) strictly
// increase per device).
func TestBrokerOutageSixtySeconds(t *testing.T) {
	outage := 60 * time.Second
	if testing.Short() {
		t.Skip("a 60 s outage; skipped with -short")
	}
	t.Parallel() // beside TestScenarios: the outage is mostly waiting
	res := runRound(t, Config{Devices: 20, Outage: outage, Load: outage + 10*time.Second, Pause: 200 * time.Millisecond}, FaultBroker)
	if d := res.FaultEnd.Sub(res.FaultStart); d < outage {
		t.Fatalf("the outage lasted %v", d)
	}
	// Commands were created during the outage and delivered after it.
	during := 0
	for _, e := range res.Events {
		if e.Op == history.OpCreated && e.Time.After(res.FaultStart) && e.Time.Before(res.FaultEnd) {
			during++
		}
	}
	if during < 20 {
		t.Fatalf("only %d commands created during the outage", during)
	}
	t.Logf("%d commands created during the 60 s outage, all delivered after it", during)
}

// TestEtcdOutageTakeover: gateway A is cut from etcd (and the broker) for
// longer than its lease TTL; B takes its devices over and commands them.
// Every command A queued during the cut for a device B commanded meanwhile
// ends stale — recorded in A's outbox, applied by no device. (A device B
// did not command during the cut may accept A's queued commands late: no
// newer holder reached it, and the fence allows that.)
func TestEtcdOutageTakeover(t *testing.T) {
	ttl := 2 * time.Second
	res := runRound(t, Config{TTL: ttl, Outage: 4 * ttl, Load: 4*ttl + 6*time.Second}, FaultPartition)
	during := func(e history.Event) bool { return e.Time.After(res.FaultStart) && e.Time.Before(res.FaultEnd) }
	accepted := map[string]bool{}
	byB := map[string]string{} // id → device, B's commands created during the cut
	for _, e := range res.Events {
		if e.Op == history.OpCreated && e.Source == "outbox:gw-b" && during(e) {
			byB[e.ID] = e.Device
		}
	}
	takenOver := map[string]bool{} // devices with an accepted command of B's created during the cut
	for _, e := range res.Events {
		if e.Op == history.OpVerdict && e.Verdict == "accepted" {
			accepted[e.ID] = true
			if dev, ok := byB[e.ID]; ok {
				takenOver[dev] = true
			}
		}
	}
	queued := map[string]history.Event{}
	for _, e := range res.Events {
		if e.Op == history.OpCreated && e.Source == "outbox:gw-a" && during(e) && takenOver[e.Device] {
			queued[e.ID] = e
		}
	}
	if len(takenOver) == 0 || len(queued) == 0 {
		t.Fatalf("nothing to check: B commanded %d devices during the cut, A queued %d commands for them", len(takenOver), len(queued))
	}
	stale, invalid := 0, 0
	for _, e := range res.Events {
		c, ok := queued[e.ID]
		if !ok || e.Op != history.OpTerminal {
			continue
		}
		// The load makes one command in 50 invalid on purpose; the device
		// may refuse such a one as invalid before it looks at the token.
		switch e.Verdict {
		case "stale":
			stale++
		case "invalid":
			invalid++
		default:
			t.Errorf("A's command %s to %s, queued during the cut, ended %s", e.ID, c.Device, e.Verdict)
		}
		if accepted[e.ID] {
			t.Errorf("A's command %s to %s, queued during the cut, was applied", e.ID, c.Device)
		}
	}
	if stale+invalid != len(queued) || stale == 0 {
		t.Errorf("of A's %d queued commands %d ended stale, %d invalid", len(queued), stale, invalid)
	}
	t.Logf("B took over %d devices; A queued %d commands for them during the cut: %d ended stale, %d invalid, none applied",
		len(takenOver), len(queued), stale, invalid)
}
