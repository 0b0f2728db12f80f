package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
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
}

// fwCommander plays the holders of firmware devices: it sends fenced
// commands of any kind and reads the acks and the (retained) state reports.
type fwCommander struct {
	c      *mqtt.Client
	topics mqtt.Topics
	acks   chan fence.Ack

	mu      sync.Mutex
	reports map[string][]fwReport // per device, in arrival order
	changed chan struct{}         // closed and replaced on every report
}

func newFWCommander(t *testing.T, url string, topics mqtt.Topics) *fwCommander {
	t.Helper()
	c := dialTest(t, url, "fw-commander")
	k := &fwCommander{c: c, topics: topics, acks: make(chan fence.Ack, 256), reports: map[string][]fwReport{}, changed: make(chan struct{})}
	c.Subscribe(topics.AllAck(), func(m mqtt.Message) {
		if a, err := fence.UnmarshalAck(m.Payload); err == nil {
			k.acks <- *a
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

// report takes in a state report: it must pass the agent's decoding of
// state reports (shadow.DecodeCBOR with the default limits) as it is.
func (k *fwCommander) report(t *testing.T, m mqtt.Message) {
	dev, _, _ := k.topics.Parse(m.Topic)
	if _, err := shadow.DecodeCBOR(m.Payload, shadow.Limits{}); err != nil {
		t.Errorf("state report of %s refused by the twin's decoder: %v", dev, err)
		return
	}
	var r fwReport
	if err := cbor.Unmarshal(m.Payload, &r); err != nil {
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
	deadline := time.After(60 * time.Second)
	for {
		k.mu.Lock()
		rs, ch := k.reports[dev], k.changed
		k.mu.Unlock()
		for i := len(rs) - 1; i >= 0; i-- {
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

// last returns dev's last report.
func (k *fwCommander) last(dev string) fwReport {
	k.mu.Lock()
	defer k.mu.Unlock()
	rs := k.reports[dev]
	if len(rs) == 0 {
		return fwReport{}
	}
	return rs[len(rs)-1]
}

// holder is one gateway's turn at a device: a token and its next seq.
type holder struct {
	k     *fwCommander
	dev   string
	token fence.Token
	seq   uint64
}

func (k *fwCommander) holder(dev string, token fence.Token) *holder {
	return &holder{k: k, dev: dev, token: token}
}

// send sends a command (the next seq) and returns its ack.
func (h *holder) send(t *testing.T, kind string, body any) fence.Ack {
	t.Helper()
	h.seq++
	b, err := fence.EncodeBody(body)
	if err != nil {
		t.Fatal(err)
	}
	id := fmt.Sprintf("%s-%d-%d", h.dev, h.token, h.seq)
	raw, err := fence.MarshalEnvelope(&fence.Envelope{V: fence.Version, Device: h.dev, Token: h.token, Seq: h.seq, ID: id,
		Kind: kind, Body: b, Holder: fmt.Sprintf("gw-%d", h.token)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.k.c.Publish(ctx, mqtt.Message{Topic: h.k.topics.Cmd(h.dev), Payload: raw}); err != nil {
		t.Fatal(err)
	}
	timeout := time.After(30 * time.Second)
	for {
		select {
		case a := <-h.k.acks:
			if a.ID == id {
				return a
			}
		case <-timeout:
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
	c := dialTest(t, url, "late-"+dev)
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
		"--fw-window", "1s", "--restart-delay", "50ms"}, extra...)...)
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
	im := newFWImage(t, "j1", 50_000, 2, sim.VersionMarker+"2.0.0")
	h.must(t, fwjob.KindBegin, im.begin())
	h.download(t, im, 0, nil)
	h.must(t, fwjob.KindInstall, im.jobBody())
	k.awaitReport(t, "fw-1", "installed", func(r fwReport) bool { return r.FW.State == "installed" })
	pid := pidOf(t, dir, "fw-1")
	h.must(t, fwjob.KindActivate, im.jobBody())
	awaitNewPID(t, d, dir, "fw-1", pid)
	r = k.awaitReport(t, "fw-1", "confirming", func(r fwReport) bool { return r.FW.State == "confirming" })
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
	d.stop(t, syscall.SIGTERM)
}
