package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/agent/daemon"
	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// beMain makes the test binary act as edgefence-sandbox, so the tests run
// the real main in a subprocess without a separate build.
const beMain = "EDGEFENCE_SANDBOX_TEST_BE_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(beMain) == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	goleak.VerifyTestMain(m)
}

func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"help"}, 0},
		{[]string{"serve", "-h"}, 0},
		{[]string{"bogus"}, 2},
		{[]string{"serve", "--no-such-flag"}, 2},
		{[]string{"serve", "extra"}, 2},
		{[]string{"serve", "--devices", "-1"}, 2},
		{[]string{"serve", "--devices", "many"}, 2},
	} {
		var out, errOut bytes.Buffer
		if code := run(tc.args, &out, &errOut); code != tc.code {
			t.Errorf("run(%q) = %d, want %d; stderr: %s", tc.args, code, tc.code, errOut.String())
		}
	}
}

// runMain runs edgefence-sandbox with args in a subprocess (so that a
// command that would start servers cannot hang the test) and returns its
// output and exit status.
func runMain(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), beMain+"=1")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("edgefence-sandbox %q still running after 30s (it started a server?); stdout:\n%s", args, out.String())
	}
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatal(err)
	}
	return out.String(), errOut.String(), cmd.ProcessState.ExitCode()
}

// TestFirstContact: with no command the sandbox does not start a server
// but lists its commands; -h and help list every command with a line each;
// a command's -h names the command, not "Usage of serve:".
func TestFirstContact(t *testing.T) {
	listsAll := func(t *testing.T, what, text string) {
		t.Helper()
		for _, want := range []string{"serve ", "demo ", "help ", "usage: edgefence-sandbox <command>"} {
			if !strings.Contains(text, want) {
				t.Errorf("%s lacks %q:\n%s", what, want, text)
			}
		}
	}
	stdout, stderr, code := runMain(t)
	if code != 2 || stdout != "" {
		t.Errorf("no arguments: exit %d, stdout %q; want 2 and nothing on stdout", code, stdout)
	}
	listsAll(t, "no arguments: stderr", stderr)

	for _, args := range [][]string{{"-h"}, {"--help"}, {"help"}} {
		stdout, stderr, code := runMain(t, args...)
		if code != 0 || strings.Contains(stderr, "Usage of") {
			t.Errorf("%q: exit %d, stderr %q", args, code, stderr)
		}
		listsAll(t, fmt.Sprintf("%q: stdout", args), stdout)
	}

	for _, name := range []string{"serve", "demo"} {
		for _, args := range [][]string{{name, "-h"}, {"help", name}} {
			var out, errOut bytes.Buffer
			code := run(args, &out, &errOut)
			text := out.String() + errOut.String()
			if code != 0 || strings.Contains(text, "Usage of") ||
				!strings.Contains(text, "usage: edgefence-sandbox "+name+" [flags]") || !strings.Contains(text, commands()[name].summary) {
				t.Errorf("%q: exit %d, output:\n%s", args, code, text)
			}
		}
	}

	// A flag first is a usage error that says where the command goes.
	if _, stderr, code := runMain(t, "--fast"); code != 2 || !strings.Contains(stderr, "edgefence-sandbox serve --fast") {
		t.Errorf("--fast: exit %d, stderr:\n%s", code, stderr)
	}
}

// TestServeBrokenStdout: serve whose stdout is a pipe nobody reads any
// more (serve | head -1, head gone) stops cleanly and removes its temp
// dir, instead of dying of SIGPIPE and leaving it behind.
func TestServeBrokenStdout(t *testing.T) {
	tmp := t.TempDir()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	r.Close() // the reader has gone before the first line is written
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "serve", "--fast", "--devices", "1")
	cmd.Env = append(os.Environ(), beMain+"=1", "TMPDIR="+tmp)
	if g := os.Getenv("GORACE"); !strings.Contains(g, "atexit_sleep_ms") {
		cmd.Env = append(cmd.Env, strings.TrimSpace("GORACE="+g+" atexit_sleep_ms=0"))
	}
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = w, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	err = cmd.Wait()
	if ctx.Err() != nil {
		t.Fatalf("serve still running 60s after its stdout closed; stderr:\n%s", stderr.String())
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		t.Errorf("serve killed by %v", ws.Signal())
	}
	if code := cmd.ProcessState.ExitCode(); code != 1 || !strings.Contains(stderr.String(), "stdout closed") {
		t.Errorf("exit %v (code %d), want 1 and a line saying stdout closed; stderr:\n%s", err, code, stderr.String())
	}
	if !strings.Contains(stderr.String(), "stopped") {
		t.Errorf("no clean stop logged; stderr:\n%s", stderr.String())
	}
	left, err := filepath.Glob(filepath.Join(tmp, "edgefence-sandbox-*"))
	if err != nil {
		t.Fatal(err)
	}
	if len(left) > 0 {
		t.Errorf("temp dir left behind: %q", left)
	}
}

