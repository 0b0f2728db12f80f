package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fxamacker/cbor/v2"

	"github.com/edgefence/edgefence/devices/fwjob"
	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/shadow"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// fwReport is a firmware device's state report as a test reads it.
type fwReport struct {
	Setpoint float64 `cbor:"setpoint"`
	Applied  uint64  `cbor:"applied"`
	Firmware string  `cbor:"firmware"`
	FW       struct {
		Job     string `cbor:"job"`
		State   string `cbor:"state"`
		Bytes   uint64 `cbor:"bytes"`
		Size    uint64 `cbor:"size"`
		Slot    string `cbor:"slot"`
		Version uint64 `cbor:"version"`
		Reason  string `cbor:"reason"`
		Token   uint64 `cbor:"token"`
		Image   string `cbor:"image"`
	} `cbor:"fw"`
	counter uint64     // a signed report's
	mark    fence.Mark // a signed report's
}

// fwCommander plays the holders of firmware devices: it sends fenced
// commands of any kind and reads the acks and the (retained) state reports.
type fwCommander struct {
	c      *mqtt.Client
	topics mqtt.Topics
	trust  auth.DeviceKeys // if set, acks and reports must be signed by the device

	mu      sync.Mutex
	waiters map[string]chan fence.Ack // by command id
	reports map[string][]fwReport     // per device, in arrival order
	changed chan struct{}             // closed and replaced on every report
}

func newFWCommander(t *testing.T, url string, topics mqtt.Topics) *fwCommander {
	t.Helper()
	return newFWCommanderTrusting(t, url, topics, nil)
}

// newFWCommanderTrusting is newFWCommander for devices that sign: acks
// and state reports not signed by a key trust allows for the device fail
// the test.
func newFWCommanderTrusting(t *testing.T, url string, topics mqtt.Topics, trust auth.DeviceKeys) *fwCommander {
	t.Helper()
	c := sandbox.DialTest(t, url, "fw-commander")
	k := &fwCommander{c: c, topics: topics, trust: trust, waiters: map[string]chan fence.Ack{}, reports: map[string][]fwReport{}, changed: make(chan struct{})}
	c.Subscribe(topics.AllAck(), func(m mqtt.Message) {
		a, err := k.ack(m.Payload)
		if err != nil {
			t.Errorf("ack on %s: %v", m.Topic, err)
			return
		}
		k.mu.Lock()
		defer k.mu.Unlock()
		if ch := k.waiters[a.ID]; ch != nil {
			select {
			case ch <- *a:
			default: // a second ack (a redelivery's): the first one counts
			}
		}
	})
	c.Subscribe(topics.State("+"), func(m mqtt.Message) { k.report(t, m) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.AwaitSubscribed(ctx); err != nil {
		t.Fatal(err)
	}
	return k
}

// ack decodes an ack: verified if k.trust is set.
func (k *fwCommander) ack(raw []byte) (*fence.Ack, error) {
	if k.trust == nil {
		return fence.UnmarshalAck(raw)
	}
	va, err := auth.VerifyAck(raw, k.trust)
	if err != nil {
		return nil, err
	}
	return va.Ack, nil
}

// report takes in a state report: it must pass the agent's decoding of
// state reports (shadow.DecodeCBOR with the default limits) as it is (or,
// signed, the state it carries).
func (k *fwCommander) report(t *testing.T, m mqtt.Message) {
	dev, _, _ := k.topics.Parse(m.Topic)
	payload, counter, mark := m.Payload, uint64(0), fence.Mark{}
	if k.trust != nil {
		vs, err := auth.VerifyState(payload, k.trust)
		if err != nil || vs.Report.Device != dev {
			t.Errorf("state report of %s: %v", dev, err)
			return
		}
		payload, counter = vs.Report.State, vs.Report.Counter
		mark = vs.Report.Mark()
	}
	if _, err := shadow.DecodeCBOR(payload, shadow.Limits{}); err != nil {
		t.Errorf("state report of %s refused by the twin's decoder: %v", dev, err)
		return
	}
	r := fwReport{counter: counter, mark: mark}
	if err := cbor.Unmarshal(payload, &r); err != nil {
		t.Errorf("state report of %s: %v", dev, err)
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.reports[dev] = append(k.reports[dev], r)
	close(k.changed)
	k.changed = make(chan struct{})
}

// awaitReport waits for a report of dev (any since the start) that ok
// accepts, and returns the last such one.
func (k *fwCommander) awaitReport(t *testing.T, dev string, what string, ok func(fwReport) bool) fwReport {
	t.Helper()
	return k.awaitReportFrom(t, dev, 0, what, ok)
}

// count returns the number of reports of dev so far.
func (k *fwCommander) count(dev string) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.reports[dev])
}

// awaitReportFrom is awaitReport among the reports of dev after the
// first from.
func (k *fwCommander) awaitReportFrom(t *testing.T, dev string, from int, what string, ok func(fwReport) bool) fwReport {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		k.mu.Lock()
		rs, ch := k.reports[dev], k.changed
		k.mu.Unlock()
		for i := len(rs) - 1; i >= from; i-- {
			if ok(rs[i]) {
				return rs[i]
			}
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("%s: no report %s; reports %+v", dev, what, rs)
		}
	}
}

