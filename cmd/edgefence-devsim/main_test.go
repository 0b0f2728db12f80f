package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// asMainEnv makes the test binary run main(), so that the tests drive the
// real program as a subprocess (signals, exit codes, restarts).
const asMainEnv = "EDGEFENCE_DEVSIM_AS_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(asMainEnv) == "1" {
		main()
		return
	}
	if err := sandbox.QuickRaceExit(); err != nil { // devices reboot and stop: no 1 s race sleep at each exit
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	goleak.VerifyTestMain(m)
}

// devsim is a running edgefence-devsim process.
type devsim struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	stderr bytes.Buffer
	ready  chan struct{}
	exited chan struct{}
}

func startDevsim(t testing.TB, args ...string) *devsim {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), asMainEnv+"=1")
	pipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	d := &devsim{cmd: cmd, ready: make(chan struct{}), exited: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(d.exited)
		sc := bufio.NewScanner(pipe)
		once := sync.Once{}
		for sc.Scan() {
			d.mu.Lock()
			d.stderr.WriteString(sc.Text() + "\n")
			d.mu.Unlock()
			if strings.Contains(sc.Text(), "msg=ready") {
				once.Do(func() { close(d.ready) })
			}
		}
	}()
	t.Cleanup(func() {
		if d.cmd.ProcessState == nil {
			d.cmd.Process.Kill()
			d.wait(t)
		}
	})
	return d
}

// readVerdictLog reads the verdict log file at path.
func readVerdictLog(t *testing.T, path string) []sim.VerdictRecord {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := sim.ReadVerdictLog(f)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

func (d *devsim) log() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stderr.String()
}

func (d *devsim) awaitReady(t *testing.T) {
	t.Helper()
	select {
	case <-d.ready:
	case <-d.exited:
		t.Fatalf("devsim exited before ready:\n%s", d.log())
	case <-time.After(15 * time.Second):
		t.Fatalf("devsim not ready:\n%s", d.log())
	}
}

// wait waits for the process to exit and returns its exit code.
func (d *devsim) wait(t testing.TB) int {
	t.Helper()
	select {
	case <-d.exited:
	case <-time.After(15 * time.Second):
		d.cmd.Process.Kill()
		t.Errorf("devsim did not exit:\n%s", d.log())
		<-d.exited
	}
	d.cmd.Wait()
	return d.cmd.ProcessState.ExitCode()
}

func (d *devsim) stop(t *testing.T, sig os.Signal) {
	t.Helper()
	if err := d.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	if code := d.wait(t); code != 0 {
		t.Fatalf("exit code %d after %v:\n%s", code, sig, d.log())
	}
}

func ptr[T any](v T) *T { return &v }

