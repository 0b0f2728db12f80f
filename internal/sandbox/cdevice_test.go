package sandbox

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// checkSanitizerClean fails the test if a C process's log holds an ASan,
// LSan or UBSan report.
func checkSanitizerClean(t *testing.T, logPath string) {
	t.Helper()
	b, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	if r := SanitizerReport(b); r != "" {
		t.Fatalf("%s: sanitizer report:\n%s", filepath.Base(logPath), r)
	}
}

// TestFigure1CDevice is Figure 1 with the C device in place of devsim: A
// frozen past its lease, B takes over and writes, A resumes and its queued
// command reaches the devices, where the C fence point (efs_process)
// refuses it stale; every device ends with B's value and every command has
// one verdict. The commands are plain (the C device does not verify
// signatures of the trust chain yet: Figure1Config.Trust is refused).
func TestFigure1CDevice(t *testing.T) {
	bin := CDeviceForTest(t)
	var dir string
	res := runFigure1(t, func(c *Figure1Config) {
		c.Device, c.CDeviceBin = DeviceC, bin
		dir = c.Dir
	})
	if err := res.CheckFenced(); err != nil {
		t.Fatal(err)
	}
	checkLateRefusedAtDevice(t, res)
	checkEveryCommandHasOneVerdict(t, res)
	checkSanitizerClean(t, filepath.Join(dir, "devsim.log"))
}

func TestFigure1CDeviceRefusesUnsupported(t *testing.T) {
	for _, c := range []Figure1Config{
		{Device: DeviceC},
		{Device: DeviceC, CDeviceBin: "x", NoFence: true},
		{Device: DeviceC, CDeviceBin: "x", Serial: true},
		{Device: "rust"},
	} {
		if err := c.checkDevice(); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
}

var deviceOpenLine = regexp.MustCompile(`msg="device open" device=(\S+) token=(\d+) seq=(\d+) applied=(\d+)`)

// openedMark reads the mark and applied count efsdev logged at start.
func openedMark(t *testing.T, logPath string) (fence.Mark, uint64) {
	t.Helper()
	b, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	m := deviceOpenLine.FindSubmatch(b)
	if m == nil {
		t.Fatalf("%s: no device open line:\n%s", logPath, b)
	}
	tok, _ := strconv.ParseUint(string(m[2]), 10, 64)
	seq, _ := strconv.ParseUint(string(m[3]), 10, 64)
	applied, _ := strconv.ParseUint(string(m[4]), 10, 64)
	return fence.Mark{Token: fence.Token(tok), Seq: seq}, applied
}

// setpoint is a set command's body that changes the setpoint to v.
func setpoint(v float64) sim.SetBody { return sim.SetBody{Setpoint: &v} }

func markBelow(a, b fence.Mark) bool {
	return a.Token < b.Token || (a.Token == b.Token && a.Seq < b.Seq)
}

// cdevKill9 is one run of TestCDeviceKill9: the device's processes, the
// commands sent and the highest mark acked Accepted.
type cdevKill9 struct {
	bin, url, dir string
	k             *Commander
	sent          int
	acked         fence.Mark
}

func (r *cdevKill9) start(t *testing.T, round int, env ...string) (*Proc, string) {
	t.Helper()
	p, logPath := startDeviceProc(t, r.dir, round, env, r.bin, "--mqtt", r.url, "--devices", "dev-k",
		"--dir", filepath.Join(r.dir, "data"), "--log", filepath.Join(r.dir, "verdicts.jsonl"), "--client-id", "efsdev-kill9")
	if m, _ := openedMark(t, logPath); markBelow(m, r.acked) {
		t.Fatalf("round %d: the device restarted at mark %v below %v, which it had acked accepted", round, m, r.acked)
	}
	return p, logPath
}

// startDeviceProc runs a device process (efsdev, or edgefence-devsim)
// logging to dir/efsdev-<round>.log, stopped when the test ends, and waits
// until it is ready.
func startDeviceProc(t testing.TB, dir string, round int, env []string, bin string, args ...string) (*Proc, string) {
	t.Helper()
	logPath := filepath.Join(dir, fmt.Sprintf("efsdev-%d.log", round))
	p, err := StartProc(fmt.Sprintf("efsdev-%d", round), logPath, env, bin, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(10 * time.Second) })
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := p.WaitLine(ctx, "ready"); err != nil {
		t.Fatal(err)
	}
	return p, logPath
}

// next is the i-th command: four seqs per token.
func (r *cdevKill9) next() (fence.Token, uint64, sim.SetBody) {
	i := r.sent
	r.sent++
	sp := float64(i % 100)
	return fence.Token(1000 + i/4), uint64(i%4 + 1), sim.SetBody{Setpoint: &sp}
}

