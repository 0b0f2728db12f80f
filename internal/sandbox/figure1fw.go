package sandbox

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/edgefence/edgefence/agent/jobs"
	"github.com/edgefence/edgefence/devices/fwjob"
	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence"
)

// FirmwareFault is the holder fault of a firmware failover run
// (RunFigure1Firmware).
type FirmwareFault string

// The faults: the holder A frozen past its lease (SIGSTOP) or killed
// (SIGKILL) at one point of the job.
const (
	// FaultFreezeMidDownload: A, with the ignore-session-loss failpoint
	// (it never notices it was deposed), is frozen as a chunk leaves it
	// past a third of the image; that chunk is held in the broker until A
	// wakes, after B finished the job. Then A's late activate is sent.
	FaultFreezeMidDownload FirmwareFault = "freeze-mid-download"
	// FaultKillMidDownload: A is killed past a third of the image.
	FaultKillMidDownload FirmwareFault = "kill-mid-download"
	// FaultFreezeAfterInstall: as FaultFreezeMidDownload, A frozen as its
	// fw.activate leaves it once the device installed the image; that
	// fw.activate is held in the broker until A wakes.
	FaultFreezeAfterInstall FirmwareFault = "freeze-after-install"
	// FaultKillAfterInstall: A is killed once the device installed the
	// image, as its fw.activate leaves it (the broker drops it).
	FaultKillAfterInstall FirmwareFault = "kill-after-install"
	// FaultKillDuringReboot: A is killed when the device reports
	// rebooting after A's fw.activate, before its confirming report.
	FaultKillDuringReboot FirmwareFault = "kill-during-reboot"
	// FaultFreezeDuringReboot: A, with the ignore-session-loss failpoint,
	// is frozen when the device reports rebooting after A's fw.activate,
	// before its confirming report; nothing of A's is in flight, so
	// nothing is held. When A wakes, after B committed, whatever A sends
	// on its own, then a late fw.commit and a late fw.activate through it
	// reach the device.
	FaultFreezeDuringReboot FirmwareFault = "freeze-during-reboot"
)

// FirmwareFaults lists the faults.
var FirmwareFaults = []FirmwareFault{FaultFreezeMidDownload, FaultKillMidDownload, FaultFreezeAfterInstall, FaultKillAfterInstall,
	FaultKillDuringReboot, FaultFreezeDuringReboot}

// frozen reports whether the fault freezes A (and wakes it at the end)
// rather than killing it.
func (k FirmwareFault) frozen() bool {
	return k == FaultFreezeMidDownload || k == FaultFreezeAfterInstall || k == FaultFreezeDuringReboot
}

// heldKind is the kind of A's command a freeze holds in the broker ("":
// none, the freeze during the reboot).
func (k FirmwareFault) heldKind() string {
	switch k {
	case FaultFreezeMidDownload:
		return fwjob.KindChunk
	case FaultFreezeAfterInstall:
		return fwjob.KindActivate
	}
	return ""
}

// lateKind is the kind of the late step of A's a frozen run checks
// besides its late fw.activate: the held one, or the fw.commit sent
// through A after the freeze during the reboot.
func (k FirmwareFault) lateKind() string {
	if h := k.heldKind(); h != "" {
		return h
	}
	return fwjob.KindCommit
}

// Figure1FirmwareConfig sets up a firmware failover run on real
// processes: two agents (edgefence run: gw-a, the holder, and gw-b) and a
// firmware device (edgefence-devsim --firmware); a job made with
// `edgefence job create`; a fault of the holder at one step.
type Figure1FirmwareConfig struct {
	AgentBin  string // the edgefence binary (with failpoints: -tags edgefence_unsafe)
	DevsimBin string // the edgefence-devsim binary
	// CDeviceBin, if set, is the C device (efsdev, BuildCDevice): the
	// firmware device is efsdev --firmware (the library's firmware job),
	// one process supervised by edgefence-devsim --firmware --c-device.
	CDeviceBin string
	Dir        string // work dir: configs, data, logs, sockets, the image (required)
	Etcd       string // etcd endpoint URL (required)
	// Broker is the run's in-process broker (required): the run watches
	// the device's commands, acks and reports in it, and lands the fault
	// at an exact step (a hook; it stays inert once the run ends).
	Broker *Broker
	Auth   *BrokerAuth // the Broker's, if it requires credentials (Figure1Config.Auth)

	Fault     FirmwareFault // default FaultFreezeMidDownload
	Device    string        // default fw-1
	ImageSize int           // bytes; default 1 MiB
	Chunk     int           // bytes per fw.chunk; default 4096

	LeaseTTL   time.Duration // default 2s
	EtcdPrefix string        // default /edgefence/v1; distinct per run when runs share an etcd
	MQTTPrefix string        // default edgefence/v1

	Narrate io.Writer // the timeline in plain words; nil = discard
}

