package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgefence/edgefence/devices/fwjob"
	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// fwCommander sends firmware steps to one efsdev --firmware device.
type fwCommander struct {
	k    *Commander
	dev  string
	tok  fence.Token
	seq  uint64
	sign *auth.Signer // signs the commands if set
}

// publish sends step kind with body under (tok, seq) and returns its id.
func (c *fwCommander) publish(t testing.TB, seq uint64, kind string, body any) string {
	t.Helper()
	b, err := fence.EncodeBody(body)
	if err != nil {
		t.Fatal(err)
	}
	id := CommandID(c.dev, c.tok, seq)
	env := &fence.Envelope{V: fence.Version, Device: c.dev, Token: c.tok, Seq: seq, ID: id, Kind: kind, Body: b,
		Holder: "gw-test"}
	raw, err := fence.MarshalEnvelope(env)
	if err == nil && c.sign != nil {
		raw, err = c.sign.Sign(env)
	}
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := c.k.Client.Publish(ctx, mqtt.Message{Topic: c.k.Topics.Cmd(c.dev), Payload: raw,
		ResponseTopic: c.k.Topics.Ack(c.dev), CorrelationData: []byte(id)}); err != nil {
		t.Fatal(err)
	}
	return id
}

// send sends the next step and waits for its ack, resending every 2 s (as
// the agent's outbox does: a command a kill caught is not redelivered).
func (c *fwCommander) send(t testing.TB, kind string, body any) fence.Ack {
	t.Helper()
	c.seq++
	return c.resend(t, c.seq, kind, body)
}

func (c *fwCommander) resend(t testing.TB, seq uint64, kind string, body any) fence.Ack {
	t.Helper()
	id := c.publish(t, seq, kind, body)
	deadline := time.After(60 * time.Second)
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		select {
		case a := <-c.k.acks:
			if a.ID == id {
				return a
			}
		case <-tick.C:
			c.publish(t, seq, kind, body)
		case <-deadline:
			t.Fatalf("no ack for %s %s", kind, id)
		}
	}
}

