package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgefence/edgefence/agent/jobs"
	"github.com/edgefence/edgefence/devices/sim"
)

// TestFirmwareRolloutAbortsOverTwoGateways: a rollout over two gateways
// with 20% failing devices aborts at the threshold for both. Two agent
// processes each hold five of ten firmware devices (edgefence-devsim
// --firmware, two supervisors: eight devices at security version 0, two
// at 5, which refuse the job's version 1 — anti-rollback, rejected); the
// job runs at most 2 at once and aborts at a failure ratio of 0.2 once 5
// ended. So that the failures come first (else the abort could come only
// once every device ended), a third agent, gw-x with its job runner off,
// holds the eight healthy devices until the two failing ones were
// rejected, then stops: the fifth execution to end aborts the rollout.
// The rollout ends aborted; no execution started at or after the abort's
// revision (etcd's history of the executions), queued ones end canceled,
// in-progress ones canceled or succeeded, and every execution ends.
func TestFirmwareRolloutAbortsOverTwoGateways(t *testing.T) {
	agentBin, devsimBin := binaries(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	e := startEtcd(t, EtcdConfig{Dir: t.TempDir(), Fast: true})
	b := startBroker(t, BrokerConfig{})
	dir := t.TempDir()
	const prefix, job = "/edgefence/v1", "fw-rollout"
	var devs []string
	for i := 1; i <= 10; i++ {
		devs = append(devs, fmt.Sprintf("fw-%02d", i))
	}
	failing := []string{"fw-03", "fw-08"} // one in each gateway's half
	var ok []string
	for _, d := range devs {
		if !slices.Contains(failing, d) {
			ok = append(ok, d)
		}
	}
	startFirmwareDevices(ctx, t, devsimBin, b.URL(), dir, "devsim-ok", ok, 0)
	startFirmwareDevices(ctx, t, devsimBin, b.URL(), dir, "devsim-old", failing, 5)
	x := startRolloutAgent(ctx, t, agentBin, e.Endpoint(), b.URL(), dir, "gw-x", ok, ok, true)
	socks := map[string]*rolloutAgent{}
	for i, gw := range []string{"gw-a", "gw-b"} {
		socks[gw] = startRolloutAgent(ctx, t, agentBin, e.Endpoint(), b.URL(), dir, gw, devs[5*i:5*i+5], failing[i:i+1], false)
	}
	img, err := sim.FirmwareImage(96<<10, sim.VersionMarker+"rollout")
	if err != nil {
		t.Fatal(err)
	}
	imgPath := filepath.Join(dir, "image.bin")
	if err := os.WriteFile(imgPath, img, 0o644); err != nil {
		t.Fatal(err)
	}
	var v struct {
		Rollout    jobs.Rollout     `json:"rollout"`
		Executions []jobs.Execution `json:"executions"`
	}
	runCLI(ctx, t, agentBin, "job", "create", "--etcd", e.Endpoint(), "--prefix", prefix, "--id", job, "--image", imgPath,
		"--version", "1", "--devices", strings.Join(devs, ","), "--chunk", "8192", "--max-concurrent", "2",
		"--abort-ratio", "0.2", "--abort-min", "5")
	show := func() {
		out := runCLI(ctx, t, agentBin, "job", "show", "--etcd", e.Endpoint(), "--prefix", prefix, "--json", job)
		if err := json.Unmarshal(out, &v); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for show(); v.Rollout.Counts[jobs.Rejected] < len(failing); show() {
		if time.Now().After(deadline) {
			t.Fatalf("the failing devices not rejected: rollout %s %v", v.Rollout.Status, v.Rollout.Counts)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("%s and %s rejected (anti-rollback), rollout %s %v; gw-x lets the healthy devices go", failing[0], failing[1],
		v.Rollout.Status, v.Rollout.Counts)
	if err := x.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}

	deadline = time.Now().Add(90 * time.Second)
	for {
		show()
		if v.Rollout.Status == jobs.RolloutAborted && len(v.Executions) == len(devs) && allEnded(v.Executions) {
			break
		}
		if v.Rollout.Status == jobs.RolloutCompleted || v.Rollout.Status == jobs.RolloutCanceled {
			t.Fatalf("rollout %s, want aborted: counts %v", v.Rollout.Status, v.Rollout.Counts)
		}
		if time.Now().After(deadline) {
			t.Fatalf("rollout %s %v, executions %+v", v.Rollout.Status, v.Rollout.Counts, v.Executions)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("rollout %s (%s), counts %v", v.Rollout.Status, v.Rollout.Reason, v.Rollout.Counts)
	checkAbortedRollout(ctx, t, e, prefix, job, v.Executions, failing)
	for _, gw := range []string{"gw-a", "gw-b"} {
		t.Logf("%s saw: %s", gw, gatewayJobs(ctx, t, agentBin, socks[gw].sock, v.Executions, gw))
	}
}

func allEnded(ex []jobs.Execution) bool {
	for _, e := range ex {
		if !e.Status.Terminal() {
			return false
		}
	}
	return true
}

// checkAbortedRollout reads the job's history in etcd: the revision that
// aborted the rollout, and the revision at which each execution started;
// none started at or after the abort. Queued ones ended canceled, the
// failing devices rejected (or canceled, if the abort came first).
func checkAbortedRollout(ctx context.Context, t *testing.T, e *Etcd, prefix, job string, ex []jobs.Execution, failing []string) {
	t.Helper()
	cli, err := e.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	head, err := cli.Get(ctx, prefix+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	abortRev, started := int64(0), map[string]int64{}
	var abortedAt time.Time
	for resp := range cli.Watch(wctx, prefix+"/", clientv3.WithPrefix(), clientv3.WithRev(1)) {
		if err := resp.Err(); err != nil {
			t.Fatal(err)
		}
		for _, ev := range resp.Events {
			key := string(ev.Kv.Key)
			switch {
			case key == prefix+"/rollouts/"+job && abortRev == 0:
				var r jobs.Rollout
				if json.Unmarshal(ev.Kv.Value, &r) == nil && r.Status == jobs.RolloutAborted {
					abortRev, abortedAt = ev.Kv.ModRevision, r.Updated
				}
			case strings.HasPrefix(key, prefix+"/executions/"+job+"/"):
				var x jobs.Execution
				if json.Unmarshal(ev.Kv.Value, &x) == nil && x.Status == jobs.InProgress && started[x.Device] == 0 {
					started[x.Device] = ev.Kv.ModRevision
				}
			}
		}
		if resp.Header.Revision >= head.Header.Revision || (len(resp.Events) > 0 && resp.Events[len(resp.Events)-1].Kv.ModRevision >= head.Header.Revision) {
			break
		}
	}
	if abortRev == 0 {
		t.Fatal("no revision of the rollout is aborted")
	}
	t.Logf("the rollout aborted at revision %d (%s)", abortRev, abortedAt.Format(time.RFC3339Nano))
	for _, x := range ex {
		switch {
		case x.Gateway != "gw-a" && x.Gateway != "gw-b":
			t.Errorf("%s written by %q: gw-x runs no jobs (jobs.enabled: false)", x.Device, x.Gateway)
		case started[x.Device] >= abortRev:
			t.Errorf("%s started at revision %d, after the abort at %d: %+v", x.Device, started[x.Device], abortRev, x)
		case !x.Started.IsZero() && x.Started.After(abortedAt):
			t.Errorf("%s started_at %v after the abort at %v", x.Device, x.Started, abortedAt)
		case started[x.Device] == 0 && x.Status != jobs.Canceled:
			t.Errorf("%s never started but ended %s, want canceled", x.Device, x.Status)
		case slices.Contains(failing, x.Device) && x.Status != jobs.Rejected && x.Status != jobs.Canceled:
			t.Errorf("%s (security version 5) ended %s (%s), want rejected", x.Device, x.Status, x.Reason)
		case !slices.Contains(failing, x.Device) && x.Status != jobs.Succeeded && x.Status != jobs.Canceled:
			t.Errorf("%s ended %s (%s), want succeeded or canceled", x.Device, x.Status, x.Reason)
		}
	}
	if len(started) == len(ex) {
		t.Errorf("every execution started (%d): the abort stopped nothing", len(started))
	}
}

// gatewayJobs says what one gateway saw: its executions' ends (from etcd:
// the ones it wrote last) and its runner's counters (status --json).
func gatewayJobs(ctx context.Context, t *testing.T, agentBin, sock string, ex []jobs.Execution, gw string) string {
	t.Helper()
	var st struct {
		Jobs *jobs.RunnerStats `json:"jobs"`
	}
	if err := json.Unmarshal(runCLI(ctx, t, agentBin, "status", "--json", "--socket", sock), &st); err != nil || st.Jobs == nil {
		t.Fatalf("%s status: %v", gw, err)
	}
	var ends []string
	for _, x := range ex {
		if x.Gateway == gw {
			ends = append(ends, fmt.Sprintf("%s %s", x.Device, x.Status))
		}
	}
	return fmt.Sprintf("executions %s; runner ended %v, fw.begin verdicts %v", strings.Join(ends, ", "), st.Jobs.Ended,
		st.Jobs.Steps["fw.begin"])
}

// startFirmwareDevices runs an edgefence-devsim --firmware supervisor for
// devs, their factory image at security version security, until the test
// ends.
func startFirmwareDevices(ctx context.Context, t *testing.T, devsimBin, url, dir, name string, devs []string, security uint64) {
	t.Helper()
	p, err := StartProc(name, filepath.Join(dir, name+".log"), nil, devsimBin, "--firmware", "--mqtt", url,
		"--devices", strings.Join(devs, ","), "--dir", filepath.Join(dir, "devices"), "--fw-security", fmt.Sprint(security))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(10 * time.Second) })
	if err := p.WaitLine(ctx, "ready"); err != nil {
		t.Fatal(err)
	}
}

// startRolloutAgent runs `edgefence run` as gw for devs (its job runner
// off with jobsOff) until the test ends, waits until it holds hold, and
// returns it.
func startRolloutAgent(ctx context.Context, t *testing.T, agentBin, etcd, url, dir, gw string, devs, hold []string, jobsOff bool) *rolloutAgent {
	t.Helper()
	c := AgentConfig{Gateway: gw, Etcd: etcd, MQTT: url, Devices: devs, Socket: filepath.Join(dir, gw+".sock"),
		StateDir: filepath.Join(dir, gw+"-state"), ClientID: gw, LeaseTTL: 2 * time.Second, LogFormat: "json", JobsOff: jobsOff}
	cpath := filepath.Join(dir, gw+".yaml")
	if err := c.Write(cpath); err != nil {
		t.Fatal(err)
	}
	p, err := StartProc(gw, filepath.Join(dir, gw+".log"), nil, agentBin, "run", "--config", cpath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(10 * time.Second) })
	f := &figure1{cfg: Figure1Config{AgentBin: agentBin, Devices: hold}}
	if _, err := f.waitHolding(ctx, p, c.Socket); err != nil {
		t.Fatal(err)
	}
	return &rolloutAgent{Proc: p, sock: c.Socket}
}

// rolloutAgent is an agent process of the rollout test and its socket.
type rolloutAgent struct {
	*Proc
	sock string
}

// runCLI runs the edgefence binary with args and returns its stdout.
func runCLI(ctx context.Context, t *testing.T, agentBin string, args ...string) []byte {
	t.Helper()
	out, err := exec.CommandContext(ctx, agentBin, args...).Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("edgefence %v: %v: %s", args, err, stderr)
	}
	return out
}