// holder is one gateway's turn at a device: a token and its next seq.
type holder struct {
	k      *fwCommander
	dev    string
	token  fence.Token
	seq    uint64
	signer *auth.Signer // the gateway's key, if commands are signed
}

func (k *fwCommander) holder(dev string, token fence.Token) *holder {
	return &holder{k: k, dev: dev, token: token}
}

// send sends a command (the next seq) and returns its ack.
func (h *holder) send(t *testing.T, kind string, body any) fence.Ack {
	t.Helper()
	return h.sendEvery(t, kind, body, 0)
}

// sendEvery is send that publishes the same envelope again after each
// resend without an ack (0: never), as the agent's outbox does. A command
// decided just as its device goes down can lose its ack with the
// connection, and the broker need not deliver it again (the PUBACK may have
// gone out first): only a resend gets its answer, duplicate.
func (h *holder) sendEvery(t *testing.T, kind string, body any, resend time.Duration) fence.Ack {
	t.Helper()
	h.seq++
	b, err := fence.EncodeBody(body)
	if err != nil {
		t.Fatal(err)
	}
	id := fmt.Sprintf("%s-%d-%d", h.dev, h.token, h.seq)
	env := &fence.Envelope{V: fence.Version, Device: h.dev, Token: h.token, Seq: h.seq, ID: id,
		Kind: kind, Body: b, Holder: fmt.Sprintf("gw-%d", h.token)}
	var raw []byte
	if h.signer != nil {
		raw, err = h.signer.Sign(env)
	} else {
		raw, err = fence.MarshalEnvelope(env)
	}
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan fence.Ack, 1)
	h.k.mu.Lock()
	h.k.waiters[id] = ch
	h.k.mu.Unlock()
	deadline := time.After(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := h.k.c.Publish(ctx, mqtt.Message{Topic: h.k.topics.Cmd(h.dev), Payload: raw})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		var again <-chan time.Time
		if resend > 0 {
			again = time.After(resend)
		}
		select {
		case a := <-ch:
			return a
		case <-again:
		case <-deadline:
			t.Fatalf("no ack for %s (%s)", id, kind)
		}
	}
}

// must sends a command that must be accepted.
func (h *holder) must(t *testing.T, kind string, body any) {
	t.Helper()
	if a := h.send(t, kind, body); a.Verdict != fence.Accepted {
		t.Fatalf("%s %s: %v %q", h.dev, kind, a.Verdict, a.Reason)
	}
}

// fwImage is an image a test sends.
type fwImage struct {
	job     string
	data    []byte
	version uint64
	chunk   int
}

func newFWImage(t *testing.T, job string, n int, version uint64, markers ...string) fwImage {
	t.Helper()
	data, err := sim.FirmwareImage(n, markers...)
	if err != nil {
		t.Fatal(err)
	}
	return fwImage{job: job, data: data, version: version, chunk: 8 << 10}
}

func (im fwImage) sum() []byte { s := sha256.Sum256(im.data); return s[:] }

func (im fwImage) hex() string { return hex.EncodeToString(im.sum()) }

func (im fwImage) begin() fwjob.BeginBody {
	return fwjob.BeginBody{Job: im.job, Image: im.sum(), Size: uint64(len(im.data)), Version: im.version, Chunk: uint64(im.chunk)}
}

func (im fwImage) chunkAt(off uint64) fwjob.ChunkBody {
	end := min(off+uint64(im.chunk), uint64(len(im.data)))
	return fwjob.ChunkBody{Job: im.job, Off: off, Data: im.data[off:end]}
}

func (im fwImage) jobBody() fwjob.JobBody { return fwjob.JobBody{Job: im.job} }

