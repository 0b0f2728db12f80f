package chaos

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/edgefence/edgefence/agent/jobs"
	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/internal/backoff"
	"github.com/edgefence/edgefence/internal/sandbox"
)

// The firmware scenario's job: an image of fwImageSize bytes in chunks of
// fwChunk (128 fenced fw.chunk commands per device), security version 2
// (the devices boot version 0).
const (
	fwJobID     = "chaos-fw"
	fwImageSize = 256 << 10
	fwChunk     = 2 << 10
	fwVersion   = 2
	// fwHistory is the devices' history file in the round's directory.
	fwHistory = "hist-fw.jsonl"
	// fwFaults bounds the faults of a firmware round: at least the first,
	// at most the second, one at a time while executions run.
	fwFaultsMin, fwFaultsMax = 3, 6
	// fwEndBound bounds the wait for every execution to end after the
	// last fault healed.
	fwEndBound = 150 * time.Second
)

// runFirmware is the firmware scenario (FaultFirmware) after startInfra:
// firmware devices (edgefence-devsim --firmware, a process per device;
// with Config.CDeviceBin each an efsdev --firmware),
// the two agents, one job over every device created with `edgefence job
// create`; faults (SIGSTOP of the holder past its lease, kill -9 of the
// holder agent, kill -9 of a device process) while it runs; then every
// execution must end, the history checks (I1, I4 and FW1) and every
// device must run the job's image, committed (checkFirmwareEnd).
func (r *round) runFirmware(ctx context.Context) error {
	if err := r.startFirmwareDevices(ctx); err != nil {
		return err
	}
	if err := r.startAgents(ctx); err != nil {
		return err
	}
	if err := r.waitAllHeld(ctx, 60*time.Second); err != nil {
		return err
	}
	sum, err := r.createFirmwareJob(ctx)
	if err != nil {
		return err
	}
	r.logf("job %s created over %s (image %s…); faults while it runs", fwJobID, strings.Join(r.shimDevs, ","), sum[:12])
	r.res.FaultStart = time.Now()
	ferr := r.firmwareFaults(ctx)
	r.res.FaultEnd = time.Now()
	if ferr != nil {
		return fmt.Errorf("inject %s: %w", r.sc, ferr)
	}
	execs, werr := r.waitExecutions(ctx, fwEndBound)
	if werr == nil {
		werr = r.drain(ctx, 120*time.Second)
	}
	if err := r.collect(ctx); err != nil {
		return errors.Join(werr, err)
	}
	if werr != nil {
		return errors.Join(werr, r.deviceStates(execs))
	}
	r.checkFirmwareEnd(execs, sum)
	return nil
}

// startAgents starts gw-a and gw-b.
func (r *round) startAgents(ctx context.Context) error {
	for _, gw := range []struct{ name, node string }{{"gw-a", nodeA}, {"gw-b", nodeB}} {
		a, err := r.startAgent(ctx, gw.name, gw.node)
		if err != nil {
			return err
		}
		r.agents = append(r.agents, a)
	}
	return nil
}

// startFirmwareDevices starts the supervisor of the firmware devices
// d1..dN (the broker's devsim user serves them), each device's decisions
// appended to hist-fw.jsonl under the source fw:<id>.
func (r *round) startFirmwareDevices(ctx context.Context) error {
	delay := r.jitter(100*time.Millisecond, time.Second)
	args := []string{"--firmware", "--mqtt", r.mqttURL, "--devices", strings.Join(r.shimDevs, ","), "--dir", r.path("devices"),
		"--mqtt-user", "devsim", "--history", r.path(fwHistory), "--history-source", "fw",
		"--fw-window", "20s", "--restart-delay", delay.String()}
	args = append(args, r.trust.devsimArgs()...)
	if r.cfg.CDeviceBin != "" { // the C device: efsdev --firmware, one per device, under the same supervisor
		args = append(args, "--c-device", r.cfg.CDeviceBin)
	}
	p, err := sandbox.StartProc("devsim-fw", r.path("devsim-fw.log"), r.mqttEnv("devsim"), filepath.Join(r.cfg.Bin, "edgefence-devsim"),
		args...)
	if err != nil {
		return err
	}
	r.devsimMu.Lock()
	r.devsim = p
	r.devsimMu.Unlock()
	r.closers = append(r.closers, func() { _ = p.Stop(15 * time.Second) })
	return awaitReady(ctx, p)
}

// edgefence runs `edgefence args…` and returns its stdout.
func (r *round) edgefence(ctx context.Context, args ...string) ([]byte, error) {
	return r.edgefenceAt(ctx, nodeA, args...)
}

