package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/fence"
)

// sendResult parses the JSON `edgefence send --json` prints.
func sendResult(t *testing.T, r result) agent.SendResult {
	t.Helper()
	var res agent.SendResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatalf("send output does not parse: %v\n%s", err, r)
	}
	return res
}

// One agent: run, status (JSON and text), send with every kind of answer.
func TestRunStatusSend(t *testing.T) {
	e := newEnv(t, "dev-1", "dev-2", "dev-3")
	cfg, sock := e.config("gw-1", 10*time.Second)
	p := e.startAgent("gw-1", cfg)

	st := e.waitHolding(p, sock)
	if st.Gateway != "gw-1" || !st.Etcd.Session {
		t.Fatalf("status %+v", st)
	}
	for i, d := range st.Devices {
		if d.ID != e.devices[i] || d.State != agent.StateHolding || d.Token == 0 || d.LockKey == "" {
			t.Errorf("device %d: %+v, want %s holding with a token", i, d, e.devices[i])
		}
	}

	t.Run("send accepted", func(t *testing.T) {
		r := edgefence(t, "send", "--json", "--socket", sock, "dev-1", "set", `{"setpoint":22}`)
		res := sendResult(t, r)
		if r.code != 0 || res.Verdict != "accepted" || res.Device != "dev-1" || res.Seq != 1 || res.Token != uint64(st.Devices[0].Token) {
			t.Fatalf("got %+v, want accepted seq 1 under token %d\n%s", res, st.Devices[0].Token, r)
		}
		if s, err := e.fleet.State("dev-1"); err != nil || s.Setpoint != 22 {
			t.Fatalf("device state %+v, %v: want setpoint 22", s, err)
		}
		r = edgefence(t, "send", "--json", "--config", cfg, "dev-1", "set", `{"setpoint":23}`)
		if res := sendResult(t, r); r.code != 0 || res.Verdict != "accepted" || res.Seq != 2 {
			t.Fatalf("second send: %+v, want accepted seq 2\n%s", res, r)
		}
	})

	t.Run("bad body is invalid", func(t *testing.T) {
		r := edgefence(t, "send", "--json", "--socket", sock, "dev-2", "set", `{"mode":"warp"}`)
		res := sendResult(t, r)
		if r.code != 3 || res.Verdict != "invalid" || res.Ack == nil || res.Ack.Verdict != fence.Invalid {
			t.Fatalf("got %+v, want verdict invalid and exit 3\n%s", res, r)
		}
		if s, err := e.fleet.State("dev-2"); err != nil || s.Mode == "warp" {
			t.Fatalf("device state %+v, %v: the invalid command was applied", s, err)
		}
	})

	t.Run("send --no-wait is queued, then accepted", func(t *testing.T) {
		r := edgefence(t, "send", "--json", "--no-wait", "--socket", sock, "dev-3", "set", `{"setpoint":21}`)
		res := sendResult(t, r)
		if r.code != 4 || !res.Queued || res.ID == "" || res.Verdict != "" || res.Token != uint64(st.Devices[2].Token) {
			t.Fatalf("got %+v, want queued with an id and exit 4\n%s", res, r)
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			r = edgefence(t, "outbox", "show", "--json", "--socket", sock, res.ID)
			if r.code == 0 && strings.Contains(r.stdout, `"accepted"`) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("queued command never accepted\n%s", r)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if s, err := e.fleet.State("dev-3"); err != nil || s.Setpoint != 21 {
			t.Fatalf("device state %+v, %v: want setpoint 21", s, err)
		}
	})

	t.Run("unknown device", func(t *testing.T) {
		r := edgefence(t, "send", "--json", "--socket", sock, "dev-9", "set", `{"setpoint":22}`)
		res := sendResult(t, r)
		if r.code != 1 || res.Verdict != "" || !strings.Contains(res.Error, "unknown device") {
			t.Fatalf("got %+v, want an unknown device error and exit 1\n%s", res, r)
		}
		if !strings.Contains(r.stderr, "unknown device") {
			t.Errorf("stderr does not say why\n%s", r)
		}
	})

	t.Run("usage errors", func(t *testing.T) {
		for _, args := range [][]string{
			{"send", "--socket", sock, "dev-1"},
			{"send", "--socket", sock, "dev-1", "set", "{}", "extra"},
		} {
			if r := edgefence(t, args...); r.code != 2 {
				t.Errorf("want exit 2\n%s", r)
			}
		}
		if r := edgefence(t, "send", "--socket", sock, "dev-1", "set", `{"setpoint":`); r.code != 1 || !strings.Contains(r.stderr, "not valid JSON") {
			t.Errorf("want exit 1 and not valid JSON\n%s", r)
		}
	})

	t.Run("status text", func(t *testing.T) {
		js, r := status(t, sock)
		if js == nil {
			t.Fatalf("status --json failed\n%s", r)
		}
		r = edgefence(t, "status", "--socket", sock)
		if r.code != 0 {
			t.Fatalf("status failed\n%s", r)
		}
		c := js.Counters
		for _, s := range []string{"gateway  gw-1", "DEVICE", "STATE", "TOKEN", "SEQ", "LAST VERDICT",
			fmt.Sprintf("sent %d: accepted %d, duplicate %d, stale %d, invalid %d", c.Sent, c.Accepted, c.Duplicate, c.Stale, c.Invalid)} {
			if !strings.Contains(r.stdout, s) {
				t.Errorf("status text lacks %q:\n%s", s, r.stdout)
			}
		}
		rows := map[string][]string{}
		for _, line := range strings.Split(r.stdout, "\n") {
			if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], "dev-") {
				rows[f[0]] = f
			}
		}
		if len(rows) != len(e.devices) {
			t.Errorf("status text has %d device rows, want %d:\n%s", len(rows), len(e.devices), r.stdout)
		}
		for _, d := range js.Devices {
			last := "-"
			if d.LastAck != nil {
				last = d.LastAck.Verdict.String()
			}
			want := []string{d.ID, d.State, fmt.Sprint(d.Token), fmt.Sprint(d.Seq), last}
			if f := rows[d.ID]; len(f) < len(want) || !slices.Equal(f[:len(want)], want) {
				t.Errorf("row %q, want it to start with %q", f, want)
			}
		}
	})

	t.Run("devices", func(t *testing.T) {
		r := edgefence(t, "devices", "--json", "--socket", sock)
		var devs []agent.DeviceStatus
		if err := json.Unmarshal([]byte(r.stdout), &devs); r.code != 0 || err != nil {
			t.Fatalf("devices --json: %v\n%s", err, r)
		}
		if len(devs) != 3 || devs[0].Verdicts.Accepted != 2 || devs[1].Verdicts.Invalid != 1 || devs[2].Verdicts.Accepted != 1 ||
			devs[0].Fence != agent.FenceDevice || devs[0].Policy != agent.PolicyStrict {
			t.Fatalf("devices %+v", devs)
		}
		r = edgefence(t, "devices", "--socket", sock)
		if r.code != 0 {
			t.Fatalf("devices failed\n%s", r)
		}
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		if len(lines) != 4 || strings.Join(strings.Fields(lines[0]), " ") != "DEVICE STATE TOKEN FENCE POLICY AUTH PENDING OLDEST ACCEPTED/STALE LAST VERDICT REASON" {
			t.Fatalf("devices table:\n%s", r.stdout)
		}
		for i, d := range devs {
			f := strings.Fields(lines[i+1])
			want := []string{d.ID, agent.StateHolding, fmt.Sprint(d.Token), "device", "strict", "off", "0", "-"}
			if len(f) < 9 || !slices.Equal(f[:8], want) {
				t.Errorf("row %q, want it to start with %q", f, want)
			}
		}
		if !strings.Contains(lines[1], "2/0") || !strings.Contains(lines[2], "0/0 (inv 1)") || !strings.Contains(lines[2], "invalid (token") {
			t.Errorf("devices table verdicts:\n%s", r.stdout)
		}
	})

	// Stopping the agent is checked by the cleanup: SIGTERM, exit 0.
}