// download sends im's chunks from off to the end; stop, if set, is
// called after each accepted chunk with the bytes sent and ends the
// download when it returns true.
func (h *holder) download(t *testing.T, im fwImage, off uint64, stop func(sent uint64) bool) uint64 {
	t.Helper()
	for off < uint64(len(im.data)) {
		c := im.chunkAt(off)
		h.must(t, fwjob.KindChunk, c)
		off += uint64(len(c.Data))
		if stop != nil && stop(off) {
			break
		}
	}
	return off
}

// pid reads the pid the supervisor wrote for dev.
func pidOf(t *testing.T, dir, dev string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, dev, PIDFile))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// awaitNewPID waits until the supervisor has started dev again (a pid
// other than old).
func awaitNewPID(t *testing.T, d *devsim, dir, dev string, old int) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if pid := pidOf(t, dir, dev); pid != old {
			return pid
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s not restarted (pid %d):\n%s", dev, old, d.log())
	return 0
}

// deviceLog returns the log of dev's processes (the supervisor's LogFile).
func deviceLog(dir, dev string) string {
	b, _ := os.ReadFile(filepath.Join(dir, dev, LogFile))
	return string(b)
}

// retainedReport subscribes a new client to dev's state topic and returns
// the retained report the broker hands it.
func retainedReport(t *testing.T, url string, topics mqtt.Topics, dev string) fwReport {
	t.Helper()
	c := sandbox.DialTest(t, url, "late-"+dev)
	got := make(chan mqtt.Message, 16)
	c.Subscribe(topics.State(dev), func(m mqtt.Message) { got <- m })
	select {
	case m := <-got:
		var r fwReport
		if err := cbor.Unmarshal(m.Payload, &r); err != nil || !m.Retain {
			t.Fatalf("state of %s on subscribe: retain %v, %v", dev, m.Retain, err)
		}
		return r
	case <-time.After(15 * time.Second):
		t.Fatalf("no retained state report of %s", dev)
	}
	return fwReport{}
}

func emptySum() string { s := sha256.Sum256(nil); return hex.EncodeToString(s[:]) }

func startFirmware(t *testing.T, url, dir string, devices string, extra ...string) *devsim {
	t.Helper()
	d := startDevsim(t, append([]string{"--firmware", "--mqtt", url, "--devices", devices, "--dir", dir,
		"--fw-window", "20s", "--restart-delay", "50ms"}, extra...)...) // a window a loaded machine's check passes in
	t.Cleanup(func() {
		if t.Failed() {
			for _, dev := range strings.Split(devices, ",") {
				t.Logf("%s's log:\n%s", dev, deviceLog(dir, dev))
			}
		}
	})
	d.awaitReady(t)
	return d
}