// Figure1FirmwareResult is what happened, from the agents' status, the job's
// execution in etcd (`edgefence job show --json`), the device's slot file
// and the device's traffic as the broker passed it.
type Figure1FirmwareResult struct {
	Fault          FirmwareFault
	Job, Device    string
	Image          string // the image's SHA-256, hex
	Size, Chunk    uint64
	TokenA, TokenB fence.Token
	FaultAt        FirmwareReport // the device's last report when the fault hit
	Execution      jobs.Execution // the execution at the end
	Final          FirmwareReport // the device's last report
	SlotSHA256     string         // SHA-256 of the running slot's file at the end
	Steps          []FirmwareStep // every fw.* command to the device, in the order the broker took them
	Reports        []FirmwareReport

	// A frozen: A's steps that reached the device after it woke (the held
	// one among them), A's late fw.activate through `edgefence send` (and,
	// frozen during the reboot, its late fw.commit the same way), and A's
	// own count of its steps of the held kind refused stale.
	Late         []FirmwareStep
	LateActivate SendResult
	LateCommit   SendResult
	AStale       uint64
	// ALogStale are the kinds of the commands A's log says the device
	// refused stale ("command refused", verdict stale); DeviceLogStale
	// the command ids the device's own log (<dir>/devices/<id>/devsim.log)
	// says it refused stale from gw-a under A's token.
	ALogStale      []string
	DeviceLogStale []string
	Frozen         time.Duration

	// From the fault to B's first accepted step, and to the device's
	// committed report.
	ToFirstStep, ToCommitted time.Duration
}

// figure1fw is one run.
type figure1fw struct {
	*figure1
	c       Figure1FirmwareConfig
	tap     *fwTap
	a, b    *Proc
	sockA   string
	sockB   string
	job     string
	faultAt time.Time
	wokeAt  time.Time
}

// RunFigure1Firmware runs the scenario and returns what happened. It stops
// every process it started before returning.
func RunFigure1Firmware(ctx context.Context, c Figure1FirmwareConfig) (*Figure1FirmwareResult, error) {
	if c.Dir == "" || c.Etcd == "" || c.Broker == nil || c.AgentBin == "" || c.DevsimBin == "" {
		return nil, errors.New("sandbox: figure 1 firmware: Dir, Etcd, Broker, AgentBin and DevsimBin are required")
	}
	if c.Fault == "" {
		c.Fault = FaultFreezeMidDownload
	}
	if c.Device == "" {
		c.Device = "fw-1"
	}
	if c.ImageSize == 0 {
		c.ImageSize = 1 << 20
	}
	if c.Chunk == 0 {
		c.Chunk = 4096
	}
	failA := "none"
	if c.Fault.frozen() {
		failA = "ignore-session-loss"
	}
	fc := Figure1Config{AgentBin: c.AgentBin, DevsimBin: c.DevsimBin, Dir: c.Dir, Etcd: c.Etcd, MQTT: c.Broker.URL(),
		Devices: []string{c.Device}, LeaseTTL: c.LeaseTTL, EtcdPrefix: c.EtcdPrefix, MQTTPrefix: c.MQTTPrefix,
		AgentAFailpoints: failA, Auth: c.Auth, Narrate: c.Narrate}
	fc.applyDefaults()
	f := &figure1fw{figure1: &figure1{cfg: fc, start: time.Now()}, c: c, job: "fw-" + string(c.Fault)}
	defer f.stopAll()
	if err := f.addUsers(); err != nil {
		return nil, err
	}
	f.tap = newFWTap(fc.MQTTPrefix, c.Device)
	defer f.tap.close()
	if err := c.Broker.Server().AddHook(f.tap, nil); err != nil {
		return nil, fmt.Errorf("sandbox: figure 1 firmware: %w", err)
	}
	return f.run(ctx)
}