// Without a running agent, every command that asks it fails at once with
// exit 6 and an error that says why: no socket file, a stale one nobody
// listens on, or one we may not open.
func TestNoAgent(t *testing.T) {
	dir := t.TempDir()
	missing, stale := filepath.Join(dir, "none.sock"), filepath.Join(dir, "stale.sock")
	l, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	cases := []struct {
		sock string
		want string
	}{
		{missing, "no agent at " + missing + " (is edgefence running? systemctl status edgefence; or pass --socket/--config)"},
		{stale, "no agent listens on " + stale + ": a stale socket"},
	}
	if os.Geteuid() == 0 {
		t.Run("EACCES as nobody", testNoAgentAsNobody)
	} else {
		// A socket with a listener that we may not open.
		locked := filepath.Join(dir, "locked.sock")
		l, err := net.Listen("unix", locked)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		if err := os.Chmod(locked, 0); err != nil {
			t.Fatal(err)
		}
		cases = append(cases, struct{ sock, want string }{locked, "permission denied on " + locked})
	}
	for _, tc := range cases {
		for _, args := range [][]string{
			{"send", "--socket", tc.sock, "dev-1", "set", `{"setpoint":22}`},
			{"status", "--socket", tc.sock},
			{"status", "--json", "--socket", tc.sock},
			{"devices", "--socket", tc.sock},
			{"outbox", "list", "--socket", tc.sock},
			{"fence", "list", "--socket", tc.sock},
		} {
			start := time.Now()
			r := edgefence(t, args...)
			if r.code != 6 || !strings.Contains(r.stderr, tc.want) {
				t.Errorf("want exit 6 and %q\n%s", tc.want, r)
			}
			if r.stdout != "" {
				t.Errorf("stdout not empty\n%s", r)
			}
			t.Logf("%s failed in %v: %s", args[0], time.Since(start), strings.TrimSpace(r.stderr))
		}
	}
}

// testNoAgentAsNobody checks, when the tests run as root (who may open any
// socket), the permission-denied message as user nobody: a copy of this
// binary run with uid/gid 65534 on a root-only socket.
func testNoAgentAsNobody(t *testing.T) {
	// t.TempDir's parent is private to root: a dir in the system's own.
	dir, err := os.MkdirTemp("", "edgefence-eacces-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for d := filepath.Dir(dir); d != "/" && d != "."; d = filepath.Dir(d) {
		if fi, err := os.Stat(d); err != nil || fi.Mode().Perm()&0o001 == 0 {
			t.Skipf("EACCES not tested: %s is not searchable by nobody", d)
		}
	}
	bin := filepath.Join(dir, "edgefence")
	src, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, src, 0o755); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "root-only.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := os.Chmod(sock, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), bin, "status", "--socket", sock)
	cmd.Env = append(os.Environ(), subprocEnv()...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 6 || !strings.Contains(string(out), "permission denied on "+sock) {
		t.Errorf("status as nobody on a root-only socket: %v\n%s", err, out)
	}
	t.Logf("as nobody: %s", strings.TrimSpace(string(out)))
}