// TestFirmwareJob runs a whole firmware job at a real device process under
// the supervisor: begin, chunks, install, activate → the process exits
// with the reboot code and a new one boots the new slot → the retained
// report says confirming → commit → committed. The device's thermostat
// takes its commands behind the same fence point.
func TestFirmwareJob(t *testing.T) {
	url, dir := startBroker(t), t.TempDir()
	topics := mqtt.Topics{}
	k := newFWCommander(t, url, topics)
	d := startFirmware(t, url, dir, "fw-1", "--fw-security", "1")
	r := k.awaitReport(t, "fw-1", "after the first boot", func(r fwReport) bool { return r.FW.State == "idle" })
	if r.FW.Slot != "a" || r.FW.Image != emptySum() || r.FW.Version != 1 {
		t.Fatalf("boot report %+v", r)
	}

	h := k.holder("fw-1", 100)
	h.must(t, sim.KindSet, sim.SetBody{Setpoint: ptr(23.5)})
	if r := k.awaitReport(t, "fw-1", "after set", func(r fwReport) bool { return r.Applied == 1 }); r.Setpoint != 23.5 {
		t.Fatalf("after set: %+v", r)
	}
	im := newFWImage(t, "j1", 1<<20, 2, sim.VersionMarker+"2.0.0")
	im.chunk = fwjob.MaxChunk
	h.must(t, fwjob.KindBegin, im.begin())
	start := time.Now()
	h.download(t, im, 0, nil)
	dl := time.Since(start)
	h.must(t, fwjob.KindInstall, im.jobBody())
	k.awaitReport(t, "fw-1", "installed", func(r fwReport) bool { return r.FW.State == "installed" })
	pid := pidOf(t, dir, "fw-1")
	start = time.Now()
	h.must(t, fwjob.KindActivate, im.jobBody())
	awaitNewPID(t, d, dir, "fw-1", pid)
	r = k.awaitReport(t, "fw-1", "confirming", func(r fwReport) bool { return r.FW.State == "confirming" })
	t.Logf("figures: %d bytes in %d-byte chunks, one in flight, in %v (%.1f MB/s); fw.activate sent → confirming report (exit, restart, Boot with its check, MQTT session, report) in %v",
		len(im.data), im.chunk, dl.Round(time.Millisecond), float64(len(im.data))/dl.Seconds()/1e6, time.Since(start).Round(time.Millisecond))
	if r.FW.Slot != "b" || r.FW.Image != im.hex() || r.Firmware != "2.0.0" {
		t.Fatalf("after the reboot: %+v", r)
	}
	// A gateway that subscribes now (after a failover) reads it at once.
	if r := retainedReport(t, url, topics, "fw-1"); r.FW.State != "confirming" || r.FW.Slot != "b" {
		t.Fatalf("retained report after the reboot: %+v", r)
	}
	if !strings.Contains(d.log(), "msg=\"device rebooting\" device=fw-1") {
		t.Fatalf("supervisor log:\n%s", d.log())
	}
	h.must(t, fwjob.KindCommit, im.jobBody())
	r = k.awaitReport(t, "fw-1", "committed", func(r fwReport) bool { return r.FW.State == "committed" })
	if r.FW.Slot != "b" || r.FW.Version != 2 || r.Setpoint != 23.5 || r.FW.Token != 100 {
		t.Fatalf("after the commit: %+v", r)
	}
	pid = pidOf(t, dir, "fw-1")
	d.stop(t, syscall.SIGTERM)
	if alive(pid) || !strings.Contains(deviceLog(dir, "fw-1"), "msg=stopped device=fw-1 reboot=false exit_code=0") {
		t.Fatalf("device process %d after the supervisor's clean stop (alive %v):\n%s", pid, alive(pid), deviceLog(dir, "fw-1"))
	}
}

// TestFirmwareRollback: images whose health check fails, never answers or
// crashes the device are rolled back by the device itself after the
// reboot, and it runs its old slot again, saying why in its retained
// report. The crashing one dies (SIGKILL of itself) in every trial boot
// until the tries are spent.
func TestFirmwareRollback(t *testing.T) {
	url, dir := startBroker(t), t.TempDir()
	topics := mqtt.Topics{Prefix: "site-f/v1"}
	k := newFWCommander(t, url, topics)
	d := startFirmware(t, url, dir, "fw-fail,fw-hang,fw-crash", "--prefix", topics.Prefix, "--fw-tries", "2",
		"--fw-window", "2s") // what the hanging image waits out; the others fail at once
	for _, tt := range []struct {
		dev, health, reason string
	}{
		{"fw-fail", sim.HealthFail, "image marked EDGEFENCE-HEALTH=fail"},
		{"fw-hang", sim.HealthHang, "did not pass within 2s"},
		{"fw-crash", sim.HealthCrash, "trial boots exhausted"},
	} {
		t.Run(tt.health, func(t *testing.T) {
			t.Parallel()
			h := k.holder(tt.dev, 7)
			im := newFWImage(t, "j-"+tt.health, 20_000, 0, sim.VersionMarker+"9.9", sim.HealthMarker+tt.health)
			h.must(t, fwjob.KindBegin, im.begin())
			h.download(t, im, 0, nil)
			h.must(t, fwjob.KindInstall, im.jobBody())
			k.awaitReport(t, tt.dev, "installed", func(r fwReport) bool { return r.FW.State == "installed" })
			h.must(t, fwjob.KindActivate, im.jobBody())
			r := k.awaitReport(t, tt.dev, "rolled back", func(r fwReport) bool { return r.FW.State == "rolled_back" })
			if r.FW.Slot != "a" || r.FW.Image != emptySum() || r.Firmware != "" || !strings.Contains(r.FW.Reason, tt.reason) {
				t.Fatalf("after the reboot: %+v, want rolled back to slot a with %q", r, tt.reason)
			}
			if r := retainedReport(t, url, topics, tt.dev); r.FW.State != "rolled_back" || r.FW.Slot != "a" {
				t.Fatalf("retained: %+v", r)
			}
			// The job is over: a commit is refused, naming the state.
			if a := h.send(t, fwjob.KindCommit, im.jobBody()); a.Verdict != fence.Invalid || !strings.Contains(a.Reason, "state rolled_back") {
				t.Fatalf("commit after the roll back: %v %q", a.Verdict, a.Reason)
			}
		})
	}
	t.Cleanup(func() {
		crashes := regexp.MustCompile(`msg="device exited" device=fw-crash pid=\d+ exit_code=-1 status="signal: killed"`)
		if n := len(crashes.FindAllString(d.log(), -1)); n != 2 && !t.Failed() {
			t.Errorf("the crashing image killed its device %d times, want 2 (its tries):\n%s", n, d.log())
		}
	})
}

