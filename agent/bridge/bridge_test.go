package bridge

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/edgefence/edgefence/devices/legacy"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/transport/modbus"
	"github.com/edgefence/edgefence/transport/mqtt"
	"github.com/edgefence/edgefence/transport/serial"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// legacyDevice serves a register device with no fence on the master side of
// a real pty; the bridge opens the slave's path like a USB-serial adapter.
type legacyDevice struct {
	path string
	regs *legacy.Registers
	log  *syncBuffer
	resp *serial.Responder // counts every request that reached the device
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) applied(t testing.TB) []legacy.Applied {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, err := legacy.ReadApplied(bytes.NewReader(s.b.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func startLegacyDevice(t testing.TB, id string) *legacyDevice {
	t.Helper()
	log := &syncBuffer{}
	regs := legacy.NewRegisters(id, 16, log)
	resp := &serial.Responder{Handler: regs.Handle}
	return &legacyDevice{path: serveResponder(t, resp), regs: regs, log: log, resp: resp}
}

// serveDevice serves regs on the master of a new pty until the test ends
// and returns the slave's path, the device's end of the cable.
func serveDevice(t testing.TB, regs *legacy.Registers) string {
	t.Helper()
	return serveResponder(t, &serial.Responder{Handler: regs.Handle})
}

// serveResponder serves resp on the master of a new pty until the test
// ends and returns the slave's path.
func serveResponder(t testing.TB, resp *serial.Responder) string {
	t.Helper()
	master, s, err := sandbox.OpenPty()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = resp.Serve(ctx, master)
	}()
	t.Cleanup(func() {
		cancel()
		master.Close()
		<-done
		s.Close()
	})
	return s.Name()
}

type rig struct {
	t      testing.TB
	topics mqtt.Topics
	broker *sandbox.Broker
	dev    *legacyDevice
	cmdr   *mqtt.Commander
}

func newRig(t testing.TB) *rig {
	t.Helper()
	b, err := sandbox.StartBroker(sandbox.BrokerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	r := &rig{t: t, topics: mqtt.Topics{Prefix: "bridge-test"}, broker: b, dev: startLegacyDevice(t, "plc-1")}
	r.cmdr, err = mqtt.NewCommander(context.Background(), mqtt.Config{Brokers: []string{b.URL()}, ClientID: "holder", CleanStart: true},
		r.topics, []string{"plc-1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeCtx(r.cmdr.Close) })
	return r
}

func closeCtx(f func(context.Context) error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = f(ctx)
}

// startBridge runs a bridge for plc-1 with its own MQTT client; the returned
// func stops it.
func (r *rig) startBridge(tablePath string, unsafe bool) (*Bridge, func()) {
	t := r.t
	t.Helper()
	var tbl Table
	var err error
	if unsafe {
		tbl, err = NoTable(nil)
	} else {
		tbl, err = fence.OpenTable(tablePath, nil)
	}
	if err != nil {
		t.Fatal(err)
	}
	return r.startBridgeWith(Config{Table: tbl})
}

// startBridgeWith runs a bridge for plc-1 configured by cfg (Topics,
// Devices — but for AuthOff — and CommandTimeout are set here); the returned func stops it and
// closes cfg.Table.
func (r *rig) startBridgeWith(cfg Config) (*Bridge, func()) {
	t := r.t
	t.Helper()
	tbl := cfg.Table
	cfg.Topics, cfg.CommandTimeout = r.topics, 10*time.Second
	authOff := len(cfg.Devices) == 1 && cfg.Devices[0].AuthOff // the one setting a test may give plc-1
	cfg.Devices = []Device{{ID: "plc-1", Port: serial.PortConfig{Path: r.dev.path}, AuthOff: authOff}}
	br, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return br, runBridge(t, r.broker.URL(), br, tbl)
}

// runBridge connects br to the broker at url as the home gateway and
// starts it; the returned func (also a cleanup of t) stops it and closes
// tbl.
func runBridge(t testing.TB, url string, br *Bridge, tbl Table) func() {
	t.Helper()
	c, err := mqtt.Dial(context.Background(), mqtt.Config{Brokers: []string{url}, ClientID: "home-gw",
		CleanStart: true, Subscriptions: br.Subscriptions()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.AwaitSubscribed(ctx); err != nil {
		t.Fatal(err)
	}
	if err := br.Start(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			br.Close()
			closeCtx(c.Close)
			if c, ok := tbl.(io.Closer); ok {
				c.Close()
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func (r *rig) write(token fence.Token, seq uint64, value uint16) *fence.Ack {
	r.t.Helper()
	return r.writeIn(0, token, seq, value)
}

// writeIn is write issued in epoch e.
func (r *rig) writeIn(e uint64, token fence.Token, seq uint64, value uint16) *fence.Ack {
	r.t.Helper()
	return r.send(r.writeEnv(e, token, seq, value))
}

// writeEnv is the command write sends.
func (r *rig) writeEnv(e uint64, token fence.Token, seq uint64, value uint16) *fence.Envelope {
	r.t.Helper()
	body, err := fence.EncodeBody(map[string]any{"addr": 0, "value": value})
	if err != nil {
		r.t.Fatal(err)
	}
	return &fence.Envelope{V: fence.Version, Device: "plc-1", Token: token, Seq: seq,
		ID: fmt.Sprintf("c-%d-%d-%d", e, token, seq), Kind: modbus.KindWriteRegister, Body: body, Holder: "gw", Epoch: e}
}

func (r *rig) send(env *fence.Envelope) *fence.Ack {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ack, err := r.cmdr.Send(ctx, env)
	if err != nil {
		r.t.Fatalf("send %+v: %v", env, err)
	}
	return ack
}

func (r *rig) register() uint16 {
	v, err := r.dev.regs.Register(0)
	if err != nil {
		r.t.Fatal(err)
	}
	return v
}

// The Figure 1 schedule against a device that cannot check: A (token 7)
// writes, B (token 9) takes over and writes, A's late write arrives. The
// gateway's table refuses it before the wire.
func TestFrozenHolderRefusedBeforeTheWire(t *testing.T) {
	r := newRig(t)
	table := filepath.Join(t.TempDir(), "fence.db")
	br, stop := r.startBridge(table, false)
	if a := r.write(7, 1, 100); a.Verdict != fence.Accepted {
		t.Fatalf("A: %+v", a)
	}
	if a := r.write(9, 1, 200); a.Verdict != fence.Accepted {
		t.Fatalf("B: %+v", a)
	}
	late := r.write(7, 2, 999)
	if late.Verdict != fence.Stale || late.MaxToken != 9 || !errors.Is(late.Err(), fence.ErrStale) {
		t.Fatalf("A late: %+v", late)
	}
	if a := r.write(9, 1, 200); a.Verdict != fence.Duplicate {
		t.Fatalf("B redelivered: %+v", a)
	}
	if v := r.register(); v != 200 {
		t.Fatalf("register %d, want B's 200", v)
	}
	applied := r.dev.log.applied(t)
	if len(applied) != 2 || applied[1].Values[0] != 200 {
		t.Fatalf("applied %+v", applied)
	}
	if st := br.Stats(); st.Accepted != 2 || st.Stale != 1 || st.Duplicate != 1 {
		t.Fatalf("stats %+v", st)
	}
	// The gateway restarts: the table keeps the mark.
	stop()
	r.startBridge(table, false)
	if a := r.write(7, 3, 998); a.Verdict != fence.Stale {
		t.Fatalf("after restart: %+v", a)
	}
	if a := r.write(9, 2, 201); a.Verdict != fence.Accepted {
		t.Fatalf("B after restart: %+v", a)
	}
	if v := r.register(); v != 201 {
		t.Fatalf("register %d", v)
	}
}

// Without the table the same schedule corrupts the device: the test above
// would fail without the fence.
func TestWithoutTableCorrupts(t *testing.T) {
	if !unsafeBuild {
		// make test builds with the tag; under CI=true this must run.
		if os.Getenv("CI") == "true" {
			t.Fatal("needs -tags edgefence_unsafe (make test)")
		}
		t.Skip("needs -tags edgefence_unsafe (make test)")
	}
	r := newRig(t)
	r.startBridge("", true)
	r.write(7, 1, 100)
	r.write(9, 1, 200)
	if a := r.write(7, 2, 999); a.Verdict != fence.Accepted {
		t.Fatalf("unfenced late write: %+v", a)
	}
	if v := r.register(); v != 999 {
		t.Fatalf("register %d: expected the stale holder's 999 without the table", v)
	}
}

func TestBadInput(t *testing.T) {
	r := newRig(t)
	br, _ := r.startBridge(filepath.Join(t.TempDir(), "fence.db"), false)
	if a := r.write(5, 1, 1); a.Verdict != fence.Accepted {
		t.Fatal(a)
	}
	body := func(v any) []byte {
		b, err := fence.EncodeBody(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	env := func(id, kind string, b []byte) *fence.Envelope {
		return &fence.Envelope{V: fence.Version, Device: "plc-1", Token: 6, Seq: 1, ID: id, Kind: kind, Body: b}
	}
	for _, e := range []*fence.Envelope{
		env("k1", "set", body(map[string]any{"setpoint": 1})),
		env("k2", modbus.KindWriteRegister, body(map[string]any{"addr": 0, "value": 70000})),
		env("k3", modbus.KindWriteRegisters, body(map[string]any{"addr": 0, "values": make([]int, 200)})),
	} {
		if a := r.send(e); a.Verdict != fence.Invalid || a.Reason == "" {
			t.Fatalf("%s: %+v", e.ID, a)
		}
	}
	// A register beyond the device's bank: admitted by the table, refused
	// by the device with a Modbus exception.
	if a := r.send(env("k4", modbus.KindWriteRegister, body(map[string]any{"addr": 100, "value": 1}))); a.Verdict != fence.Invalid {
		t.Fatalf("device exception: %+v", a)
	}
	// Garbage on the command topic: answered Invalid, nothing reaches the
	// device, and the bridge keeps serving.
	c := r.cmdr.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, p := range [][]byte{{0xff, 0x00}, {0xa1}, bytes.Repeat([]byte{0x9f}, 64)} {
		if err := c.Publish(ctx, mqtt.Message{Topic: r.topics.Cmd("plc-1"), Payload: p}); err != nil {
			t.Fatal(err)
		}
	}
	if a := r.write(6, 2, 7); a.Verdict != fence.Accepted {
		t.Fatalf("after bad input: %+v", a)
	}
	if v := r.register(); v != 7 {
		t.Fatalf("register %d", v)
	}
	// A read: its values come on the state topic, before its ack.
	results := make(chan ReadResult, 1)
	c.Subscribe(r.topics.State("plc-1"), func(m mqtt.Message) {
		var rr ReadResult
		if fence.DecodeBody(m.Payload, &rr) == nil {
			results <- rr
		}
	})
	if err := c.AwaitSubscribed(ctx); err != nil {
		t.Fatal(err)
	}
	if a := r.send(env("k5", modbus.KindReadRegisters, body(map[string]any{"addr": 0, "count": 2}))); a.Verdict != fence.Duplicate {
		t.Fatalf("read with a used seq: %+v", a)
	}
	e := env("k6", modbus.KindReadRegisters, body(map[string]any{"addr": 0, "count": 2}))
	e.Seq = 3
	if a := r.send(e); a.Verdict != fence.Accepted {
		t.Fatalf("read: %+v", a)
	}
	select {
	case rr := <-results:
		if rr.ID != "k6" || rr.Addr != 0 || len(rr.Values) != 2 || rr.Values[0] != 7 {
			t.Fatalf("read result %+v", rr)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no read result")
	}
	deadline := time.Now().Add(10 * time.Second)
	for br.Stats().Invalid < 6 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if st := br.Stats(); st.Invalid != 6 || st.DeviceErrors != 1 || st.Accepted != 3 || st.Duplicate != 1 {
		t.Fatalf("stats %+v", st)
	}
	if n := len(r.dev.log.applied(t)); n != 2 {
		t.Fatalf("%d writes applied, want 2", n)
	}
}

// A device whose port is missing (the adapter unplugged at start, a config
// pointing at the wrong path) does not stop the bridge from serving the
// others; its commands are answered once their time runs out, and it is
// served as soon as the port appears.
func TestMissingPortKeepsOthersServed(t *testing.T) {
	r := newRig(t)
	dir := t.TempDir()
	missing := filepath.Join(dir, "ttyUSB7") // a symlink that does not exist yet
	tbl, err := fence.OpenTable(filepath.Join(dir, "fence.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tbl.Close()
	br, err := New(Config{Table: tbl, Topics: r.topics, CommandTimeout: 2 * time.Second, Devices: []Device{
		{ID: "plc-1", Port: serial.PortConfig{Path: r.dev.path}},
		{ID: "plc-9", Port: serial.PortConfig{Path: missing}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := mqtt.Dial(context.Background(), mqtt.Config{Brokers: []string{r.broker.URL()}, ClientID: "home-gw",
		CleanStart: true, Subscriptions: br.Subscriptions()})
	if err != nil {
		t.Fatal(err)
	}
	defer closeCtx(c.Close)
	sctx, scancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer scancel()
	if err := c.AwaitSubscribed(sctx); err != nil {
		t.Fatal(err)
	}
	if err := br.Start(context.Background(), c); err != nil {
		t.Fatalf("Start with a missing port: %v", err)
	}
	defer br.Close()
	cmdr, err := mqtt.NewCommander(context.Background(), mqtt.Config{Brokers: []string{r.broker.URL()}, ClientID: "holder-9", CleanStart: true},
		r.topics, []string{"plc-9"})
	if err != nil {
		t.Fatal(err)
	}
	defer closeCtx(cmdr.Close)
	body, _ := fence.EncodeBody(map[string]any{"addr": 0, "value": 5})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ack, err := cmdr.Send(ctx, &fence.Envelope{V: fence.Version, Device: "plc-9", Token: 3, Seq: 1, ID: "m1", Kind: modbus.KindWriteRegister, Body: body})
	if err != nil || ack.Verdict != fence.Unknown || ack.Reason == "" {
		t.Fatalf("command to the missing device: %+v %v", ack, err)
	}
	if a := r.write(4, 1, 42); a.Verdict != fence.Accepted {
		t.Fatalf("other device: %+v", a)
	}
	if v := r.register(); v != 42 {
		t.Fatalf("register %d", v)
	}
	if st := br.Stats(); st.SerialErrors != 1 || st.Accepted != 1 {
		t.Fatalf("stats %+v", st)
	}
	// The adapter appears: the device is served.
	d9 := startLegacyDevice(t, "plc-9")
	if err := os.Symlink(d9.path, missing); err != nil {
		t.Fatal(err)
	}
	// The port is reopened on the bridge's backoff (up to seconds): an
	// operator retries until the device answers, each retry a new command.
	for seq := uint64(2); ; seq++ {
		ack, err = cmdr.Send(ctx, &fence.Envelope{V: fence.Version, Device: "plc-9", Token: 3, Seq: seq, ID: "m" + itoa(int(seq)), Kind: modbus.KindWriteRegister, Body: body})
		if err != nil {
			t.Fatalf("after the port appeared: %v", err)
		}
		if ack.Verdict == fence.Accepted {
			break
		}
		if ack.Verdict != fence.Unknown || ctx.Err() != nil {
			t.Fatalf("after the port appeared: %+v", ack)
		}
	}
	if v, _ := d9.regs.Register(0); v != 5 {
		t.Fatalf("plc-9 register %d", v)
	}
}
