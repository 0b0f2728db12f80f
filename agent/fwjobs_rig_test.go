package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgefence/edgefence/agent/jobs"
	"github.com/edgefence/edgefence/devices/fwjob"
	"github.com/edgefence/edgefence/devices/shim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/shadow"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// The firmware jobs' test rig: real agents on the test etcd and a mochi
// broker, and in-process firmware devices (devices/fwjob behind a shim) on
// their own MQTT client. A device publishes its state report {"fw": …}
// retained at boot and after every command; a reboot (fw.activate, or
// fw.cancel of the trial it runs) closes its fence point, runs fwjob.Boot
// and opens it again, inside the command's handler, so that the next
// commands wait at the broker as they would for a restarting device.

// fwWorld is one broker and etcd prefix with its devices and agents.
type fwWorld struct {
	t      testing.TB
	prefix string
	broker *sandbox.Broker
	topics mqtt.Topics
	store  *jobs.Store
	images *memImages
	devs   map[string]*fwDev
	chunk  int  // bytes per fw.chunk of the jobs createJob makes
	noJobs bool // agents without the runner (the raw command path)
	window int  // the agents' jobs.window (0: the default)
}

func newFWWorld(t testing.TB) *fwWorld {
	t.Helper()
	br, err := sandbox.StartBroker(sandbox.BrokerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { br.Close() })
	prefix := fmt.Sprintf("/t/%s/%d", t.Name(), twinRuns.Add(1))
	return &fwWorld{t: t, prefix: prefix, broker: br, topics: mqtt.Topics{Prefix: "fw"},
		store: jobs.NewStore(etcdClient(t), prefix), images: &memImages{m: map[string][]byte{}}, devs: map[string]*fwDev{}, chunk: 4 << 10}
}

// memImages serves images from memory by SHA-256 (agent/images' cache in
// the daemon).
type memImages struct {
	mu sync.Mutex
	m  map[string][]byte
}

type memImage struct{ *bytes.Reader }

func (m memImage) Size() uint64 { return uint64(m.Reader.Size()) }
func (memImage) Close() error   { return nil }

func (im *memImages) Get(_ context.Context, ref jobs.ImageRef) (jobs.Image, error) {
	im.mu.Lock()
	defer im.mu.Unlock()
	b, ok := im.m[ref.SHA256]
	if !ok {
		return nil, fmt.Errorf("no image %s", ref.SHA256)
	}
	return memImage{bytes.NewReader(b)}, nil
}

// image makes an image of n bytes (seeded by tag) and returns its ref.
func (w *fwWorld) image(tag string, n int, version uint64) jobs.ImageRef {
	b := bytes.Repeat([]byte(tag), n/len(tag)+1)[:n]
	sum := sha256.Sum256(b)
	h := hex.EncodeToString(sum[:])
	w.images.mu.Lock()
	w.images.m[h] = b
	w.images.mu.Unlock()
	return jobs.ImageRef{SHA256: h, Size: uint64(n), Version: version, URL: "file:///images/" + tag}
}

// createJob creates a job on devs with short timeouts.
func (w *fwWorld) createJob(id string, img jobs.ImageRef, devs ...string) jobs.Job {
	w.t.Helper()
	j := jobs.Job{ID: id, Image: img, Chunk: w.chunk, Targets: jobs.Targets{Devices: devs},
		Timeout: jobs.Timeouts{Step: jobs.Duration(20 * time.Second), Reboot: jobs.Duration(20 * time.Second)}}
	j, _, err := w.store.Create(context.Background(), j)
	if err != nil {
		w.t.Fatal(err)
	}
	return j
}

// agent runs a jobs-enabled agent gw for devs, with its own MQTT client;
// wrap, if set, wraps its sender.
func (w *fwWorld) agent(gw string, devs []string, wrap func(Sender) Sender) (*testAgent, *mqtt.Commander) {
	return w.agentWith(gw, devs, wrap, Options{})
}

