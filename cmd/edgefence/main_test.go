package main

// These tests run the real edgefence program as a subprocess against a real
// embedded etcd and MQTT v5 broker (internal/sandbox) and simulated devices
// (devices/sim, in-process).
//
// The subprocess is this test binary re-executed with beMain set: TestMain
// then calls run exactly as main does. That needs no toolchain or link step
// at test time, and the agent runs with the test's own instrumentation (under
// -race the subprocesses are race-checked too). main itself is one line,
// os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)), repeated here.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/internal/sandbox"
)

// beMain makes the test binary act as edgefence.
const beMain = "EDGEFENCE_TEST_BE_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(beMain) == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	goleak.VerifyTestMain(m)
}

// subprocEnv is the environment of every edgefence subprocess, on top of
// the test's own.
func subprocEnv() []string {
	env := []string{beMain + "=1", "EDGEFENCE_FAILPOINTS="} // none, in a build with edgefence_unsafe
	// The race detector sleeps 1s at exit by default so that late reports
	// get out; the CLI is run dozens of times, and races are still reported.
	if g := os.Getenv("GORACE"); !strings.Contains(g, "atexit_sleep_ms") {
		env = append(env, strings.TrimSpace("GORACE="+g+" atexit_sleep_ms=0"))
	}
	return env
}

// cliTimeout bounds one CLI invocation: none may hang.
const cliTimeout = 20 * time.Second

// result is the outcome of one CLI invocation.
type result struct {
	args           []string
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("edgefence %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(r.args, " "), r.code, r.stdout, r.stderr)
}

// edgefence runs the CLI once and returns its exit code and output.
func edgefence(t *testing.T, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), cliTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), subprocEnv()...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{args: args, stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Fatalf("edgefence %s did not finish within %v (hangs); stderr: %s", strings.Join(args, " "), cliTimeout, r.stderr)
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		t.Fatalf("edgefence %s: %v", strings.Join(args, " "), err)
	}
	return r
}

// env is one test's world: etcd, a broker and simulated devices.
type env struct {
	t       *testing.T
	dir     string
	world   *sandbox.World
	etcd    *clientv3.Client
	fleet   *sim.Fleet
	devices []string
	etcdURL string                       // the agents' etcd, if not the world's (Debian's etcd)
	labels  map[string]map[string]string // devices' labels in the configs written
}

// newEnv starts a fast etcd, a broker and a fleet serving devices.
func newEnv(t *testing.T, devices ...string) *env {
	t.Helper()
	return newEnvKeys(t, nil, devices...)
}

// newEnvKeys is newEnv with devices that accept only envelopes keys allows
// (nil: plain envelopes).
func newEnvKeys(t *testing.T, keys auth.Keys, devices ...string) *env {
	t.Helper()
	return newEnvFleet(t, func(_ *sandbox.World, fc *sim.FleetConfig) { fc.Keys = keys }, devices...)
}

// newEnvFleet is newEnv with adjust setting up the fleet's config once the
// world runs.
func newEnvFleet(t *testing.T, adjust func(w *sandbox.World, fc *sim.FleetConfig), devices ...string) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	dir := t.TempDir()
	w, err := sandbox.StartWorld(ctx, sandbox.WorldConfig{Dir: filepath.Join(dir, "world"), Fast: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	cli, err := w.Etcd.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	fc := sim.FleetConfig{Devices: devices, DataDir: filepath.Join(dir, "devices"), Broker: w.Broker.URL(), ClientID: "devsim-" + t.Name()}
	adjust(w, &fc)
	fleet, err := sim.NewFleet(ctx, fc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := fleet.Close(cctx); err != nil {
			t.Errorf("fleet close: %v", err)
		}
	})
	if err := fleet.AwaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return &env{t: t, dir: dir, world: w, etcd: cli, fleet: fleet, devices: devices}
}