func cFirmwareStatus(t *testing.T, bin, dir, dev string) fwjob.Status {
	t.Helper()
	st, err := CDeviceFirmwareStatus(bin, dir, dev)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestCDeviceFirmwareKill9MidDownload: the C device (efsdev --firmware,
// the library's job on files) is SIGKILLed three times mid-download, a
// chunk in flight each time; after each restart its firmware state on
// flash counts every chunk acked accepted (at most the one in flight
// more), and the download resumes from the device's bytes: the in-flight
// chunk resent is accepted or a duplicate, never applied twice; the
// image verifies at the last chunk (downloaded), installs, and the slot
// file holds exactly the image.
func TestCDeviceFirmwareKill9MidDownload(t *testing.T) {
	bin := CDeviceForTest(t)
	dir := t.TempDir()
	b := startBroker(t, BrokerConfig{})
	c := &fwCommander{k: NewCommander(t, b.URL(), mqtt.Topics{}), dev: "fw-k", tok: 7}
	data := filepath.Join(dir, "data")
	start := func(round int) *Proc {
		p, logPath := startDeviceProc(t, dir, round, nil, bin, "--firmware", "--mqtt", b.URL(), "--devices", c.dev,
			"--dir", data, "--client-id", "efsdev-fw-kill9")
		t.Cleanup(func() { checkSanitizerClean(t, logPath) })
		return p
	}
	img, err := sim.FirmwareImage(96<<10, sim.VersionMarker+"2.0")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(img)
	const chunk = 4096
	p := start(0)
	if a := c.send(t, fwjob.KindBegin, fwjob.BeginBody{Job: "j1", Image: sum[:], Size: uint64(len(img)), Version: 1,
		Chunk: chunk}); a.Verdict != fence.Accepted {
		t.Fatalf("fw.begin: %+v", a)
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 17))
	off, acked := 0, 0
	chunkAt := func(o int) fwjob.ChunkBody {
		return fwjob.ChunkBody{Job: "j1", Off: uint64(o), Data: img[o:min(o+chunk, len(img))]}
	}
	for round := 1; round <= 3; round++ {
		for range 2 + rng.IntN(5) {
			if a := c.send(t, fwjob.KindChunk, chunkAt(off)); a.Verdict != fence.Accepted {
				t.Fatalf("chunk at %d: %+v", off, a)
			}
			off += chunk
			acked = off
		}
		c.seq++
		inflight := c.seq
		c.publish(t, inflight, fwjob.KindChunk, chunkAt(off)) // left in flight
		time.Sleep(time.Duration(rng.IntN(4000)) * time.Microsecond)
		if err := p.Kill(); err != nil {
			t.Fatal(err)
		}
		st := cFirmwareStatus(t, bin, data, c.dev)
		if st.State != fwjob.Downloading || (st.Bytes != uint64(acked) && st.Bytes != uint64(acked+chunk)) {
			t.Fatalf("kill %d: the device holds %s at %d bytes; %d acked accepted, one chunk in flight", round, st.State,
				st.Bytes, acked)
		}
		t.Logf("kill %d: %d bytes acked, %d on flash", round, acked, st.Bytes)
		p = start(round)
		if a := c.resend(t, inflight, fwjob.KindChunk, chunkAt(off)); a.Verdict != fence.Accepted && a.Verdict != fence.Duplicate {
			t.Fatalf("in-flight chunk at %d after the restart: %+v", off, a)
		}
		off += chunk
		acked = off
	}
	for ; off < len(img); off += chunk {
		if a := c.send(t, fwjob.KindChunk, chunkAt(off)); a.Verdict != fence.Accepted {
			t.Fatalf("chunk at %d: %+v", off, a)
		}
	}
	if a := c.send(t, fwjob.KindInstall, fwjob.JobBody{Job: "j1"}); a.Verdict != fence.Accepted {
		t.Fatalf("fw.install: %+v", a)
	}
	if err := p.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	st := cFirmwareStatus(t, bin, data, c.dev)
	slot, err := os.ReadFile(fwjob.SlotPath(data, "b"))
	if err != nil {
		t.Fatal(err)
	}
	if st.State != fwjob.Installed || st.Bytes != uint64(len(img)) || sha256.Sum256(slot) != sum {
		t.Fatalf("after the download: %s at %d bytes, slot b %d bytes (%s)", st.State, st.Bytes, len(slot),
			fmt.Sprintf("%x", sha256.Sum256(slot)))
	}
}

// BenchmarkFirmwareJobThroughDevice is one firmware job at a time through
// the broker, one step in flight (fw.begin, 64 chunks of 4 KiB, fw.install,
// fw.cancel so that the next job may begin), for the Go device
// (edgefence-devsim --firmware-device: fwjob on bbolt) and the C device
// (efsdev --firmware: the library's job on files), in the same run. The C
// device is the test build (ASan/UBSan) unless $EFSDEV_BIN names another.
func BenchmarkFirmwareJobThroughDevice(b *testing.B) {
	img, err := sim.FirmwareImage(256<<10, sim.VersionMarker+"2.0")
	if err != nil {
		b.Fatal(err)
	}
	sum := sha256.Sum256(img)
	for _, kind := range benchDevices(b) {
		b.Run(kind.name, func(b *testing.B) {
			br := startBroker(b, BrokerConfig{})
			c := &fwCommander{k: NewCommander(b, br.URL(), mqtt.Topics{}), dev: "fw-b", tok: 1}
			dir := b.TempDir()
			args := []string{"--mqtt", br.URL(), "--firmware-device", c.dev, "--dir", dir}
			if kind.name == "efsdev" {
				args = []string{"--mqtt", br.URL(), "--firmware", "--devices", c.dev, "--dir", filepath.Join(dir, c.dev)}
			}
			p, err := StartProc(kind.name, filepath.Join(dir, "dev.log"), nil, kind.bin, args...)
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
				job := fmt.Sprintf("j%d", i)
				steps := []struct {
					kind string
					body any
				}{{fwjob.KindBegin, fwjob.BeginBody{Job: job, Image: sum[:], Size: uint64(len(img)), Version: 1, Chunk: 4096}}}
				for off := 0; off < len(img); off += 4096 {
					steps = append(steps, struct {
						kind string
						body any
					}{fwjob.KindChunk, fwjob.ChunkBody{Job: job, Off: uint64(off), Data: img[off : off+4096]}})
				}
				for _, k := range []string{fwjob.KindInstall, fwjob.KindCancel} {
					steps = append(steps, struct {
						kind string
						body any
					}{k, fwjob.JobBody{Job: job}})
				}
				for _, s := range steps {
					if a := c.send(b, s.kind, s.body); a.Verdict != fence.Accepted {
						b.Fatalf("%s: %+v", s.kind, a)
					}
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/job")
		})
	}
}

// TestCDeviceFirmwareManifests: efsdev --firmware given the operator's
// root (--trust-root) installs only images the operator signed: the C
// library checks fw.begin's manifest (port.root_kid; its signature through
// the fence port's verify_root, the root's key).
// A begin without one, one signed by the gateway's key under the root's
// kid, and one naming another version are refused invalid with fwjob's
// words; the root's manifest of the image is accepted and the job goes on.
func TestCDeviceFirmwareManifests(t *testing.T) {
	bin := CDeviceForTest(t)
	dir := t.TempDir()
	kit, err := NewTrustKit(filepath.Join(dir, "trust"))
	if err != nil {
		t.Fatal(err)
	}
	gw, err := kit.Gateway("gw-t", "fw-m")
	if err != nil {
		t.Fatal(err)
	}
	key, err := auth.ReadKey(gw.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	b := startBroker(t, BrokerConfig{})
	c := &fwCommander{k: NewCommander(t, b.URL(), mqtt.Topics{}), dev: "fw-m", tok: 3}
	if c.sign, err = auth.NewSigner([]byte(gw.KeyID), key); err != nil {
		t.Fatal(err)
	}
	_, logPath := startDeviceProc(t, dir, 0, nil, bin, append([]string{"--firmware", "--mqtt", b.URL(), "--devices", c.dev,
		"--dir", filepath.Join(dir, "data")}, kit.DevsimArgs("")...)...)
	t.Cleanup(func() { checkSanitizerClean(t, logPath) })
	img, err := sim.FirmwareImage(8<<10, sim.VersionMarker+"3.1")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(img)
	m := auth.Manifest{Image: sum[:], Size: uint64(len(img)), Version: 1, Name: "thermostat"}
	valid, err := kit.Manifest(m)
	if err != nil {
		t.Fatal(err)
	}
	fake, err := auth.NewRoot([]byte(kit.RootKID), key) // the gateway's key, the root's kid
	if err != nil {
		t.Fatal(err)
	}
	forged, err := fake.Manifest(m)
	if err != nil {
		t.Fatal(err)
	}
	m.Version = 2
	other, err := kit.Manifest(m)
	if err != nil {
		t.Fatal(err)
	}
	begin := func(man []byte) fwjob.BeginBody {
		return fwjob.BeginBody{Job: "j1", Image: sum[:], Size: uint64(len(img)), Version: 1, Chunk: 4096, Manifest: man}
	}
	for _, r := range []struct {
		name string
		man  []byte
		want string
	}{{"none", nil, "manifest: none: this device installs only images the operator signed"},
		{"the gateway's key under the root's kid", forged, "auth: bad signature: manifest"},
		{"another version's", other, "manifest: signed for image " + hex.EncodeToString(sum[:])[:40]}} {
		if a := c.send(t, fwjob.KindBegin, begin(r.man)); a.Verdict != fence.Invalid || !strings.Contains(a.Reason, r.want) {
			t.Fatalf("fw.begin with %s manifest: %v %q, want invalid %q", r.name, a.Verdict, a.Reason, r.want)
		}
	}
	if a := c.send(t, fwjob.KindBegin, begin(valid)); a.Verdict != fence.Accepted {
		t.Fatalf("fw.begin with the root's manifest: %+v", a)
	}
	for off := 0; off < len(img); off += 4096 {
		if a := c.send(t, fwjob.KindChunk, fwjob.ChunkBody{Job: "j1", Off: uint64(off), Data: img[off : off+4096]}); a.Verdict != fence.Accepted {
			t.Fatalf("chunk at %d: %+v", off, a)
		}
	}
	if a := c.send(t, fwjob.KindInstall, fwjob.JobBody{Job: "j1"}); a.Verdict != fence.Accepted {
		t.Fatalf("fw.install: %+v", a)
	}
}