func (f *figure1fw) run(ctx context.Context) (*Figure1FirmwareResult, error) {
	res := &Figure1FirmwareResult{Fault: f.c.Fault, Job: f.job, Device: f.c.Device, Chunk: uint64(f.c.Chunk)}
	if err := f.startAll(ctx, res); err != nil {
		return nil, err
	}
	fired := f.arm()
	if err := f.createJob(ctx, res); err != nil {
		return nil, err
	}
	if err := f.fault(ctx, fired, res); err != nil {
		return nil, err
	}
	if err := f.awaitEnd(ctx, res); err != nil {
		return nil, err
	}
	if f.c.Fault.frozen() {
		if err := f.wake(ctx, res); err != nil {
			return nil, err
		}
		// Read again: the woken A's execution writes are fenced too.
		var err error
		if res.Execution, err = f.execution(ctx); err != nil {
			return nil, err
		}
	}
	f.stopAll()
	f.procs = nil
	return res, f.collect(res)
}

// startAll starts the firmware device, A (until it holds the device) and
// B (until its etcd session is open).
func (f *figure1fw) startAll(ctx context.Context, res *Figure1FirmwareResult) error {
	if err := f.startFirmwareDevice(ctx); err != nil {
		return err
	}
	r, _ := f.tap.lastReport()
	what := "edgefence-devsim --firmware"
	if f.c.CDeviceBin != "" {
		what = "efsdev --firmware, the C library's job, under edgefence-devsim's supervisor"
	}
	f.say("firmware device %s is up (%s: A/B slots, running slot %s, a fence point of its own)", f.c.Device, what, r.Slot)
	var err error
	if f.a, f.sockA, err = f.startAgent(ctx, "gw-a", f.cfg.AgentAFailpoints); err != nil {
		return err
	}
	toks, err := f.waitHolding(ctx, f.a, f.sockA)
	if err != nil {
		return err
	}
	res.TokenA = toks[f.c.Device]
	what = "killed"
	if f.c.Fault.frozen() {
		what = "frozen, and never notices it lost the lease (failpoint ignore-session-loss)"
	}
	f.say("agent A holds %s (lease TTL %v), token %d; it will be %s", f.c.Device, f.cfg.LeaseTTL, res.TokenA, what)
	if f.b, f.sockB, err = f.startAgent(ctx, "gw-b", ""); err != nil {
		return err
	}
	if err := f.waitUp(ctx, f.b, f.sockB, false); err != nil {
		return err
	}
	f.say("agent B is up and campaigning for the same device")
	return nil
}

// startFirmwareDevice runs edgefence-devsim --firmware for the device and
// waits for its first report.
func (f *figure1fw) startFirmwareDevice(ctx context.Context) error {
	args := []string{"--firmware", "--mqtt", f.cfg.MQTT, "--prefix", f.cfg.MQTTPrefix, "--devices", f.c.Device,
		"--dir", f.path("devices"), "--restart-delay", "100ms"}
	if f.c.CDeviceBin != "" {
		args = append(args, "--c-device", f.c.CDeviceBin)
	}
	user, env, err := f.login("devsim")
	if err != nil {
		return err
	}
	if user != "" {
		args = append(args, "--mqtt-user", user)
	}
	p, err := StartProc("devsim", f.path("devsim.log"), env, f.cfg.DevsimBin, args...)
	if err != nil {
		return err
	}
	f.procs = append(f.procs, p)
	if err := p.WaitLine(ctx, "ready"); err != nil {
		return err
	}
	return f.poll(ctx, "the device's first report", func() (bool, error) {
		_, ok := f.tap.lastReport()
		return ok, nil
	})
}