func TestDevsimRunsAndResumes(t *testing.T) {
	url := startBroker(t)
	dir := filepath.Join(t.TempDir(), "data") // created by the devsim
	vlog := filepath.Join(t.TempDir(), "verdicts.jsonl")
	topics := mqtt.Topics{Prefix: "site-a/v1"}
	k := sandbox.NewCommander(t, url, topics)

	d := startDevsim(t, "--mqtt", url, "--prefix", topics.Prefix, "--devices", "dev-1,dev-2", "--dir", dir, "--log", vlog)
	d.awaitReady(t)
	if a := k.Send(t, "dev-1", 70, 1, sim.SetBody{Setpoint: ptr(21.0), Mode: ptr("heat")}); a.Verdict != fence.Accepted {
		t.Fatalf("%+v", a)
	}
	if a := k.Send(t, "dev-2", 71, 1, sim.SetBody{Relay: ptr(true)}); a.Verdict != fence.Accepted {
		t.Fatalf("%+v", a)
	}
	if a := k.Send(t, "dev-1", 72, 1, sim.SetBody{Mode: ptr("cool")}); a.Verdict != fence.Accepted {
		t.Fatalf("%+v", a)
	}
	d.stop(t, syscall.SIGTERM)

	// Same directory, devices named by --count: the marks and states resume.
	d = startDevsim(t, "--mqtt", url, "--prefix", topics.Prefix, "--count", "2", "--id-prefix", "dev-", "--dir", dir, "--log", vlog)
	d.awaitReady(t)
	if a := k.Send(t, "dev-1", 70, 2, sim.SetBody{Mode: ptr("heat")}); a.Verdict != fence.Stale || a.Mark() != (fence.Mark{Token: 72, Seq: 1}) {
		t.Fatalf("stale after restart: %+v", a)
	}
	if a := k.Send(t, "dev-1", 72, 1, sim.SetBody{Mode: ptr("cool")}); a.Verdict != fence.Duplicate {
		t.Fatalf("duplicate after restart: %+v", a)
	}
	if a := k.Send(t, "dev-2", 71, 2, sim.SetBody{Setpoint: ptr(17.5)}); a.Verdict != fence.Accepted {
		t.Fatalf("%+v", a)
	}
	d.stop(t, os.Interrupt)
	if l := d.log(); !strings.Contains(l, "msg=stopped") || !strings.Contains(l, "accepted=1") {
		t.Errorf("shutdown log:\n%s", l)
	}

	recs := readVerdictLog(t, vlog)
	// The broker may redeliver a command whose PUBACK the shutdown cut off:
	// the resumed devsim must answer it as a duplicate, never apply it twice.
	var got []string
	accepted := map[fence.Mark]bool{}
	for _, r := range recs {
		m := fence.Mark{Token: r.Token, Seq: r.Seq}
		switch {
		case r.Verdict == fence.Accepted && accepted[m]:
			t.Fatalf("%v applied twice", m)
		case r.Verdict == fence.Accepted:
			accepted[m] = true
		case r.Verdict == fence.Duplicate && !accepted[m]:
			t.Fatalf("duplicate of %v, which was never accepted", m)
		case r.Verdict == fence.Duplicate && r.ID != "dev-1-72-1":
			t.Logf("redelivered after restart: %s", r.ID)
		}
		got = append(got, fmt.Sprintf("%s:%d/%d:%s", r.Device, r.Token, r.Seq, r.Verdict))
	}
	want := "dev-1:70/1:accepted dev-2:71/1:accepted dev-1:72/1:accepted dev-1:70/2:stale dev-2:71/2:accepted"
	var filtered []string
	for _, g := range got {
		if !strings.HasSuffix(g, ":duplicate") {
			filtered = append(filtered, g)
		}
	}
	if strings.Join(filtered, " ") != want || !strings.Contains(strings.Join(got, " "), "dev-1:70/2:stale dev-1:72/1:duplicate") {
		t.Fatalf("verdict log %v\nwant %s (plus duplicates)", got, want)
	}
	var dev2 *sim.State
	for _, r := range recs {
		if r.Device == "dev-2" {
			dev2 = r.State
		}
	}
	if dev2 == nil || !dev2.Relay || dev2.Setpoint != 17.5 || dev2.Applied != 2 {
		t.Fatalf("dev-2 final state %+v", dev2)
	}
	var dev1 *sim.State
	for _, r := range recs {
		if r.Device == "dev-1" && r.Verdict == fence.Stale {
			dev1 = r.State
		}
	}
	if dev1 == nil || dev1.Mode != "cool" || dev1.Setpoint != 21 || dev1.Applied != 2 {
		t.Fatalf("dev-1 state after restart %+v", dev1)
	}
}

// TestDevsimKill9 kills the devsim with SIGKILL while a command is in
// flight, several times, and checks that every command took effect exactly
// once: the broker redelivers what the dead process had not acknowledged,
// and the fence point answers a redelivery of a committed command as a
// duplicate.
func TestDevsimKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("runs and kills subprocesses")
	}
	url := startBroker(t)
	dir := t.TempDir()
	vlog := filepath.Join(t.TempDir(), "verdicts.jsonl")
	k := sandbox.NewCommander(t, url, mqtt.Topics{})
	args := []string{"--mqtt", url, "--devices", "dev-k", "--dir", dir, "--log", vlog}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 9))
	sent := 0
	next := func() (fence.Token, uint64, sim.SetBody) {
		i := sent
		sent++
		return fence.Token(1000 + i/4), uint64(i%4 + 1), sim.SetBody{Setpoint: ptr(float64(i % 100))}
	}
	type command struct {
		tok fence.Token
		seq uint64
		set sim.SetBody
	}
	var inflight *command
	for round := range 5 {
		d := startDevsim(t, args...)
		d.awaitReady(t)
		if c := inflight; c != nil {
			// Like the agent, keep one command in flight per device: the
			// one left in flight by the kill is answered (applied before
			// the kill, or redelivered or resent now) before the next is
			// sent. A later command overtaking it would make it stale or
			// a duplicate never applied.
			if a := k.AwaitResending(t, "dev-k", c.tok, c.seq, c.set); a.Verdict != fence.Accepted && a.Verdict != fence.Duplicate {
				t.Fatalf("round %d: in-flight command: %+v", round, a)
			}
		}
		for range 3 + rng.IntN(15) {
			tok, seq, set := next()
			if a := k.Send(t, "dev-k", tok, seq, set); a.Verdict != fence.Accepted && a.Verdict != fence.Duplicate {
				t.Fatalf("round %d: %+v", round, a)
			}
		}
		tok, seq, set := next()
		k.Publish(t, "dev-k", tok, seq, set) // left in flight
		inflight = &command{tok, seq, set}
		time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
		d.cmd.Process.Signal(syscall.SIGKILL)
		d.wait(t)
	}
	d := startDevsim(t, args...)
	d.awaitReady(t)
	if a := k.AwaitResending(t, "dev-k", inflight.tok, inflight.seq, inflight.set); a.Verdict != fence.Accepted && a.Verdict != fence.Duplicate {
		t.Fatalf("last in-flight command: %+v", a)
	}
	tok, seq, set := next()
	if a := k.Send(t, "dev-k", tok, seq, set); a.Verdict != fence.Accepted {
		t.Fatalf("last command: %+v", a)
	}
	d.stop(t, syscall.SIGTERM)

	h, err := sim.OpenHost(filepath.Join(dir, sim.DBFile), sim.HostConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	st, err := h.State("dev-k")
	if err != nil {
		t.Fatal(err)
	}
	if st.Applied != uint64(sent) || st.LastToken != tok || st.LastSeq != seq {
		t.Fatalf("after %d commands and 5 kills: state %+v", sent, st)
	}
	// Applied == sent above proves no command was lost for a Stale one.
	dups, late, accepted, err := sandbox.AppliedOnce(readVerdictLog(t, vlog))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d commands, each applied once; %d redeliveries answered as duplicates, %d late ones as stale; %d accepted lines logged (a kill between commit and log write loses the line, not the effect)",
		sent, dups, late, accepted)
}

