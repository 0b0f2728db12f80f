package main

// The token regression runbook (README) and the maintenance lock, end to end
// on the etcd gateways' sites run — Debian's etcd-server 3.4, which has no
// `etcdutl snapshot restore --bump-revision` — and on the embedded one: the
// real edgefence binary, a simulated device behind its shim on a real MQTT
// broker, the real etcdctl.

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/internal/sandbox"
)

// agentEtcd is the etcd the agents of a test use, and how to rebuild it from
// nothing.
type agentEtcd struct {
	url  string
	wipe func(context.Context) error
}

// etcdKinds are the etcds the recovery tests run on: Debian's binary (the
// test fails under CI=true without it) and the world's embedded one.
var etcdKinds = []struct {
	name  string
	start func(t *testing.T, e *env) agentEtcd
}{
	{"debian", func(t *testing.T, _ *env) agentEtcd {
		p := sandbox.NewEtcdProc(t, sandbox.EtcdProcConfig{Fast: true})
		if v, err := p.Version(); err == nil {
			t.Logf("etcd %s (%s)", v, sandbox.EtcdBinPath)
		}
		return agentEtcd{p.Endpoint(), p.Wipe}
	}},
	{"embedded", func(_ *testing.T, e *env) agentEtcd {
		return agentEtcd{e.world.Etcd.Endpoint(), e.world.Etcd.Wipe}
	}},
}

// deviceStatus polls `edgefence status --json` until dev is in state want.
func waitDeviceState(t *testing.T, p *sandbox.Proc, socket, dev, want string) agent.DeviceStatus {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last result
	for {
		st, r := status(t, socket)
		last = r
		if st != nil {
			for _, d := range st.Devices {
				if d.ID == dev && d.State == want {
					return d
				}
			}
		}
		select {
		case <-p.Done():
			t.Fatalf("%s exited before %s was %s; last status:\n%s", p.Name, dev, want, last)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s never %s; last status:\n%s", p.Name, dev, want, last)
		}
	}
}

// send issues one set command and returns the result.
func (e *env) set(socket, dev string, setpoint int) (result, agent.SendResult) {
	e.t.Helper()
	r := edgefence(e.t, "send", "--json", "--socket", socket, "--timeout", "10s", dev, "set", fmt.Sprintf(`{"setpoint":%d}`, setpoint))
	var res agent.SendResult
	if r.stdout != "" {
		res = sendResult(e.t, r)
	}
	return r, res
}

// saveStatus writes `edgefence status --json` of the agent at socket to a
// file, as an operator collects it from every gateway for the runbook.
func (e *env) saveStatus(socket, name string) string {
	e.t.Helper()
	r := edgefence(e.t, "status", "--json", "--socket", socket)
	if r.code != 0 {
		e.t.Fatalf("status failed\n%s", r)
	}
	path := filepath.Join(e.dir, name)
	if err := os.WriteFile(path, []byte(r.stdout), 0o644); err != nil {
		e.t.Fatal(err)
	}
	return path
}