func (r *cdevKill9) answered(t *testing.T, what string, a fence.Ack, tok fence.Token, seq uint64) {
	t.Helper()
	switch a.Verdict {
	case fence.Accepted:
		if m := (fence.Mark{Token: tok, Seq: seq}); markBelow(r.acked, m) {
			r.acked = m
		}
	case fence.Duplicate:
	default:
		t.Fatalf("%s: %+v", what, a)
	}
}

// TestCDeviceKill9 kills the C device with SIGKILL while commands flow,
// five times: after each restart its mark on flash is at or above every
// command it acked Accepted, and at the end every command took effect
// exactly once (the state's applied count is the number sent; no mark is
// accepted twice in the verdict log).
func TestCDeviceKill9(t *testing.T) {
	r := &cdevKill9{bin: CDeviceForTest(t), dir: t.TempDir()}
	b := startBroker(t, BrokerConfig{})
	r.url = b.URL()
	r.k = NewCommander(t, r.url, mqtt.Topics{})
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 16))
	type command struct {
		tok fence.Token
		seq uint64
		set sim.SetBody
	}
	var inflight *command
	for round := range 5 {
		p, logPath := r.start(t, round)
		if c := inflight; c != nil {
			r.answered(t, "in-flight command", r.k.AwaitResending(t, "dev-k", c.tok, c.seq, c.set), c.tok, c.seq)
		}
		for range 3 + rng.IntN(15) {
			tok, seq, set := r.next()
			r.answered(t, fmt.Sprintf("round %d", round), r.k.Send(t, "dev-k", tok, seq, set), tok, seq)
		}
		tok, seq, set := r.next()
		r.k.Publish(t, "dev-k", tok, seq, set) // left in flight
		inflight = &command{tok, seq, set}
		time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
		if err := p.Kill(); err != nil {
			t.Fatal(err)
		}
		checkSanitizerClean(t, logPath)
	}
	p, logPath := r.start(t, 5)
	r.answered(t, "last in-flight command", r.k.AwaitResending(t, "dev-k", inflight.tok, inflight.seq, inflight.set), inflight.tok, inflight.seq)
	tok, seq, set := r.next()
	if a := r.k.Send(t, "dev-k", tok, seq, set); a.Verdict != fence.Accepted {
		t.Fatalf("last command: %+v", a)
	}
	if err := p.Stop(10 * time.Second); err != nil {
		t.Fatalf("efsdev: %v", err)
	}
	checkSanitizerClean(t, logPath)
	r.checkFinal(t, tok, seq)
}