// TestFirmwareKill9MidDownload kills the device process with SIGKILL in
// the middle of a download (power loss): the supervisor starts it again,
// its retained report shows the bytes it holds, durable, and the download
// resumes from them. A newer holder (a failover) takes the job over from
// the reported bytes; the old holder's chunk is then stale, never
// written. The image completes and installs with its hash verified.
func TestFirmwareKill9MidDownload(t *testing.T) {
	url, dir := startBroker(t), t.TempDir()
	k := newFWCommander(t, url, mqtt.Topics{})
	d := startFirmware(t, url, dir, "fw-k")
	k.awaitReport(t, "fw-k", "after the boot", func(r fwReport) bool { return r.FW.State == "idle" })
	im := newFWImage(t, "j-k", 100_000, 0, sim.VersionMarker+"3.1")
	old := k.holder("fw-k", 100)
	old.must(t, fwjob.KindBegin, im.begin())
	sent := old.download(t, im, 0, func(sent uint64) bool { return sent >= 3*uint64(im.chunk) })

	pid, n := pidOf(t, dir, "fw-k"), k.count("fw-k")
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	awaitNewPID(t, d, dir, "fw-k", pid)
	r := k.awaitReportFrom(t, "fw-k", n, "after the restart", func(fwReport) bool { return true })
	if r.FW.State != "downloading" || r.FW.Bytes != sent || r.FW.Job != "j-k" || r.FW.Token != 100 {
		t.Fatalf("after kill -9 at %d bytes: %+v", sent, r)
	}
	if r := retainedReport(t, url, mqtt.Topics{}, "fw-k"); r.FW.Bytes != sent {
		t.Fatalf("retained after the restart: %+v", r)
	}
	sent = old.download(t, im, r.FW.Bytes, func(sent uint64) bool { return sent >= 6*uint64(im.chunk) })

	// A failover: the new holder resumes from the device's reported bytes.
	r = k.awaitReport(t, "fw-k", "with the old holder's chunks", func(r fwReport) bool { return r.FW.Bytes == sent })
	next := k.holder("fw-k", 200)
	off := next.download(t, im, r.FW.Bytes, func(uint64) bool { return true }) // one chunk
	if a := old.send(t, fwjob.KindChunk, im.chunkAt(off)); a.Verdict != fence.Stale {
		t.Fatalf("the deposed holder's chunk at %d: %v %q", off, a.Verdict, a.Reason)
	}
	next.download(t, im, off, nil)
	next.must(t, fwjob.KindInstall, im.jobBody())
	r = k.awaitReport(t, "fw-k", "installed", func(r fwReport) bool { return r.FW.State == "installed" })
	if r.FW.Bytes != uint64(len(im.data)) || r.FW.Token != 200 {
		t.Fatalf("installed: %+v", r)
	}
	slot, err := os.ReadFile(fwjob.SlotPath(filepath.Join(dir, "fw-k"), fwjob.SlotB))
	if err != nil || !bytes.Equal(slot, im.data) {
		t.Fatalf("slot b: %d bytes, %v; want the image's %d", len(slot), err, len(im.data))
	}
	d.stop(t, syscall.SIGTERM)
}