// config writes an agent config for gateway and returns its path and socket.
func (e *env) config(gateway string, leaseTTL time.Duration) (path, socket string) {
	e.t.Helper()
	return e.configEdit(gateway, leaseTTL, nil)
}

// configEdit is config, edited by edit (if not nil) before it is written:
// e.g. its auth section, which signs its devices.
func (e *env) configEdit(gateway string, leaseTTL time.Duration, edit func(c *sandbox.AgentConfig)) (path, socket string) {
	e.t.Helper()
	c := e.world.AgentConfig(gateway, e.dir, e.devices)
	c.LeaseTTL = leaseTTL
	c.LogFormat = "json"
	c.Labels = e.labels
	if e.etcdURL != "" {
		c.Etcd = e.etcdURL
	}
	if edit != nil {
		edit(&c)
	}
	path = filepath.Join(e.dir, gateway+".yaml")
	if err := c.Write(path); err != nil {
		e.t.Fatal(err)
	}
	return path, c.Socket
}

// startAgent runs `edgefence run --config path` until the test ends.
func (e *env) startAgent(name, path string) *sandbox.Proc {
	e.t.Helper()
	return e.startAgentBin(name, os.Args[0], path)
}

// startAgentBin is startAgent with the agent binary bin (e.g. shippedBuild's).
func (e *env) startAgentBin(name, bin, path string) *sandbox.Proc {
	e.t.Helper()
	p, err := sandbox.StartProc(name, filepath.Join(e.dir, name+".log"), subprocEnv(), bin, "run", "--config", path)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		select {
		case <-p.Done(): // the test stopped it and checked how
			return
		default:
		}
		if err := p.Stop(10 * time.Second); err != nil {
			log, _ := os.ReadFile(filepath.Join(e.dir, name+".log"))
			if len(log) > 16<<10 {
				log = log[len(log)-16<<10:] // a race report is at the end
			}
			e.t.Errorf("%s did not shut down cleanly: %v; the end of its log:\n%s", name, err, log)
		}
	})
	return p
}

// status runs `edgefence status --json`.
func status(t *testing.T, socket string) (*agent.Status, result) {
	t.Helper()
	r := edgefence(t, "status", "--json", "--socket", socket)
	if r.code != 0 {
		return nil, r
	}
	var st agent.Status
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("status output does not parse: %v\n%s", err, r)
	}
	return &st, r
}

// waitHolding polls `edgefence status --json` until the agent holds every
// device, and returns that status.
func (e *env) waitHolding(p *sandbox.Proc, socket string) *agent.Status {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last result
	for {
		st, r := status(e.t, socket)
		last = r
		if st != nil && len(st.Devices) == len(e.devices) {
			holding := 0
			for _, d := range st.Devices {
				if d.State == agent.StateHolding {
					holding++
				}
			}
			if holding == len(e.devices) {
				return st
			}
		}
		select {
		case <-p.Done():
			e.t.Fatalf("%s exited before holding every device; last status:\n%s", p.Name, last)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s does not hold every device; last status:\n%s", p.Name, last)
		}
	}
}

// lockKeys returns the device's lock keys in etcd and their leases.
func (e *env) lockKeys(dev string) map[string]clientv3.LeaseID {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), 10*time.Second)
	defer cancel()
	resp, err := e.etcd.Get(ctx, agent.DefaultEtcdPrefix+"/devices/"+dev+"/lock/", clientv3.WithPrefix())
	if err != nil {
		e.t.Fatal(err)
	}
	keys := make(map[string]clientv3.LeaseID, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		keys[string(kv.Key)] = clientv3.LeaseID(kv.Lease)
	}
	return keys
}

// revision returns etcd's current revision.
func (e *env) revision() int64 {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), 10*time.Second)
	defer cancel()
	resp, err := e.etcd.Get(ctx, "/")
	if err != nil {
		e.t.Fatal(err)
	}
	return resp.Header.Revision
}