// agentWith is agent with o's Outbox (nil: a fresh one) and Window.
func (w *fwWorld) agentWith(gw string, devs []string, wrap func(Sender) Sender, o Options) (*testAgent, *mqtt.Commander) {
	t := w.t
	t.Helper()
	mc := mqtt.Config{CleanStart: true, SessionExpiry: -1, Brokers: []string{w.broker.URL()}, ClientID: "fw-" + gw}
	cmdr, err := mqtt.NewCommander(context.Background(), mc, w.topics, devs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		cmdr.Close(c)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cmdr.Client().AwaitSubscribed(ctx); err != nil {
		t.Fatal(err)
	}
	cfg := twinAgentConfig(gw, w.prefix, w.broker.URL(), devs...)
	cfg.MQTT.Prefix = w.topics.Prefix
	cfg.Jobs.Window = w.window
	var s Sender = cmdr
	if wrap != nil {
		s = wrap(cmdr)
	}
	cli := etcdClient(t)
	if !w.noJobs {
		o.Jobs, o.Images = w.store, w.images
	}
	a, err := newAgent(t, cfg, cli, s, o)
	if err != nil {
		t.Fatal(err)
	}
	ta := runStarted(t, a)
	ta.cli = cli
	// The state reports (the retained ones at once), as the daemon routes
	// them once its agent exists.
	cmdr.Client().Subscribe(w.topics.State("+"), func(m mqtt.Message) {
		if d, leaf, ok := w.topics.Parse(m.Topic); ok && leaf == mqtt.LeafState {
			a.DeviceStateReport(d, m.Payload)
		}
	})
	if err := cmdr.Client().AwaitSubscribed(ctx); err != nil {
		t.Fatal(err)
	}
	return ta, cmdr
}

// runStarted runs a until the test ends (or stop).
func runStarted(t testing.TB, a *Agent) *testAgent {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := a.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return &testAgent{Agent: a, stop: stop}
}

// fwDev is one firmware device on its own MQTT client.
type fwDev struct {
	t    testing.TB
	w    *fwWorld
	id   string
	dir  string
	boot fwjob.BootConfig
	cli  *mqtt.Client
	// manifests, if set before start, is the root the device checks
	// fw.begin's manifest against (fwjob.Config.Manifests).
	manifests auth.ManifestVerifier

	mu     sync.Mutex
	s      *shim.Shim
	d      *fwjob.Device
	chunks map[string]fence.Token  // job/off → the token of the chunk applied there
	twice  []string                // job/off applied more than once
	spans  map[string][2]time.Time // job → when its first and last chunk were applied
}

// device starts a firmware device id whose slot a holds factory.
func (w *fwWorld) device(id string, boot fwjob.BootConfig) *fwDev {
	return w.deviceWith(id, boot, nil)
}

// deviceWith is device with a root for manifests (nil: none checked).
func (w *fwWorld) deviceWith(id string, boot fwjob.BootConfig, manifests auth.ManifestVerifier) *fwDev {
	t := w.t
	t.Helper()
	d := &fwDev{t: t, w: w, id: id, dir: t.TempDir(), boot: boot, manifests: manifests,
		chunks: map[string]fence.Token{}, spans: map[string][2]time.Time{}}
	if err := os.WriteFile(fwjob.SlotPath(d.dir, fwjob.SlotA), []byte("factory "+id), 0o600); err != nil {
		t.Fatal(err)
	}
	d.start()
	t.Cleanup(func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		d.s.Close()
	})
	mc := mqtt.Config{CleanStart: true, SessionExpiry: -1, Brokers: []string{w.broker.URL()}, ClientID: "fwdev-" + id,
		Subscriptions: []mqtt.Subscription{{Filter: w.topics.Cmd(id), Handler: d.handle}}}
	var err error
	if d.cli, err = mqtt.Dial(context.Background(), mc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		d.cli.Close(c)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := d.cli.AwaitSubscribed(ctx); err != nil {
		t.Fatal(err)
	}
	d.publish()
	w.devs[id] = d
	return d
}

// start boots the device and opens its fence point (d.mu held or unshared).
func (d *fwDev) start() {
	if _, err := fwjob.Boot(context.Background(), d.dir, d.boot); err != nil {
		d.t.Errorf("boot %s: %v", d.id, err)
		return
	}
	var err error
	if d.s, err = shim.Open(fwjob.DBPath(d.dir), nil); err != nil {
		d.t.Errorf("shim %s: %v", d.id, err)
		return
	}
	if d.d, err = fwjob.New(fwjob.Config{Dir: d.dir, Device: d.id, Manifests: d.manifests}); err != nil {
		d.t.Errorf("fwjob %s: %v", d.id, err)
	}
}

// handle decides one command, acks it, reboots if the step says so, and
// publishes the state report.
func (d *fwDev) handle(m mqtt.Message) {
	d.mu.Lock()
	out := d.d.Handle(d.s, m.Payload)
	if out.Applied && out.Envelope != nil && out.Envelope.Kind == fwjob.KindChunk {
		var c fwjob.ChunkBody
		if err := fence.DecodeBody(out.Envelope.Body, &c); err == nil {
			k := fmt.Sprintf("%s/%d", c.Job, c.Off)
			if _, ok := d.chunks[k]; ok {
				d.twice = append(d.twice, k)
			}
			d.chunks[k] = out.Envelope.Token
			sp := d.spans[c.Job]
			if sp[0].IsZero() {
				sp[0] = time.Now()
			}
			sp[1] = time.Now()
			d.spans[c.Job] = sp
		}
	}
	d.mu.Unlock()
	ack, err := fence.MarshalAck(&out.Ack)
	if err != nil {
		d.t.Errorf("ack: %v", err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	topic := d.w.topics.Ack(d.id)
	if m.ResponseTopic != "" {
		topic = m.ResponseTopic
	}
	if err := d.cli.Publish(ctx, mqtt.Message{Topic: topic, Payload: ack, CorrelationData: m.CorrelationData}); err != nil {
		d.t.Logf("%s: ack not published: %v", d.id, err)
	}
	if out.Reboot {
		d.reboot()
	}
	d.publish()
}

// reboot is the device's restart: fence point closed, Boot, opened again.
func (d *fwDev) reboot() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.s.Close(); err != nil {
		d.t.Errorf("close %s: %v", d.id, err)
	}
	d.start()
}

// status is the device's firmware state.
func (d *fwDev) status() fwjob.Status {
	d.mu.Lock()
	defer d.mu.Unlock()
	s, err := d.d.Status(d.s)
	if err != nil {
		d.t.Errorf("status %s: %v", d.id, err)
	}
	return s
}

// publish sends the device's state report, retained.
func (d *fwDev) publish() {
	st := d.status()
	b, err := shadow.EncodeCBOR(map[string]any{FieldFirmware: st.Report()}, shadow.Limits{})
	if err != nil {
		d.t.Errorf("report %s: %v", d.id, err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := d.cli.Publish(ctx, mqtt.Message{Topic: d.w.topics.State(d.id), Payload: b, Retain: true}); err != nil {
		d.t.Logf("%s: report not published: %v", d.id, err)
	}
}

// execution reads dev's execution of job.
func (w *fwWorld) execution(dev, job string) jobs.Execution {
	w.t.Helper()
	e, err := w.store.Execution(context.Background(), dev, job)
	if err != nil {
		w.t.Fatal(err)
	}
	return e
}

// waitEnded waits until dev's execution of job is terminal and returns it.
func (w *fwWorld) waitEnded(dev, job string) jobs.Execution {
	w.t.Helper()
	var e jobs.Execution
	waitLong(w.t, dev+"'s execution of "+job+" ends", func() bool {
		e = w.execution(dev, job)
		return e.Status.Terminal()
	})
	return e
}

// runsImage checks that the device committed img: active slot, its hash
// as the boot loader holds it, and the slot file's bytes.
func (d *fwDev) runsImage(img jobs.ImageRef) {
	d.t.Helper()
	st := d.status()
	if st.State != fwjob.Committed || st.Slot != st.Active || hex.EncodeToString(st.ActiveImage) != img.SHA256 {
		d.t.Fatalf("%s: state %s, running %s, active %s image %x; want committed %s", d.id, st.State, st.Slot, st.Active, st.ActiveImage, img.SHA256)
	}
	b, err := os.ReadFile(fwjob.SlotPath(d.dir, st.Active))
	if err != nil {
		d.t.Fatal(err)
	}
	if sum := sha256.Sum256(b[:img.Size]); hex.EncodeToString(sum[:]) != img.SHA256 {
		d.t.Fatalf("%s: slot %s does not hold the image (%s)", d.id, st.Active, filepath.Base(fwjob.SlotPath(d.dir, st.Active)))
	}
}

// waitLong polls cond (every 50 ms) until it holds, for at most two
// minutes: a firmware job takes many round trips on a busy machine.
func waitLong(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// chunkGate is a Sender that holds the n-th fw.chunk it is given until
// release is closed, then sends it with a context that ignores
// cancellation: a holder frozen in the middle of a send.
type chunkGate struct {
	Sender
	n       int32
	count   atomic.Int32
	held    chan struct{} // closed when the n-th chunk is held
	release chan struct{}
	result  chan gateResult // the held chunk's ack
	end     context.Context // the test's: its end lets a held chunk go unsent
}

type gateResult struct {
	ack *fence.Ack
	err error
}

func newChunkGate(t testing.TB, s Sender, n int32) *chunkGate {
	return &chunkGate{Sender: s, n: n, held: make(chan struct{}), release: make(chan struct{}), result: make(chan gateResult, 1),
		end: t.Context()}
}

func (g *chunkGate) Send(ctx context.Context, env *fence.Envelope) (*fence.Ack, error) {
	if env.Kind != fwjob.KindChunk || g.count.Add(1) != g.n {
		return g.Sender.Send(ctx, env)
	}
	close(g.held)
	select {
	case <-g.release:
	case <-g.end.Done(): // the test failed before it released the chunk
		return nil, g.end.Err()
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 20*time.Second)
	defer cancel()
	ack, err := g.Sender.Send(sctx, env)
	g.result <- gateResult{ack, err}
	return ack, err
}

// wait waits for ch to close, at most two minutes.
func wait(t testing.TB, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(2 * time.Minute):
		t.Fatalf("timed out waiting for %s", what)
	}
}