func TestDevsimSecondInstanceOnSameDir(t *testing.T) {
	url := startBroker(t)
	dir := t.TempDir()
	d := startDevsim(t, "--mqtt", url, "--devices", "dev-1", "--dir", dir, "--log", filepath.Join(dir, "v.jsonl"))
	d.awaitReady(t)
	second := startDevsim(t, "--mqtt", url, "--devices", "dev-1", "--dir", dir, "--client-id", "other")
	if code := second.wait(t); code != 1 || !strings.Contains(second.log(), "database locked") {
		t.Fatalf("second instance: exit %d:\n%s", code, second.log())
	}
	d.stop(t, syscall.SIGTERM)
}

// TestEfsdevArgs: --c-device's children get efsdev's flags: the device's
// own directory, the broker, credentials, trust and history of the
// supervisor, the --fw-* settings.
func TestEfsdevArgs(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	f := newDevsimFlags(fs)
	if err := fs.Parse([]string{"--firmware", "--mqtt", "mqtt://h:1", "--dir", "/d", "--devices", "a", "--fw-window", "2s",
		"--mqtt-user", "u", "--history", "/h", "--trust-root", "/r.pub", "--certs", "/c1"}); err != nil {
		t.Fatal(err)
	}
	got := strings.Join(efsdevArgs(f, "fw-1"), " ")
	want := "--firmware --mqtt mqtt://h:1 --prefix edgefence/v1 --devices fw-1 --dir /d/fw-1 --fw-window 2000ms --fw-tries 3 " +
		"--fw-security 0 --mqtt-user u --history /h --history-source devsim:fw-1 --trust-root /r.pub --trust-root-kid operator --certs /c1"
	if got != want {
		t.Fatalf("efsdev args\n got %s\nwant %s", got, want)
	}
}