// TestFirmwareSupervisorDies: the children die with the supervisor, however
// it dies (Pdeathsig): kill -9 of the supervisor leaves no device process.
// A clean stop (SIGTERM) stops them too (TestFirmwareJob: exit code 0).
func TestFirmwareSupervisorDies(t *testing.T) {
	url, dir := startBroker(t), t.TempDir()
	d := startFirmware(t, url, dir, "fw-x,fw-y")
	pids := []int{pidOf(t, dir, "fw-x"), pidOf(t, dir, "fw-y")}
	t.Cleanup(func() { // only if the test failed: the test's own children
		for _, p := range pids {
			if alive(p) {
				syscall.Kill(p, syscall.SIGKILL)
			}
		}
	})
	for _, p := range pids {
		if !alive(p) {
			t.Fatalf("device process %d not running", p)
		}
	}
	d.cmd.Process.Kill()
	d.wait(t)
	deadline := time.Now().Add(30 * time.Second)
	for _, p := range pids {
		for alive(p) {
			if time.Now().After(deadline) {
				t.Fatalf("device process %d outlived its supervisor", p)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// alive reports whether process pid runs (a zombie does not).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

// TestFirmwareSigned: a firmware device with its own key (--device-keys)
// that takes only signed commands (--trust-root, --certs) signs its acks
// and its retained state reports, before and after a reboot, the
// report's counter growing across the restart.
func TestFirmwareSigned(t *testing.T) {
	kit, err := sandbox.NewTrustKit(filepath.Join(t.TempDir(), "trust"))
	if err != nil {
		t.Fatal(err)
	}
	gw, err := kit.Gateway("gw-1", "fw-s")
	if err != nil {
		t.Fatal(err)
	}
	keyDir, _, err := kit.DeviceKeys("fw-s")
	if err != nil {
		t.Fatal(err)
	}
	trust, err := kit.Trust()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := trust.AddCertificateFile(filepath.Join(keyDir, "fw-s.cert")); err != nil {
		t.Fatal(err)
	}
	key, err := auth.ReadKey(gw.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := auth.NewSigner([]byte(gw.KeyID), key)
	if err != nil {
		t.Fatal(err)
	}
	url, dir := startBroker(t), t.TempDir()
	k := newFWCommanderTrusting(t, url, mqtt.Topics{}, trust)
	d := startFirmware(t, url, dir, "fw-s", append(kit.DevsimArgs(""), "--device-keys", keyDir)...)
	boot := k.awaitReport(t, "fw-s", "after the boot", func(r fwReport) bool { return r.FW.State == "idle" })

	unsigned := k.holder("fw-s", 5)
	if a := unsigned.send(t, sim.KindSet, sim.SetBody{Relay: ptr(true)}); a.Verdict != fence.Invalid {
		t.Fatalf("unsigned command: %v %q", a.Verdict, a.Reason)
	}
	h := k.holder("fw-s", 6)
	h.signer = signer
	im := newFWImage(t, "j-s", 30_000, 1)
	// A device provisioned with the operator's root installs only images
	// the operator signed: a begin without the manifest is refused.
	if a := h.send(t, fwjob.KindBegin, im.begin()); a.Verdict != fence.Invalid || !strings.Contains(a.Reason, "manifest") {
		t.Fatalf("begin without a manifest: %v %q", a.Verdict, a.Reason)
	}
	begin := im.begin()
	if begin.Manifest, err = kit.Manifest(auth.Manifest{Image: im.sum(), Size: uint64(len(im.data)), Version: im.version}); err != nil {
		t.Fatal(err)
	}
	h.must(t, fwjob.KindBegin, begin)
	h.download(t, im, 0, nil)
	h.must(t, fwjob.KindInstall, im.jobBody())
	h.must(t, fwjob.KindActivate, im.jobBody())
	r := k.awaitReport(t, "fw-s", "confirming", func(r fwReport) bool { return r.FW.State == "confirming" })
	if r.counter <= boot.counter || r.FW.Image != im.hex() {
		t.Fatalf("after the reboot: %+v (boot report's counter %d)", r, boot.counter)
	}
	h.must(t, fwjob.KindCommit, im.jobBody())
	r = k.awaitReport(t, "fw-s", "committed", func(r fwReport) bool { return r.FW.State == "committed" })
	if want := (fence.Mark{Token: 6, Seq: h.seq}); r.mark != want {
		t.Fatalf("committed report's mark %v, want %v", r.mark, want)
	}
	// A report after a refused command carries the device's mark, not
	// the command's: a gateway must never take it for a newer one.
	n := k.count("fw-s")
	stranger := k.holder("fw-s", 99)
	stranger.signer = signer
	if a := stranger.send(t, "fw.bogus", fwjob.JobBody{Job: "x"}); a.Verdict != fence.Invalid {
		t.Fatalf("bogus kind: %v %q", a.Verdict, a.Reason)
	}
	if r := k.awaitReportFrom(t, "fw-s", n, "after the refusal", func(fwReport) bool { return true }); r.mark != (fence.Mark{Token: 6, Seq: h.seq}) {
		t.Fatalf("report after a refused command: mark %v, want the device's %v", r.mark, fence.Mark{Token: 6, Seq: h.seq})
	}
	d.stop(t, syscall.SIGTERM)
}