// README, "Token regression: recovery runbook", on any etcd: a device
// accepted commands at a high token; etcd is rebuilt from nothing
// (revisions from 1); a gateway gets a low token and the device refuses it;
// `edgefence etcd bump-revision --from <status files>` raises the revision
// past the device's mark; after the agent's restart its token is above the
// mark and the device accepts again.
func TestTokenRegressionRunbook(t *testing.T) {
	for _, kind := range etcdKinds {
		t.Run(kind.name, func(t *testing.T) {
			e := newEnv(t, "dev-1")
			etcd := kind.start(t, e)
			e.etcdURL = etcd.url
			g := e.regress(etcd)
			high, gw1Status := g.high, g.gw1Status
			gw2, sock2, gw3, sock3 := g.gw2, g.sock2, g.gw3, g.sock3

			// A token regression, though gw-2 never held the device: its key
			// still held the lock when the device refused it. gw-2 lets the
			// lock go — the standby gets it instead of waiting forever —
			// and refuses the device until etcd's revision passes its mark.
			d := waitDeviceState(t, gw2, sock2, "dev-1", agent.StateRefused)
			if !strings.Contains(d.Reason, "token regression") || !strings.Contains(d.Reason, strconv.FormatUint(uint64(high), 10)) || d.FenceToken != high {
				t.Fatalf("gw-2's dev-1 after the refusal: %+v", d)
			}
			if st, r := status(t, sock2); st == nil || st.Counters.Regressions != 1 || st.Counters.Released < 1 {
				t.Fatalf("gw-2's counters after the refusal\n%s", r)
			}
			waitDeviceState(t, gw3, sock3, "dev-1", agent.StateHolding)
			if r, res := e.set(sock2, "dev-1", 98); r.code == 0 || res.Verdict == "accepted" {
				t.Fatalf("gw-2 commanded the device it refused\n%s", r)
			}
			if s, err := e.fleet.State("dev-1"); err != nil || s.Setpoint != 21 {
				t.Fatalf("device state %+v, %v: want setpoint 21, nothing applied after the wipe", s, err)
			}
			if m, err := e.fleet.Mark("dev-1"); err != nil || m.Token != high {
				t.Fatalf("device mark %v, %v: want token %d", m, err, high)
			}

			// The runbook: the highest token in use from every gateway's
			// status (gw-1 held it; gw-2's refusal carries the device's
			// mark), bump past it. No restart: the refused gateways
			// campaign again by themselves, and the next one to take the
			// lock has a token above the mark.
			gw2Status := e.saveStatus(sock2, "gw-2.json")
			r := edgefence(t, "etcd", "bump-revision", "--etcd", etcd.url, "--from", gw1Status, "--from", gw2Status, "--dry-run")
			if r.code != 0 || !strings.Contains(r.stdout, "target "+strconv.FormatUint(uint64(high), 10)) || !strings.Contains(r.stdout, "dry run") {
				t.Fatalf("dry run: want target %d\n%s", high, r)
			}
			r = edgefence(t, "etcd", "bump-revision", "--etcd", etcd.url, "--from", gw1Status, "--from", gw2Status, "--compact")
			if r.code != 0 || !strings.Contains(r.stdout, "done") {
				t.Fatalf("bump\n%s", r)
			}
			t.Logf("bump after the wipe:\n%s", r.stdout)
			// gw-3 holds dev-1 under a token from before the bump, and
			// learns of the regression from its first command, as gw-2 did.
			if r, res := e.set(sock3, "dev-1", 97); r.code == 0 || res.Verdict != "stale" {
				t.Fatalf("gw-3's send under its pre-bump token: %+v, want stale\n%s", res, r)
			}
			var sock string
			var tok fence.Token
			for deadline := time.Now().Add(90 * time.Second); sock == ""; {
				for _, s := range []string{sock2, sock3} {
					if st, _ := status(t, s); st != nil && st.Devices[0].State == agent.StateHolding && st.Devices[0].Token > high {
						sock, tok = s, st.Devices[0].Token
					}
				}
				if time.Now().After(deadline) {
					t.Fatalf("no gateway holds dev-1 above the device's mark %d after the bump", high)
				}
				time.Sleep(100 * time.Millisecond)
			}
			if r, res := e.set(sock, "dev-1", 22); r.code != 0 || res.Verdict != "accepted" {
				t.Fatalf("send under token %d after the bump: want accepted\n%s", tok, r)
			}
			if s, err := e.fleet.State("dev-1"); err != nil || s.Setpoint != 22 {
				t.Fatalf("device state %+v, %v: want setpoint 22", s, err)
			}
		})
	}
}

// regression is the world of the runbook tests after etcd was wiped: gw-1
// held dev-1 at token high (its status saved in gw1Status), then stopped;
// gw-2 took dev-1 with token low and the device refused it; gw-3 waits.
type regression struct {
	high, low          fence.Token
	gw1Status          string
	cfg2, sock2, sock3 string
	gw2, gw3           *sandbox.Proc
}