func TestUsage(t *testing.T) {
	t.Setenv(envMQTTPassword, "")
	for _, tt := range []struct {
		args []string
		want int
		msg  string
	}{
		{[]string{"--devices", "a", "--dir", "x"}, 2, "--mqtt is required"},
		{[]string{"--mqtt", "mqtt://h", "--devices", "a"}, 2, "--dir is required"},
		{[]string{"--mqtt", "mqtt://h", "--dir", "x"}, 2, "--devices or --count is required"},
		{[]string{"--mqtt", "mqtt://h", "--dir", "x", "--devices", "a", "--count", "3"}, 2, "not both"},
		{[]string{"--mqtt", "mqtt://h", "--dir", "x", "--count", "-1"}, 2, "positive"},
		{[]string{"--mqtt", "mqtt://h", "--dir", "x", "--devices", ","}, 2, "no device"},
		{[]string{"--mqtt", "mqtt://h", "--dir", "x", "--devices", "a", "extra"}, 2, "unexpected arguments"},
		{[]string{"--bogus"}, 2, "flag provided but not defined"},
		{[]string{"--help"}, 0, "Usage"},
		{[]string{"--mqtt", "mqtt://h", "--dir", t.TempDir(), "--devices", "bad/id"}, 1, "device id"},
		{[]string{"--mqtt", "mqtt://h", "--dir", "x", "--devices", "a", "--mqtt-user", "a"}, 2, "no password ($EDGEFENCE_MQTT_PASSWORD or --mqtt-password-file)"},
		{[]string{"--mqtt", "mqtt://h", "--dir", "x", "--devices", "a", "--mqtt-password-file", "p"}, 2, "--mqtt-password-file without --mqtt-user"},
		{[]string{"--mqtt", "mqtt://h", "--dir", "x", "--devices", "a", "--mqtt-user", "a", "--mqtt-password-file", filepath.Join(t.TempDir(), "none")}, 2, "--mqtt-password-file: open"},
		{[]string{"--serial", "/dev/null", "--mqtt-user", "a"}, 2, "not --mqtt, --mqtt-user"},
		{[]string{"--firmware", "--mqtt", "mqtt://h", "--dir", "x"}, 2, "--devices or --count is required"},
		{[]string{"--firmware", "--devices", "a", "--dir", "x"}, 2, "--mqtt is required"},
		{[]string{"--firmware", "--mqtt", "mqtt://h", "--devices", "a"}, 2, "--dir is required"},
		{[]string{"--firmware", "--firmware-device", "a", "--mqtt", "mqtt://h", "--dir", "x", "--devices", "a"}, 2, "not both"},
		{[]string{"--firmware", "--mqtt", "mqtt://h", "--dir", "x", "--devices", "a", "--client-id", "c"}, 2, "--client-id names one client"},
		{[]string{"--firmware", "--mqtt", "mqtt://h", "--dir", "x", "--devices", "a", "--log", "v.jsonl"}, 2, "firmware devices take no"},
		{[]string{"--firmware-device", "a", "--mqtt", "mqtt://h", "--dir", "x", "--count", "2"}, 2, "runs one device"},
		{[]string{"--firmware-device", "a", "--mqtt", "mqtt://h", "--dir", "x", "--fw-tries", "0"}, 2, "--fw-tries must be 1..255"},
		{[]string{"--firmware-device", "a", "--mqtt", "mqtt://h", "--dir", "x", "--fw-window", "0s"}, 2, "--fw-window must be positive"},
		{[]string{"--firmware", "--mqtt", "mqtt://h", "--dir", "x", "--devices", "a", "--restart-delay", "-1s"}, 2, "--restart-delay must not be negative"},
		{[]string{"--firmware-device", "bad/id", "--mqtt", "mqtt://h", "--dir", t.TempDir()}, 1, "device id"},
		{[]string{"--in-process", "--mqtt", "mqtt://h", "--dir", "x", "--devices", "a"}, 2, "--in-process runs the devices of --firmware"},
		{[]string{"--c-device", "efsdev", "--mqtt", "mqtt://h", "--dir", "x", "--devices", "a"}, 2, "--c-device runs the devices of --firmware"},
		{[]string{"--firmware", "--c-device", "efsdev", "--in-process", "--mqtt", "mqtt://h", "--dir", "x", "--devices", "a"}, 2,
			"--c-device runs the devices of --firmware"},
		{[]string{"--firmware-device", "a", "--in-process", "--mqtt", "mqtt://h", "--dir", "x"}, 2, "it needs --firmware"},
		{[]string{"--firmware", "--in-process", "--mqtt", "mqtt://h", "--dir", "x", "--devices", "a", "--client-id", "c"}, 2, "--client-id names one client"},
		{[]string{"--firmware", "--in-process", "--mqtt", "mqtt://h", "--dir", t.TempDir(), "--devices", "a,bad/id"}, 1, "device id"},
		{[]string{"--firmware", "--in-process", "--mqtt", "mqtt://h", "--dir", t.TempDir(), "--devices", "a", "--history", filepath.Join(t.TempDir(), "none", "h")}, 1, "history"},
		{[]string{"--firmware-device", "a", "--mqtt", "mqtt://h", "--dir", t.TempDir(), "--history", filepath.Join(t.TempDir(), "none", "h")}, 1, "open history"},
	} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), tt.args, &out, &errb); code != tt.want || !strings.Contains(errb.String(), tt.msg) {
			t.Errorf("run(%q) = %d, stderr %q; want %d with %q", tt.args, code, errb.String(), tt.want, tt.msg)
		}
	}
}

func TestDeviceIDs(t *testing.T) {
	ids, err := deviceIDs("", 3, "pump-")
	if err != nil || fmt.Sprint(ids) != "[pump-1 pump-2 pump-3]" {
		t.Fatalf("%v %v", ids, err)
	}
	ids, err = deviceIDs(" a, b ,,c", 0, "x")
	if err != nil || fmt.Sprint(ids) != "[a b c]" {
		t.Fatalf("%v %v", ids, err)
	}
}