// createJob writes the image into the run dir and creates the job with
// `edgefence job create`.
func (f *figure1fw) createJob(ctx context.Context, res *Figure1FirmwareResult) error {
	img, err := sim.FirmwareImage(f.c.ImageSize, sim.VersionMarker+"2.0-"+string(f.c.Fault))
	if err != nil {
		return err
	}
	sum := sha256.Sum256(img)
	res.Image, res.Size = hex.EncodeToString(sum[:]), uint64(len(img))
	path := f.path("image.bin")
	if err := os.WriteFile(path, img, 0o644); err != nil {
		return err
	}
	if _, err := f.jobCmd(ctx, "create", "--id", f.job, "--image", path, "--version", "1", "--devices", f.c.Device,
		"--chunk", strconv.Itoa(f.c.Chunk)); err != nil {
		return err
	}
	f.say("edgefence job create %s: image %s… (%d KiB, file://%s), %d-byte chunks", f.job, res.Image[:12], len(img)>>10,
		path, f.c.Chunk)
	return nil
}

// jobCmd runs `edgefence job ARGS --json` against the run's etcd.
func (f *figure1fw) jobCmd(ctx context.Context, args ...string) ([]byte, error) {
	args = append([]string{"job", args[0], "--etcd", f.cfg.Etcd, "--prefix", f.cfg.EtcdPrefix, "--json"}, args[1:]...)
	cmd := exec.CommandContext(ctx, f.cfg.AgentBin, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("edgefence %v: %w: %s", args, err, stderr.String())
	}
	return out, nil
}

// execution reads the job's execution on the device with `edgefence job
// show --json`.
func (f *figure1fw) execution(ctx context.Context) (jobs.Execution, error) {
	out, err := f.jobCmd(ctx, "show", f.job)
	if err != nil {
		return jobs.Execution{}, err
	}
	var v struct {
		Executions []jobs.Execution `json:"executions"`
	}
	if err := json.Unmarshal(out, &v); err != nil {
		return jobs.Execution{}, fmt.Errorf("job show output: %w", err)
	}
	for _, e := range v.Executions {
		if e.Device == f.c.Device {
			return e, nil
		}
	}
	return jobs.Execution{}, nil
}

// poll calls ok until it says so, an error, or ctx ends.
func (f *figure1fw) poll(ctx context.Context, what string, ok func() (bool, error)) error {
	for {
		done, err := ok()
		if err != nil || done {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// collect reads the device's slot file and the tap's record, and fills in
// the result.
func (f *figure1fw) collect(res *Figure1FirmwareResult) error {
	res.Steps, res.Reports = f.tap.snapshot()
	res.Final, _ = f.tap.lastReport()
	slot, err := os.ReadFile(fwjob.SlotPath(filepath.Join(f.path("devices"), f.c.Device), res.Final.Slot))
	if err != nil {
		return fmt.Errorf("sandbox: figure 1 firmware: the running slot: %w", err)
	}
	sum := sha256.Sum256(slot)
	res.SlotSHA256 = hex.EncodeToString(sum[:])
	for _, s := range res.Steps {
		if s.Holder == "gw-b" && s.Verdict == "accepted" {
			res.ToFirstStep = s.AckAt.Sub(f.faultAt)
			break
		}
	}
	for _, r := range res.Reports {
		if r.Job == f.job && r.State == string(fwjob.Committed) {
			res.ToCommitted = r.At.Sub(f.faultAt)
			break
		}
	}
	if !f.wokeAt.IsZero() {
		for _, s := range res.Steps {
			if s.Holder == "gw-a" && s.Token == res.TokenA && (s.At.After(f.wokeAt) || s.AckAt.After(f.wokeAt)) {
				res.Late = append(res.Late, s)
			}
		}
	}
	if f.c.Fault.frozen() {
		if err := f.readLogs(res); err != nil {
			return err
		}
		f.say("A's log: the device refused %s stale; the device's log: %d stale refusals of gw-a's token %d",
			strings.Join(res.ALogStale, ", "), len(res.DeviceLogStale), res.TokenA)
	}
	f.say("the device runs slot %s: %s (image %s…), slot file SHA-256 %s…; execution %s by %s under token %d",
		res.Final.Slot, res.Final.State, short12(res.Final.Image), short12(res.SlotSHA256), res.Execution.Status,
		res.Execution.Gateway, res.Execution.Token)
	return nil
}

func short12(s string) string {
	if len(s) > 12 {
		return s[:12]
	}
	return s
}