// regress runs the runbook tests' common start on etcd (e.etcdURL set).
func (e *env) regress(etcd agentEtcd) regression {
	t := e.t
	t.Helper()
	var g regression
	// An etcd with history: its revision is well above the new
	// cluster's will be. (This is the bump command too.)
	if r := edgefence(t, "etcd", "bump-revision", "--etcd", etcd.url, "--to", "500"); r.code != 0 || !strings.Contains(r.stdout, "done") {
		t.Fatalf("bump to 500\n%s", r)
	}
	cfg1, sock1 := e.config("gw-1", 5*time.Second)
	gw1 := e.startAgent("gw-1", cfg1)
	g.high = e.waitHolding(gw1, sock1).Devices[0].Token
	if r, res := e.set(sock1, "dev-1", 21); r.code != 0 || res.Verdict != "accepted" {
		t.Fatalf("send under token %d: want accepted\n%s", g.high, r)
	}
	g.gw1Status = e.saveStatus(sock1, "gw-1.json")
	if err := gw1.Stop(10 * time.Second); err != nil {
		t.Fatalf("gw-1 did not stop cleanly: %v", err)
	}

	// etcd is rebuilt from nothing; a gateway with no token history
	// (a replacement, a wiped state dir) takes the device with a
	// low token, and the device refuses it.
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	if err := etcd.wipe(ctx); err != nil {
		t.Fatal(err)
	}
	g.cfg2, g.sock2 = e.config("gw-2", 5*time.Second)
	g.gw2 = e.startAgent("gw-2", g.cfg2)
	g.low = e.waitHolding(g.gw2, g.sock2).Devices[0].Token
	if g.low >= g.high {
		t.Fatalf("token %d after the wipe, want one below %d", g.low, g.high)
	}
	// A standby waits behind gw-2.
	var cfg3 string
	cfg3, g.sock3 = e.config("gw-3", 5*time.Second)
	g.gw3 = e.startAgent("gw-3", cfg3)
	waitDeviceState(t, g.gw3, g.sock3, "dev-1", agent.StateCampaigning)
	if r, res := e.set(g.sock2, "dev-1", 99); r.code == 0 || res.Verdict != "stale" {
		t.Fatalf("send under token %d after the wipe: %+v, want stale (device mark %d)\n%s", g.low, res, g.high, r)
	}
	return g
}

// etcdctlLock starts `etcdctl lock NAME` and returns it with a function
// that waits until it holds the lock (it prints its key).
func etcdctlLock(t *testing.T, etcdctl, endpoint, name string, ttl int) (*exec.Cmd, func()) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), etcdctl, "--endpoints", endpoint, "lock", "--ttl", strconv.Itoa(ttl), name)
	cmd.Env = append(os.Environ(), "ETCDCTL_API=3")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line := make(chan string, 1)
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		sc := bufio.NewScanner(out)
		sc.Scan()
		line <- sc.Text()
		for sc.Scan() { // until it exits
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-drained
		_ = cmd.Wait()
	})
	return cmd, func() {
		t.Helper()
		select {
		case l := <-line:
			if !strings.HasPrefix(l, name+"/") {
				t.Fatalf("etcdctl lock %s printed %q; stderr: %s", name, l, stderr.String())
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("etcdctl lock %s: not held after 30 s; stderr: %s", name, stderr.String())
		}
	}
}