// served is a running `edgefence-sandbox serve` subprocess.
type served struct {
	cmd    *exec.Cmd
	info   readyInfo
	words  string // the first line
	try    string // the rest of stdout up to the interrupt hint
	stderr *bytes.Buffer
}

// startServe runs serve with args in a subprocess and reads its ready
// output. The test must stop it (stop).
func startServe(t *testing.T, args ...string) *served {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, os.Args[0], append([]string{"serve"}, args...)...)
	cmd.Env = append(os.Environ(), beMain+"=1")
	if g := os.Getenv("GORACE"); !strings.Contains(g, "atexit_sleep_ms") {
		// Under -race, skip the detector's 1 s sleep at exit.
		cmd.Env = append(cmd.Env, strings.TrimSpace("GORACE="+g+" atexit_sleep_ms=0"))
	}
	s := &served{cmd: cmd, stderr: new(bytes.Buffer)}
	cmd.Stderr = s.stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil { // a failed test left it running
			cmd.Process.Kill()
			cmd.Wait()
		}
		if t.Failed() {
			t.Logf("serve stderr:\n%s", s.stderr.String())
		}
	})

	sc := bufio.NewScanner(stdout)
	var lines []string
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if strings.HasPrefix(sc.Text(), "Interrupt") {
			break
		}
	}
	if len(lines) < 3 || !strings.HasPrefix(lines[len(lines)-1], "Interrupt") {
		t.Fatalf("stdout %q, scan err %v", lines, sc.Err())
	}
	go io.Copy(io.Discard, stdout) // nothing more is expected; never block serve
	t.Logf("ready after %v:\n%s", time.Since(start), strings.Join(lines, "\n"))
	s.words, s.try = lines[0], strings.Join(lines[2:], "\n")
	if err := json.Unmarshal([]byte(lines[1]), &s.info); err != nil {
		t.Fatalf("JSON line %q: %v", lines[1], err)
	}
	return s
}

// stop sends SIGTERM and expects a clean exit.
func (s *served) stop(t *testing.T) {
	t.Helper()
	stopAt := time.Now()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := s.cmd.Wait(); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
	t.Logf("exited cleanly %v after SIGTERM", time.Since(stopAt))
}