// edgefenceAt runs `edgefence args…` in node (directly when the round
// has no network lab) and returns its stdout.
func (r *round) edgefenceAt(ctx context.Context, node string, args ...string) ([]byte, error) {
	return r.edgefenceEnv(ctx, node, nil, args...)
}

// edgefenceEnv is edgefenceAt with env added to the command's environment
// (an agent's: its broker password).
func (r *round) edgefenceEnv(ctx context.Context, node string, env []string, args ...string) ([]byte, error) {
	cctx, cancel := context.WithTimeout(ctx, 45*time.Second)
	defer cancel()
	bin, argv := r.command(node, filepath.Join(r.cfg.Bin, "edgefence"), args...)
	cmd := exec.CommandContext(cctx, bin, argv...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("edgefence %s: %w: %s", strings.Join(args[:2], " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// createFirmwareJob writes the image (sim.FirmwareImage: healthy) and
// creates the job over every device, all of them at once; it returns the
// image's SHA-256 (hex).
func (r *round) createFirmwareJob(ctx context.Context) (string, error) {
	img, err := sim.FirmwareImage(fwImageSize, sim.VersionMarker+"chaos-2")
	if err != nil {
		return "", err
	}
	path := r.path("fw-chaos-2.bin")
	if err := os.WriteFile(path, img, 0o644); err != nil {
		return "", err
	}
	sum := sha256.Sum256(img)
	args := []string{"job", "create", "--etcd", r.etcdURL, "--id", fwJobID, "--image", path,
		"--version", strconv.Itoa(fwVersion), "--devices", strings.Join(r.shimDevs, ","),
		"--max-concurrent", strconv.Itoa(len(r.shimDevs)), "--chunk", strconv.Itoa(fwChunk),
		"--step-timeout", "60s", "--reboot-timeout", "60s", "--json"}
	manifest, err := r.writeManifest(img, sum[:], fwVersion)
	if err != nil {
		return "", err
	}
	if manifest != "" { // the devices have the root: they install only what the operator signed
		args = append(args, "--manifest", manifest)
	}
	out, err := r.edgefence(ctx, args...)
	if err != nil {
		return "", err
	}
	var v struct {
		Job jobs.Job `json:"job"`
	}
	if err := json.Unmarshal(out, &v); err != nil {
		return "", fmt.Errorf("job create --json: %w", err)
	}
	if want := hex.EncodeToString(sum[:]); v.Job.Image.SHA256 != want {
		return "", fmt.Errorf("job create: image %s, want %s", v.Job.Image.SHA256, want)
	}
	return v.Job.Image.SHA256, nil
}

// executions reads the job's executions with `edgefence job show --json`.
func (r *round) executions(ctx context.Context) ([]jobs.Execution, error) {
	out, err := r.edgefence(ctx, "job", "show", "--etcd", r.etcdURL, "--json", fwJobID)
	if err != nil {
		return nil, err
	}
	var v struct {
		Executions []jobs.Execution `json:"executions"`
	}
	if err := json.Unmarshal(out, &v); err != nil {
		return nil, fmt.Errorf("job show --json: %w", err)
	}
	return v.Executions, nil
}

// ended reports whether every device has an execution and all have ended.
func (r *round) ended(execs []jobs.Execution) bool {
	if len(execs) < len(r.shimDevs) {
		return false
	}
	for _, e := range execs {
		if !e.Status.Terminal() {
			return false
		}
	}
	return true
}

// waitExecutions waits until every device's execution has ended, at most
// bound; then it returns them. A stuck one is an error naming it.
func (r *round) waitExecutions(ctx context.Context, bound time.Duration) ([]jobs.Execution, error) {
	deadline := time.Now().Add(bound)
	var execs []jobs.Execution
	for {
		var err error
		execs, err = r.executions(ctx)
		if err == nil && r.ended(execs) {
			return execs, nil
		}
		if time.Now().After(deadline) {
			var open []string
			for _, e := range execs {
				if !e.Status.Terminal() {
					b, _ := json.Marshal(e)
					open = append(open, string(b))
				}
			}
			return execs, fmt.Errorf("executions of %s not ended after %v (%d of %d listed; last error %v): %s",
				fwJobID, bound, len(execs), len(r.shimDevs), err, strings.Join(open, "; "))
		}
		if !backoff.Sleep(ctx, 300*time.Millisecond) {
			return execs, ctx.Err()
		}
	}
}
