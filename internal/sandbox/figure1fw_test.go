package sandbox

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/edgefence/edgefence/agent/jobs"
	"github.com/edgefence/edgefence/fence"
)

// The firmware failover proofs (issue 15) on real processes: two agents
// (edgefence run), a firmware device (edgefence-devsim --firmware), the
// job made and read with the `edgefence job` CLI; the holder frozen or
// killed mid-download, after the install, during the device's reboot.

// runFigure1Firmware runs the scenario with fault on a fresh etcd and
// in-process broker, and checks its outcome.
func runFigure1Firmware(t *testing.T, fault FirmwareFault, opts ...func(*Figure1FirmwareConfig)) *Figure1FirmwareResult {
	t.Helper()
	agentBin, devsimBin := binaries(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	e := startEtcd(t, EtcdConfig{Dir: t.TempDir(), Fast: true})
	b := startBroker(t, BrokerConfig{})
	var narration strings.Builder
	cfg := Figure1FirmwareConfig{AgentBin: agentBin, DevsimBin: devsimBin, Dir: t.TempDir(), Etcd: e.Endpoint(), Broker: b,
		Fault: fault, Narrate: &narration}
	if fault != FaultFreezeMidDownload && fault != FaultKillMidDownload {
		cfg.ImageSize = 256 << 10 // the fault comes after the download: no need to make it last
	}
	for _, o := range opts {
		o(&cfg)
	}
	res, err := RunFigure1Firmware(ctx, cfg)
	t.Logf("timeline:\n%s", narration.String())
	if err != nil || os.Getenv("FIG1_DUMP") != "" {
		dumpLogs(t, cfg.Dir)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: B's first accepted step %v after the fault, committed %v after it", fault, res.ToFirstStep, res.ToCommitted)
	if err := res.Check(); err != nil {
		dumpLogs(t, cfg.Dir)
		t.Fatal(err)
	}
	return res
}

// TestFigure1FirmwareFrozenMidDownload: the holder is frozen as a chunk
// leaves it, past a third of the image; B takes the device, resumes from
// the device's bytes under its own token and finishes the job; A wakes,
// its held chunk and a late fw.activate through it are refused stale at
// the device.
func TestFigure1FirmwareFrozenMidDownload(t *testing.T) {
	res := runFigure1Firmware(t, FaultFreezeMidDownload)
	if len(res.Late) < 2 {
		t.Fatalf("late steps %+v; want A's chunk and its activate", res.Late)
	}
}

// TestFigure1FirmwareKilledMidDownload: kill -9 of the holder mid-download;
// B resumes from the device's bytes.
func TestFigure1FirmwareKilledMidDownload(t *testing.T) {
	runFigure1Firmware(t, FaultKillMidDownload)
}

// TestFigure1FirmwareFrozenAfterInstall: the holder is frozen as its
// fw.activate leaves it, the image installed; B activates and commits; A
// wakes, its held fw.activate and a late one through it are stale.
func TestFigure1FirmwareFrozenAfterInstall(t *testing.T) {
	runFigure1Firmware(t, FaultFreezeAfterInstall)
}

// TestFigure1FirmwareKilledAfterInstall: kill -9 of the holder once the
// device installed the image (its fw.activate lost with it); B activates
// and commits.
func TestFigure1FirmwareKilledAfterInstall(t *testing.T) {
	runFigure1Firmware(t, FaultKillAfterInstall)
}

// TestFigure1FirmwareKilledDuringReboot: kill -9 of the holder while the
// device reboots into the new image after A's fw.activate; B commits.
func TestFigure1FirmwareKilledDuringReboot(t *testing.T) {
	runFigure1Firmware(t, FaultKillDuringReboot)
}

// TestFigure1FirmwareFrozenDuringReboot: the holder is frozen while the
// device reboots into the new image after its fw.activate; B commits; A
// wakes, and a late fw.commit and fw.activate through it (and anything it
// sends on its own) are stale at the device.
func TestFigure1FirmwareFrozenDuringReboot(t *testing.T) {
	res := runFigure1Firmware(t, FaultFreezeDuringReboot)
	if len(res.Late) < 2 {
		t.Fatalf("late steps %+v; want A's commit and its activate", res.Late)
	}
}

// goodFirmwareRun is a result Check passes: A's chunks to 8 KiB, the
// freeze, B's last chunk, install, activate and commit, A's late chunk and
// activate refused.
func goodFirmwareRun() *Figure1FirmwareResult {
	const img = "00aa"
	st := func(h string, tok uint64, kind string, off uint64, v string) FirmwareStep {
		return FirmwareStep{Holder: h, Token: fence.Token(tok), Kind: kind, Off: off, Verdict: v}
	}
	late := []FirmwareStep{st("gw-a", 2, "fw.chunk", 8192, "stale"), st("gw-a", 2, "fw.activate", 0, "stale")}
	late[0].ID, late[1].ID = "c1", "a1"
	return &Figure1FirmwareResult{Fault: FaultFreezeMidDownload, Job: "j", Image: img, Size: 10000, Chunk: 4096,
		TokenA: 2, TokenB: 6, FaultAt: FirmwareReport{State: "downloading", Bytes: 8192},
		Execution:  jobs.Execution{Status: jobs.Succeeded, Gateway: "gw-b", Token: 6},
		Final:      FirmwareReport{Job: "j", State: "committed", Image: img, Slot: "b"},
		SlotSHA256: img,
		Steps: append([]FirmwareStep{st("gw-a", 2, "fw.begin", 0, "accepted"), st("gw-a", 2, "fw.chunk", 0, "accepted"),
			st("gw-a", 2, "fw.chunk", 4096, "accepted"), st("gw-b", 6, "fw.chunk", 8192, "accepted"),
			st("gw-b", 6, "fw.install", 0, "accepted"), st("gw-b", 6, "fw.activate", 0, "accepted"),
			st("gw-b", 6, "fw.commit", 0, "accepted")}, late...),
		Reports:        []FirmwareReport{{Job: "j", State: "confirming"}, {Job: "j", State: "committed"}, {Job: "j", State: "committed"}},
		Late:           late,
		LateActivate:   SendResult{Verdict: "stale"},
		AStale:         1,
		ALogStale:      []string{"fw.chunk", "fw.activate"},
		DeviceLogStale: []string{"c1", "a1"},
	}
}

// goodFrozenRebootRun is a result Check passes for the freeze during the
// reboot: A's whole download, install and activate, the freeze at the
// rebooting report, B's commit, A's late commit and activate refused.
func goodFrozenRebootRun() *Figure1FirmwareResult {
	r := goodFirmwareRun()
	r.Fault, r.FaultAt = FaultFreezeDuringReboot, FirmwareReport{State: "rebooting", Bytes: 10000, Token: 2}
	r.Steps = r.Steps[:3]
	r.Steps = append(r.Steps, FirmwareStep{Holder: "gw-a", Token: 2, Kind: "fw.chunk", Off: 8192, Verdict: "accepted"})
	for _, k := range []string{"fw.install", "fw.activate"} {
		r.Steps = append(r.Steps, FirmwareStep{Holder: "gw-a", Token: 2, Kind: k, Verdict: "accepted"})
	}
	r.Steps = append(r.Steps, FirmwareStep{Holder: "gw-b", Token: 6, Kind: "fw.commit", Verdict: "accepted"})
	r.Late = []FirmwareStep{{Holder: "gw-a", Token: 2, Kind: "fw.commit", Verdict: "stale", ID: "c1"},
		{Holder: "gw-a", Token: 2, Kind: "fw.activate", Verdict: "stale", ID: "a1"}}
	r.Steps = append(r.Steps, r.Late...)
	r.LateCommit, r.AStale = SendResult{Verdict: "stale"}, 0
	r.ALogStale = []string{"fw.commit", "fw.activate"}
	return r
}

// TestFigure1FirmwareCheck: Check passes a good run and fails each way a
// run can go wrong, so the proofs above cannot pass vacuously.
func TestFigure1FirmwareCheck(t *testing.T) {
	if err := goodFirmwareRun().Check(); err != nil {
		t.Fatalf("a good run: %v", err)
	}
	bad := map[string]func(r *Figure1FirmwareResult){
		"late chunk applied":      func(r *Figure1FirmwareResult) { r.Late[0].Verdict = "accepted" },
		"no late chunk":           func(r *Figure1FirmwareResult) { r.Late = r.Late[1:] },
		"late activate accepted":  func(r *Figure1FirmwareResult) { r.LateActivate.Verdict = "accepted" },
		"A counted nothing stale": func(r *Figure1FirmwareResult) { r.AStale = 0 },
		"written by A":            func(r *Figure1FirmwareResult) { r.Execution.Gateway, r.Execution.Token = "gw-a", 2 },
		"another image":           func(r *Figure1FirmwareResult) { r.SlotSHA256 = "00bb" },
		"not committed":           func(r *Figure1FirmwareResult) { r.Final.State = "confirming" },
		"committed twice": func(r *Figure1FirmwareResult) {
			r.Reports = append(r.Reports, FirmwareReport{Job: "j", State: "rebooting"}, FirmwareReport{Job: "j", State: "committed"})
		},
		"activated twice": func(r *Figure1FirmwareResult) {
			r.Steps = append(r.Steps, FirmwareStep{Holder: "gw-b", Token: 6, Kind: "fw.activate", Verdict: "accepted"})
		},
		"offset written twice":     func(r *Figure1FirmwareResult) { r.Steps[3].Off = 4096 },
		"token went back":          func(r *Figure1FirmwareResult) { r.Steps[6].Token = 1 },
		"fault not mid-download":   func(r *Figure1FirmwareResult) { r.FaultAt.State = "installed" },
		"B restarted the download": func(r *Figure1FirmwareResult) { r.Steps[3].Kind = "fw.begin" },
	}
	checkCatches(t, goodFirmwareRun, bad)
	if err := goodFrozenRebootRun().Check(); err != nil {
		t.Fatalf("a good run frozen during the reboot: %v", err)
	}
	badReboot := map[string]func(r *Figure1FirmwareResult){
		"late commit applied":            func(r *Figure1FirmwareResult) { r.Late[0].Verdict = "accepted" },
		"late commit sent, none reached": func(r *Figure1FirmwareResult) { r.Late = r.Late[1:] },
		"late commit not stale":          func(r *Figure1FirmwareResult) { r.LateCommit.Verdict = "accepted" },
		"late activate not stale":        func(r *Figure1FirmwareResult) { r.LateActivate.Verdict = "invalid" },
		"A's log has no commit":          func(r *Figure1FirmwareResult) { r.ALogStale = r.ALogStale[1:] },
		"device log has no commit":       func(r *Figure1FirmwareResult) { r.DeviceLogStale = r.DeviceLogStale[1:] },
		"fault not in the reboot":        func(r *Figure1FirmwareResult) { r.FaultAt.State = "confirming" },
		"B activated again":              func(r *Figure1FirmwareResult) { r.Steps[5].Holder, r.Steps[5].Token = "gw-b", 6 },
		"committed by A":                 func(r *Figure1FirmwareResult) { r.Steps[6].Holder, r.Steps[6].Token = "gw-a", 2 },
	}
	checkCatches(t, goodFrozenRebootRun, badReboot)
}

// checkCatches: Check fails each good run that bad's functions spoil.
func checkCatches(t *testing.T, good func() *Figure1FirmwareResult, bad map[string]func(r *Figure1FirmwareResult)) {
	t.Helper()
	for name, mutate := range bad {
		r := good()
		mutate(r)
		if err := r.Check(); err == nil {
			t.Errorf("%s, %s: Check passed", r.Fault, name)
		}
	}
}