// README, "Maintenance: keep every gateway off a device": `etcdctl lock
// <prefix>/devices/<id>/lock` on Debian's etcd queues behind the gateway
// holding the device, gets it when that agent restarts, and keeps the agent
// off the device (campaigning, nothing sent) until etcdctl lets go: at once
// on Ctrl-C, within its --ttl when it is killed.
func TestEtcdctlLockKeepsAgentOff(t *testing.T) {
	etcdctl := sandbox.NeedEtcdctl(t)
	e := newEnv(t, "dev-1", "dev-2", "dev-3")
	p := sandbox.NewEtcdProc(t, sandbox.EtcdProcConfig{Fast: true})
	e.etcdURL = p.Endpoint()
	cli, err := p.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	e.etcd = cli // lockKeys reads this etcd
	cfg, sock := e.config("gw-1", 5*time.Second)
	gw := e.startAgent("gw-1", cfg)
	e.waitHolding(gw, sock)

	// etcdctl waits in line behind the agent; the agent's restart
	// (systemctl restart edgefence) lets it in first.
	lockName := func(dev string) string { return agent.DefaultEtcdPrefix + "/devices/" + dev + "/lock" }
	ctrlC, held1 := etcdctlLock(t, etcdctl, p.Endpoint(), lockName("dev-1"), 10)
	killed, held2 := etcdctlLock(t, etcdctl, p.Endpoint(), lockName("dev-2"), 2)
	waitLockKeys(t, e, 2, "dev-1", "dev-2") // the agent's and etcdctl's
	if err := gw.Stop(10 * time.Second); err != nil {
		t.Fatalf("gw-1 did not stop cleanly: %v", err)
	}
	held1()
	held2()
	gw = e.startAgent("gw-1-restarted", cfg)
	waitDeviceState(t, gw, sock, "dev-3", agent.StateHolding)
	waitLockKeys(t, e, 2, "dev-1", "dev-2") // etcdctl's, then the agent's
	for _, dev := range []string{"dev-1", "dev-2"} {
		d := waitDeviceState(t, gw, sock, dev, agent.StateCampaigning)
		if d.Token != 0 {
			t.Fatalf("%s: %+v, want no token while etcdctl holds the lock", dev, d)
		}
		// The holder is etcdctl's key: a token, no gateway id.
		for deadline := time.Now().Add(30 * time.Second); d.Holder == nil || d.Holder.Token == 0; d = waitDeviceState(t, gw, sock, dev, agent.StateCampaigning) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %+v, want etcdctl's key shown as the holder", dev, d)
			}
			time.Sleep(50 * time.Millisecond)
		}
		if d.Holder.Gateway != "" {
			t.Fatalf("%s: holder %+v, want etcdctl's (no gateway id)", dev, d.Holder)
		}
		if r, res := e.set(sock, dev, 30); r.code == 0 || res.Verdict != "" {
			t.Fatalf("send to %s while etcdctl holds its lock: want refused by the agent, nothing sent\n%s", dev, r)
		}
	}
	if r := edgefence(t, "status", "--socket", sock); r.code != 0 || !strings.Contains(r.stdout, "campaigning") ||
		!strings.Contains(r.stdout, "lock held by a session that names no gateway (etcdctl lock: maintenance?)") {
		t.Fatalf("status text: want the locked devices campaigning, held by etcdctl\n%s", r)
	}
	applied := map[string]uint64{}
	for _, dev := range []string{"dev-1", "dev-2"} {
		s, err := e.fleet.State(dev)
		if err != nil {
			t.Fatal(err)
		}
		applied[dev] = s.Applied
	}

	// Ctrl-C: etcdctl unlocks at once. kill -9: its lease, and the lock
	// with it, expires after --ttl (2 s here).
	if err := ctrlC.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := killed.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	e.waitHolding(gw, sock)
	for _, dev := range []string{"dev-1", "dev-2"} {
		if r, res := e.set(sock, dev, 31); r.code != 0 || res.Verdict != "accepted" {
			t.Fatalf("send to %s after etcdctl let go: want accepted\n%s", dev, r)
		}
		if s, err := e.fleet.State(dev); err != nil || s.Applied != applied[dev]+1 || s.Setpoint != 31 {
			t.Fatalf("%s state %+v, %v: want exactly the command sent after etcdctl let go applied", dev, s, err)
		}
	}
}

// waitLockKeys polls until each device has n lock keys: n sessions in line.
func waitLockKeys(t *testing.T, e *env, n int, devs ...string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for _, dev := range devs {
		for len(e.lockKeys(dev)) != n {
			if time.Now().After(deadline) {
				t.Fatalf("%s: lock keys %v, want %d", dev, e.lockKeys(dev), n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}