// checkFinal restarts the device once more and checks its stored state and
// the verdict log.
func (r *cdevKill9) checkFinal(t *testing.T, tok fence.Token, seq uint64) {
	t.Helper()
	p, logPath := r.start(t, 6)
	if err := p.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	m, applied := openedMark(t, logPath)
	if m != (fence.Mark{Token: tok, Seq: seq}) || applied != uint64(r.sent) {
		t.Fatalf("after %d commands and 5 kills: mark %v applied %d; want %d/%d applied %d", r.sent, m, applied, tok, seq, r.sent)
	}
	f, err := os.Open(filepath.Join(r.dir, "verdicts.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := sim.ReadVerdictLog(f)
	if err != nil {
		t.Fatal(err) // efsdev writes each line in one write(2): a kill never leaves half a line
	}
	dups, late, accepted, err := AppliedOnce(recs)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d commands, each applied once across 5 kills; %d answered as duplicates, %d as stale; %d accepted lines logged", r.sent, dups, late, accepted)
}

// TestCDeviceKilledBetweenMarkAndState kills the C device (its failpoint)
// right after the second command's mark reached flash and before its
// effect reached the state journal: the restart applies the journalled
// command, so the command the mark says was taken is not lost, and a
// resend of it is a duplicate that applies nothing more. Without the
// journal's pending command, the device would restart at applied 1 with
// the first setpoint, and the resend would be refused as a duplicate: lost.
func TestCDeviceKilledBetweenMarkAndState(t *testing.T) {
	r := &cdevKill9{bin: CDeviceForTest(t), dir: t.TempDir()}
	b := startBroker(t, BrokerConfig{})
	r.url = b.URL()
	r.k = NewCommander(t, r.url, mqtt.Topics{})
	p, _ := r.start(t, 0, "EFSDEV_KILL_AFTER_MARK=2")
	if a := r.k.Send(t, "dev-k", 7, 1, setpoint(30)); a.Verdict != fence.Accepted {
		t.Fatalf("first command: %+v", a)
	}
	r.k.Publish(t, "dev-k", 7, 2, setpoint(40))
	select {
	case <-p.Done():
	case <-time.After(60 * time.Second):
		t.Fatal("the failpoint did not kill the device")
	}
	_, logPath := r.start(t, 1)
	if m, applied := openedMark(t, logPath); m != (fence.Mark{Token: 7, Seq: 2}) || applied != 2 {
		t.Fatalf("after the kill: mark %v applied %d; want 7/2 applied 2", m, applied)
	}
	if a := r.k.AwaitResending(t, "dev-k", 7, 2, setpoint(40)); a.Verdict != fence.Duplicate {
		t.Fatalf("resent second command: %+v", a)
	}
	f, err := os.Open(filepath.Join(r.dir, "verdicts.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := sim.ReadVerdictLog(f)
	if err != nil || len(recs) == 0 {
		t.Fatal(len(recs), err)
	}
	last := recs[len(recs)-1]
	if last.Verdict != fence.Duplicate || last.State == nil || last.State.Setpoint != 40 || last.State.Applied != 2 {
		t.Fatalf("last verdict %+v state %+v; want a duplicate with setpoint 40, applied 2", last, last.State)
	}
	checkSanitizerClean(t, logPath)
}

// benchDevices are the device processes the round-trip benchmarks compare:
// edgefence-devsim and efsdev ($EFSDEV_BIN, an -O2 build from make efsdev;
// else the test build).
func benchDevices(b *testing.B) []struct{ name, bin string } {
	_, devsim := binaries(b)
	cdev := os.Getenv("EFSDEV_BIN")
	if cdev == "" {
		cdev = CDeviceForTest(b)
	}
	return []struct{ name, bin string }{{"devsim", devsim}, {"efsdev", cdev}}
}

// BenchmarkDeviceRoundTrip is one accepted set command through the broker
// at a time, Commander to device and its ack back, for the Go simulator
// (edgefence-devsim: bbolt, one fsynced commit) and the C device (efsdev:
// the pending record, the mark's erase, program and commit byte, the
// state, each fdatasynced), in the same run. The C device is the test
// build (ASan/UBSan) unless $EFSDEV_BIN names another (make efsdev: -O2);
// devsim has the race detector when the benchmark does.
func BenchmarkDeviceRoundTrip(b *testing.B) {
	for _, kind := range benchDevices(b) {
		b.Run(kind.name, func(b *testing.B) {
			br := startBroker(b, BrokerConfig{})
			k := NewCommander(b, br.URL(), mqtt.Topics{})
			dir := b.TempDir()
			p, err := StartProc(kind.name, filepath.Join(dir, "dev.log"), nil, kind.bin, "--mqtt", br.URL(), "--devices", "dev-b",
				"--dir", filepath.Join(dir, "data"), "--log", filepath.Join(dir, "verdicts.jsonl"), "--client-id", "bench-"+kind.name)
			if err != nil {
				b.Fatal(err)
			}
			defer p.Stop(10 * time.Second)
			ctx, cancel := context.WithTimeout(b.Context(), 30*time.Second)
			defer cancel()
			if err := p.WaitLine(ctx, "ready"); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := range b.N {
				if a := k.Send(b, "dev-b", 1, uint64(i+1), setpoint(float64(i%100))); a.Verdict != fence.Accepted {
					b.Fatalf("%+v", a)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "commands/s")
		})
	}
}

// TestCDeviceUsage: a bad command line is a usage error (exit 2) naming
// what is wrong, a bad device id an error (exit 1) before anything is
// written, a second process on the same directory refused (exit 1).
func TestCDeviceUsage(t *testing.T) {
	bin := CDeviceForTest(t)
	dir := t.TempDir()
	for _, tt := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"--devices", "a", "--dir", dir}, 2, "--mqtt, --devices and --dir are required"},
		{[]string{"--mqtt", "mqtt://127.0.0.1:1", "--devices", "a", "--dir"}, 2, "a flag without its value"},
		{[]string{"--bogus", "x"}, 2, "unknown flag"},
		{[]string{"--mqtt", "mqtt://127.0.0.1:1", "--devices", "a", "--dir", dir, "--prefix", "a/#"}, 2, "--prefix"},
		{[]string{"--mqtt", "mqtt://127.0.0.1:1", "--devices", ",", "--dir", dir}, 2, "no device"},
		{[]string{"--mqtt", "mqtt://127.0.0.1:1", "--devices", "bad/id", "--dir", filepath.Join(dir, "x")}, 1, "bad device id"},
		{[]string{"--mqtt", "mqtt://127.0.0.1:1", "--devices", "a", "--dir", dir, "--mqtt-user", "u"}, 1, "without a password"},
	} {
		out, err := exec.Command(bin, tt.args...).CombinedOutput()
		code := 0
		if ee, ok := errors.AsType[*exec.ExitError](err); ok {
			code = ee.ExitCode()
		}
		if code != tt.code || !strings.Contains(string(out), tt.msg) {
			t.Errorf("efsdev %q: exit %d, %s; want %d with %q", tt.args, code, out, tt.code, tt.msg)
		}
		if r := SanitizerReport(out); r != "" {
			t.Errorf("efsdev %q: %s", tt.args, r)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "x", "bad/id.flash")); err == nil {
		t.Error("a refused device id got a flash file")
	}
	r := &cdevKill9{bin: bin, dir: dir, url: startBroker(t, BrokerConfig{}).URL()}
	p, _ := r.start(t, 0)
	out, err := exec.Command(bin, "--mqtt", r.url, "--devices", "dev-k", "--dir", filepath.Join(dir, "data")).CombinedOutput()
	if ee, ok := errors.AsType[*exec.ExitError](err); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "directory locked") {
		t.Errorf("second efsdev on the same directory: %v: %s", err, out)
	}
	if err := p.Stop(10 * time.Second); err != nil {
		t.Error(err)
	}
}

// TestCDeviceBadInput: what no agent sends (an empty message, bytes that
// are not CBOR, an envelope naming another device, a setpoint out of
// range, an unknown kind) is acked Invalid with a reason and changes
// nothing; the device goes on and accepts the next command.
func TestCDeviceBadInput(t *testing.T) {
	r := &cdevKill9{bin: CDeviceForTest(t), dir: t.TempDir()}
	r.url = startBroker(t, BrokerConfig{}).URL()
	r.k = NewCommander(t, r.url, mqtt.Topics{})
	p, logPath := r.start(t, 0)
	raw := func(e fence.Envelope) []byte {
		e.V, e.Holder = fence.Version, "gw-test"
		b, err := fence.MarshalEnvelope(&e)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	body, err := setpoint(999).Encode()
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, id string
		payload  []byte
	}{
		{"empty", "", nil},
		{"not CBOR", "", []byte{0xff, 0x00, 0x13}},
		{"another device", "c-other", raw(fence.Envelope{Device: "dev-x", Token: 5, Seq: 1, ID: "c-other", Kind: "set", Body: body})},
		{"setpoint out of range", "c-999", raw(fence.Envelope{Device: "dev-k", Token: 5, Seq: 1, ID: "c-999", Kind: "set", Body: body})},
		{"unknown kind", "c-kind", raw(fence.Envelope{Device: "dev-k", Token: 5, Seq: 1, ID: "c-kind", Kind: "reboot"})},
	} {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		err := r.k.Client.Publish(ctx, mqtt.Message{Topic: r.k.Topics.Cmd("dev-k"), Payload: tt.payload})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if a := r.k.Await(t, tt.id); a.Verdict != fence.Invalid || a.Reason == "" || a.Device != "dev-k" {
			t.Errorf("%s: ack %+v; want invalid with a reason", tt.name, a)
		}
	}
	if a := r.k.Send(t, "dev-k", 5, 1, setpoint(22)); a.Verdict != fence.Accepted {
		t.Fatalf("a good command after the bad ones: %+v", a)
	}
	if err := p.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	checkSanitizerClean(t, logPath)
	if _, applied := openedMark(t, filepath.Join(r.dir, "efsdev-0.log")); applied != 0 {
		t.Fatalf("applied %d at start", applied)
	}
	b, err := os.ReadFile(logPath)
	if err != nil || !strings.Contains(string(b), "invalid=5") || !strings.Contains(string(b), "accepted=1") {
		t.Fatalf("the device's counts at exit: %v\n%s", err, b)
	}
}

// TestCDeviceDamagedFlashFailsClosed: a committed mark record whose bytes
// no longer match its checksum (no older record to fall back on) makes the
// device refuse every command Invalid, logged at start, rather than start
// over from mark 0 and accept an old holder's token.
func TestCDeviceDamagedFlashFailsClosed(t *testing.T) {
	r := &cdevKill9{bin: CDeviceForTest(t), dir: t.TempDir()}
	r.url = startBroker(t, BrokerConfig{}).URL()
	r.k = NewCommander(t, r.url, mqtt.Topics{})
	p, _ := r.start(t, 0)
	if a := r.k.Send(t, "dev-k", 9, 1, setpoint(23)); a.Verdict != fence.Accepted {
		t.Fatalf("%+v", a)
	}
	if err := p.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	flash := filepath.Join(r.dir, "data", "dev-k.flash")
	b, err := os.ReadFile(flash)
	if err != nil || len(b) != 8192 {
		t.Fatalf("flash file: %d bytes, %v", len(b), err)
	}
	damaged := 0
	for s := 0; s < 2; s++ {
		if b[s*4096] != 0xff { // committed: flip a bit inside its record
			b[s*4096+12] ^= 0x01
			damaged++
		}
	}
	if damaged != 1 {
		t.Fatalf("%d committed slots after one write; want 1", damaged)
	}
	if err := os.WriteFile(flash, b, 0o600); err != nil {
		t.Fatal(err)
	}
	p, _ = r.start(t, 1)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := p.WaitLine(ctx, "stored mark unreadable"); err != nil {
		t.Fatal(err)
	}
	for _, tok := range []fence.Token{1, 9, 10} { // an old holder's, the stored one's, a newer one's
		if a := r.k.Send(t, "dev-k", tok, 2, setpoint(24)); a.Verdict != fence.Invalid {
			t.Fatalf("token %d on a damaged mark: %+v; want invalid", tok, a)
		}
	}
}

// TestFigure1FirmwareCDevice: the firmware failover proofs with the C
// device (efsdev --firmware: the library's job, its slots and record in
// files, a reboot a real exit with code 3 restarted by edgefence-devsim's
// supervisor): the holder frozen mid-download (its held chunk and a late
// fw.activate refused stale by the C code), killed mid-download (B
// resumes from the device's durable bytes) and killed during the reboot.
func TestFigure1FirmwareCDevice(t *testing.T) {
	bin := CDeviceForTest(t)
	for _, fault := range []FirmwareFault{FaultFreezeMidDownload, FaultKillMidDownload, FaultKillDuringReboot} {
		t.Run(string(fault), func(t *testing.T) {
			var dir string
			res := runFigure1Firmware(t, fault, func(c *Figure1FirmwareConfig) {
				c.CDeviceBin, dir = bin, c.Dir
				if fault == FaultKillDuringReboot {
					c.ImageSize = 256 << 10
				}
			})
			if fault.frozen() && len(res.Late) < 2 {
				t.Fatalf("late steps %+v; want A's chunk and its activate", res.Late)
			}
			checkSanitizerClean(t, filepath.Join(dir, "devices", res.Device, "devsim.log"))
		})
	}
}

// TestCDeviceResubscribesPacketIDInUse: commands queued in the device's
// broker session while it is down are in flight under the broker's packet
// identifiers when it reconnects, and mochi refuses a SUBSCRIBE whose
// identifier one of them uses (0x91). The device subscribes again under
// its next identifier and gets ready, then answers every queued command.
func TestCDeviceResubscribesPacketIDInUse(t *testing.T) {
	bin, dir := CDeviceForTest(t), t.TempDir()
	b := startBroker(t, BrokerConfig{})
	k := NewCommander(t, b.URL(), mqtt.Topics{})
	var devs []string
	for i := range 8 {
		devs = append(devs, fmt.Sprintf("dev-%d", i))
	}
	args := []string{"--mqtt", b.URL(), "--devices", strings.Join(devs, ","), "--dir", filepath.Join(dir, "data"),
		"--log", filepath.Join(dir, "verdicts.jsonl"), "--client-id", "efsdev-resub"}
	p, _ := startDeviceProc(t, dir, 0, nil, bin, args...)
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	// One command a device, as an agent has in flight: the broker's
	// identifiers 1..8, the restarted device's first SUBSCRIBEs 1..8.
	want := map[string]bool{}
	for i, d := range devs {
		want[k.Publish(t, d, 1, 1, setpoint(float64(20+i)))] = true
	}
	_, logPath := startDeviceProc(t, dir, 1, nil, bin, args...)
	deadline := time.After(60 * time.Second)
	for len(want) > 0 {
		select {
		case a := <-k.acks:
			if want[a.ID] && a.Verdict != fence.Accepted {
				t.Fatalf("queued command %s: %+v", a.ID, a)
			}
			delete(want, a.ID)
		case <-deadline:
			t.Fatalf("%d queued commands never answered: %v", len(want), want)
		}
	}
	log, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("SUBSCRIBEs refused and made again: %d", strings.Count(string(log), "again=1"))
	checkSanitizerClean(t, logPath)
}