func TestServeSubprocess(t *testing.T) {
	dir := t.TempDir()
	envFile := filepath.Join(dir, "sandbox.env")
	if err := os.WriteFile(envFile, []byte("EDGEFENCE_ETCD=stale\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := startServe(t, "--fast", "--dir", dir, "--env", envFile)
	info := s.info
	if info.Dir != dir || info.Env != envFile ||
		!strings.HasPrefix(info.Etcd, "http://127.0.0.1:") || !strings.HasPrefix(info.MQTT, "mqtt://127.0.0.1:") {
		t.Fatalf("ready info %+v", info)
	}
	if !strings.Contains(s.words, info.Etcd) || !strings.Contains(s.words, info.MQTT) {
		t.Fatalf("words line %q lacks the addresses", s.words)
	}

	// The env file is written before the ready lines.
	want := "EDGEFENCE_ETCD=" + info.Etcd + "\nEDGEFENCE_MQTT=" + info.MQTT + "\n"
	if b, err := os.ReadFile(envFile); string(b) != want {
		t.Fatalf("env file = %q (%v), want %q", b, err, want)
	}
	for _, raw := range []string{info.Etcd, info.MQTT} {
		u, _ := url.Parse(raw)
		c, err := net.DialTimeout("tcp", u.Host, time.Second)
		if err != nil {
			t.Fatalf("%s not accepting: %v", raw, err)
		}
		c.Close()
	}

	// Three devices by default, and a config for an agent to command them.
	wantDevs := []string{"dev-1", "dev-2", "dev-3"}
	if !slices.Equal(info.Devices, wantDevs) || info.VerdictLog != filepath.Join(dir, "verdicts.jsonl") ||
		info.Config != filepath.Join(dir, "gw-1.yaml") || info.Socket != filepath.Join(dir, "gw-1.sock") {
		t.Fatalf("ready info %+v", info)
	}
	u, _ := url.Parse(info.MQTT)
	for _, cmd := range []string{
		"edgefence run --config " + info.Config,
		"edgefence status --socket " + info.Socket,
		"edgefence send --socket " + info.Socket + ` dev-1 set '{"setpoint":22}'`,
		"mosquitto_sub -V mqttv5 -h 127.0.0.1 -p " + u.Port() + " -u watch -P " + info.MQTTUsers["watch"] + " -t 'edgefence/v1/dev/#' -v",
		"etcdctl --endpoints " + info.Etcd + " get --prefix /edgefence/v1",
	} {
		if !strings.Contains(s.try, "\n  "+cmd+"\n") {
			t.Errorf("the hints lack the command %s", cmd)
		}
	}
	cfg, err := agent.LoadConfig(info.Config)
	if err != nil {
		t.Fatalf("agent config: %v", err)
	}
	if cfg.Gateway != "gw-1" || !slices.Equal(cfg.Etcd.Endpoints, []string{info.Etcd}) ||
		!slices.Equal(cfg.MQTT.Brokers, []string{info.MQTT}) || cfg.API.Socket != info.Socket ||
		cfg.Etcd.LeaseTTL != 10*time.Second || len(cfg.Devices) != 3 || cfg.Devices[2].ID != "dev-3" {
		t.Fatalf("agent config %+v", cfg)
	}
	// The broker requires credentials: printed, and in the agent config.
	for _, u := range []string{"gw-1", "devices", "watch"} {
		if p := info.MQTTUsers[u]; len(p) < 16 || !strings.Contains(s.try, "  "+u+" ") || !strings.Contains(s.try, "password "+p+"\n") {
			t.Errorf("user %s: password %q, not printed in:\n%s", u, p, s.try)
		}
	}
	if cfg.MQTT.Username != "gw-1" || cfg.MQTT.Password.Value() != info.MQTTUsers["gw-1"] {
		t.Errorf("agent config MQTT user %q, password %v", cfg.MQTT.Username, cfg.MQTT.Password)
	}
	if st, err := os.Stat(info.Config); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("agent config holding a password: %v, mode %v; want 0600", err, st.Mode())
	}
	anon, err := mqtt.Dial(t.Context(), mqtt.Config{Brokers: []string{info.MQTT}, ClientID: "anonymous", CleanStart: true})
	if err != nil {
		t.Fatal(err)
	}
	actx, acancel := context.WithTimeout(t.Context(), time.Second)
	if err := anon.AwaitConnection(actx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("anonymous client: %v, want refused", err)
	}
	acancel()
	anon.Close(context.Background())

	// A real agent, run from that config, commands a served device.
	res := runAgent(t, cfg, func(c *agent.APIClient) (*agent.SendResult, error) {
		return c.Send(t.Context(), "dev-1", "set", json.RawMessage(`{"setpoint":22}`))
	})
	if res.Verdict != "accepted" || res.Seq != 1 || res.Token == 0 {
		t.Fatalf("send through the agent: %+v", res)
	}
	// The devices take signed commands only: a raw envelope with token
	// 2^63 and gw-1's broker credentials, but unsigned, is refused invalid;
	// one signed with gw-1's key (the sandbox made it, in the trust dir)
	// and a lower token is refused as stale.
	if cfg.Auth.KeyFile != filepath.Join(info.Trust, "gw-1.key") || cfg.Auth.TrustRoot != filepath.Join(info.Trust, "root.pub") || cfg.Devices[0].Auth != agent.AuthRequired {
		t.Fatalf("agent config auth %+v, device %+v: want signed with the sandbox's keys", cfg.Auth, cfg.Devices[0])
	}
	body, err := fence.EncodeBody(map[string]any{"setpoint": 99.0})
	if err != nil {
		t.Fatal(err)
	}
	ack := sendRaw(t, info.MQTT, info.MQTTUsers["gw-1"], nil, &fence.Envelope{V: fence.Version, Device: "dev-1", Token: 1 << 63,
		Seq: 1, ID: "raw-0", Kind: "set", Body: body, Holder: "test"})
	if ack.Verdict != fence.Invalid || ack.MaxToken != fence.Token(res.Token) {
		t.Fatalf("raw unsigned envelope: %+v", ack)
	}
	key, err := auth.ReadKey(cfg.Auth.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := auth.NewSigner([]byte(cfg.Auth.KeyID), key)
	if err != nil {
		t.Fatal(err)
	}
	ack = sendRaw(t, info.MQTT, info.MQTTUsers["gw-1"], signer, &fence.Envelope{V: fence.Version, Device: "dev-1", Token: fence.Token(res.Token - 1),
		Seq: 1, ID: "raw-1", Kind: "set", Body: body, Holder: "test"})
	if ack.Verdict != fence.Stale || ack.MaxToken != fence.Token(res.Token) {
		t.Fatalf("raw stale envelope: %+v", ack)
	}

	s.stop(t)
	if _, err := os.Stat(envFile); !os.IsNotExist(err) {
		t.Fatalf("env file left after exit: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "etcd", "member")); err != nil {
		t.Fatalf("--dir data not kept: %v", err)
	}
	f, err := os.Open(info.VerdictLog)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := sim.ReadVerdictLog(f)
	if err != nil || len(recs) != 3 {
		t.Fatalf("verdict log: %d records, %v; want 3", len(recs), err)
	}
	if r := recs[0]; r.Device != "dev-1" || r.Verdict != fence.Accepted || r.Holder != "gw-1" || r.State == nil || r.State.Setpoint != 22 {
		t.Errorf("first verdict %+v", r)
	}
	if r := recs[1]; r.ID != "raw-0" || r.Verdict != fence.Invalid || r.Mark() != recs[0].Mark() {
		t.Errorf("second verdict %+v", r)
	}
	if r := recs[2]; r.ID != "raw-1" || r.Verdict != fence.Stale {
		t.Errorf("third verdict %+v", r)
	}
}

func TestServeNoDevices(t *testing.T) {
	dir := t.TempDir()
	s := startServe(t, "--fast", "--dir", dir, "--devices", "0")
	if len(s.info.Devices) != 0 || s.info.Config != "" || s.info.VerdictLog != "" {
		t.Errorf("ready info %+v, want no devices", s.info)
	}
	if !strings.Contains(s.try, "--devices 0") || strings.Contains(s.try, "edgefence run") {
		t.Errorf("hints without devices:\n%s", s.try)
	}
	s.stop(t)
	for _, name := range []string{"gw-1.yaml", "verdicts.jsonl", "devices"} {
		if _, err := os.Stat(filepath.Join(dir, name)); !os.IsNotExist(err) {
			t.Errorf("%s exists with --devices 0 (%v)", name, err)
		}
	}
}

// runAgent runs an agent in-process from cfg, through agent/daemon as
// `edgefence run` does (its state in a temp dir), waits until it holds
// every device, calls send with a client of its API socket, and stops the
// agent.
func runAgent(t *testing.T, cfg *agent.Config, send func(*agent.APIClient) (*agent.SendResult, error)) *agent.SendResult {
	t.Helper()
	c := *cfg
	c.StateDir = t.TempDir()
	d, err := daemon.New(t.Context(), &c, daemon.Options{Notify: func(string) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	ids := make([]string, len(cfg.Devices))
	for i, d := range cfg.Devices {
		ids[i] = d.ID
	}

	client := agent.NewAPIClient(cfg.API.Socket)
	for deadline := time.Now().Add(30 * time.Second); ; {
		held := 0
		if st, err := client.Status(t.Context()); err == nil && st.Transport["connected"] == true {
			for _, d := range st.Devices {
				if d.State == agent.StateHolding {
					held++
				}
			}
		}
		if held == len(ids) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the agent does not hold every device")
		}
		time.Sleep(20 * time.Millisecond)
	}
	res, err := send(client)
	if err != nil {
		t.Fatalf("send: %+v, %v", res, err)
	}
	return res
}

// sendRaw publishes env on its device's command topic, logged in as
// gateway gw-1 with password, and returns the ack.
func sendRaw(t *testing.T, broker, password string, signer *auth.Signer, env *fence.Envelope) *fence.Ack {
	t.Helper()
	cmdr, err := mqtt.NewCommander(t.Context(), mqtt.Config{Brokers: []string{broker}, ClientID: "raw-" + t.Name(), CleanStart: true,
		Username: "gw-1", Password: []byte(password)},
		mqtt.Topics{}, []string{env.Device})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		cmdr.Close(ctx)
	}()
	if signer != nil {
		cmdr.SignWith(signer.Sign)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := cmdr.Client().AwaitSubscribed(ctx); err != nil {
		t.Fatal(err)
	}
	ack, err := cmdr.Send(ctx, env)
	if err != nil {
		t.Fatal(err)
	}
	return ack
}
