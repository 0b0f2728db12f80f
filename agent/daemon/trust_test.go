package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// TestGatewayTrustFiles: the trust the daemon builds from auth.trust_root,
// auth.certificate and auth.revocations; a file that is missing, of the
// wrong kind or signed by another root is a config error naming its key,
// from New as from gatewayTrust.
func TestGatewayTrustFiles(t *testing.T) {
	dir := t.TempDir()
	kit, err := sandbox.NewTrustKit(filepath.Join(dir, "trust"))
	if err != nil {
		t.Fatal(err)
	}
	gk, err := kit.Gateway("gw-1", "dev-*")
	if err != nil {
		t.Fatal(err)
	}
	rev, err := kit.Revoke(1, "gw-9/1")
	if err != nil {
		t.Fatal(err)
	}
	other, err := sandbox.NewTrustKit(filepath.Join(dir, "other"))
	if err != nil {
		t.Fatal(err)
	}
	ogk, err := other.Gateway("gw-1", "dev-*")
	if err != nil {
		t.Fatal(err)
	}
	orev, err := other.Revoke(2)
	if err != nil {
		t.Fatal(err)
	}
	good := agent.AuthConfig{KeyFile: gk.KeyFile, KeyID: gk.KeyID, Certificate: gk.Certificate, Revocations: rev,
		TrustRoot: gk.TrustRoot, TrustRootKID: gk.TrustRootKID}
	tr, err := gatewayTrust(good)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Key([]byte(gk.KeyID), "dev-1"); err != nil || tr.Version() != 1 {
		t.Fatalf("good trust: own key %v, revocations version %d", err, tr.Version())
	}
	if tr, err := gatewayTrust(agent.AuthConfig{}); tr != nil || err != nil {
		t.Fatalf("no trust root: %v %v, want nil, nil", tr, err)
	}
	for _, tc := range []struct {
		name, key string
		mod       func(*agent.AuthConfig)
	}{
		{"root missing", "auth.trust_root", func(a *agent.AuthConfig) { a.TrustRoot = filepath.Join(dir, "none.pub") }},
		{"root a private key", "auth.trust_root", func(a *agent.AuthConfig) { a.TrustRoot = gk.KeyFile }},
		{"certificate missing", "auth.certificate", func(a *agent.AuthConfig) { a.Certificate = filepath.Join(dir, "none.cert") }},
		{"certificate of another root", "auth.certificate", func(a *agent.AuthConfig) { a.Certificate = ogk.Certificate }},
		{"certificate a revocation list", "auth.certificate", func(a *agent.AuthConfig) { a.Certificate = rev }},
		{"revocations of another root", "auth.revocations", func(a *agent.AuthConfig) { a.Revocations = orev }},
		{"revocations a certificate", "auth.revocations", func(a *agent.AuthConfig) { a.Revocations = gk.Certificate }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := good
			tc.mod(&a)
			_, err := gatewayTrust(a)
			if !errors.Is(err, agent.ErrConfig) || !strings.Contains(err.Error(), tc.key+":") {
				t.Fatalf("%v, want a config error naming %s", err, tc.key)
			}
		})
	}
	// New says so too, before it opens anything but the API socket.
	w := newWorld(t)
	cfg := w.config(t, t.TempDir())
	cfg.Auth = good
	cfg.Auth.Certificate = ogk.Certificate
	if d, err := New(t.Context(), cfg, Options{Notify: func(string) error { return nil }}); !errors.Is(err, agent.ErrConfig) ||
		!strings.Contains(err.Error(), "auth.certificate:") {
		if d != nil {
			d.Close()
		}
		t.Fatalf("New with a certificate of another root: %v", err)
	}
}

// TestPerDeviceAuthPolicy: a gateway with a signing key and the operator's
// trust root commands four devices: dev-1 (`auth: required`, its fence
// point requires signatures) gets signed commands; dev-2 (`auth: off`)
// plain ones, counted; plc-1 and plc-2 are fenced at this gateway's table,
// which verifies plc-1's commands against the trust (the root and this
// gateway's own certificate) and takes plc-2's plain, counted. One WARN
// line at start names the auth: off devices; status and metrics show the
// policy. A broker client's plain envelope with token 2^63 for plc-1 is
// refused at the table, its mark unchanged, and the holder's next command
// is accepted.
func TestPerDeviceAuthPolicy(t *testing.T) {
	w := newWorld(t)
	dir := t.TempDir()
	kit, err := sandbox.NewTrustKit(filepath.Join(dir, "trust"))
	if err != nil {
		t.Fatal(err)
	}
	gk, err := kit.Gateway("gw-1", "dev-1", "plc-*")
	if err != nil {
		t.Fatal(err)
	}
	trust, err := kit.Trust()
	if err != nil {
		t.Fatal(err)
	}
	// dev-1 speaks for itself: its key enrolled, its certificate in etcd.
	_, certs, err := kit.DeviceKeys("dev-1")
	if err != nil {
		t.Fatal(err)
	}
	if err := sandbox.PublishDevices(t.Context(), w.etcd.Endpoints(), "", certs); err != nil {
		t.Fatal(err)
	}
	signers, err := kit.DeviceSigners("dev-1")
	if err != nil {
		t.Fatal(err)
	}
	signed := startFleet(t, w, dir, "dev-1", trust, signers)
	startFleet(t, w, dir, "dev-2", nil, nil)

	cfg := w.config(t, filepath.Join(dir, "gw-1"))
	cfg.Auth = agent.AuthConfig{KeyFile: gk.KeyFile, KeyID: gk.KeyID, Certificate: gk.Certificate, TrustRoot: gk.TrustRoot, TrustRootKID: gk.TrustRootKID}
	cfg.Devices = []agent.DeviceConfig{{ID: "dev-1"}, {ID: "dev-2", Auth: agent.AuthOff},
		{ID: "plc-1", Fence: agent.FenceGateway, Home: "gw-1", MQTTTopic: "legacy/plc-1"},
		{ID: "plc-2", Fence: agent.FenceGateway, Home: "gw-1", MQTTTopic: "legacy/plc-2", Auth: agent.AuthOff}}
	var logs lockedBuffer
	d, err := New(t.Context(), cfg, Options{Notify: func(string) error { return nil }, Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer runDaemon(t, d)()
	ag := d.Agent()
	for deadline := time.Now().Add(60 * time.Second); ag.Status().Counters.Acquired < uint64(len(cfg.Devices)) || !d.cmdr.Client().Subscribed(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not holding every device: %+v", ag.Status().Devices)
		}
	}
	body, err := sim.SetBody{Setpoint: new(22.0)}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	send := func(dev string) {
		t.Helper()
		if ack, err := ag.Send(t.Context(), dev, sim.KindSet, body); err != nil || ack.Verdict != fence.Accepted {
			t.Fatalf("send to %s: %+v %v", dev, ack, err)
		}
	}
	for _, dev := range []string{"dev-1", "dev-2", "plc-1", "plc-2"} {
		send(dev)
	}

	st := ag.Status()
	var policies []string
	for _, ds := range st.Devices {
		policies = append(policies, ds.ID+":"+ds.Auth)
	}
	if want := []string{"dev-1:required", "dev-2:off", "plc-1:required", "plc-2:off"}; !slices.Equal(policies, want) {
		t.Errorf("status policies %q, want %q", policies, want)
	}
	if n := st.Transport["unsigned"]; n != uint64(2) {
		t.Errorf("unsigned sends %v, want 2 (dev-2, plc-2)", n)
	}
	if s := signed.Stats(); s.Unauthenticated != 0 {
		t.Errorf("dev-1 refused %d commands as unauthenticated", s.Unauthenticated)
	}
	if s := d.br.Stats(); s.Unsigned != 1 || s.Unauthenticated != 0 || s.Accepted != 2 {
		t.Errorf("gateway fence %+v, want 2 accepted, 1 of them unsigned", s)
	}

	// A broker client forges plc-1's command: refused at the table.
	before, _, err := d.table.Get("plc-1")
	if err != nil {
		t.Fatal(err)
	}
	forged, err := fence.MarshalEnvelope(&fence.Envelope{V: fence.Version, Device: "plc-1", Token: 1 << 63, Seq: 1, ID: "forged",
		Kind: sim.KindSet, Body: body, Holder: "mallory"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := mqtt.Dial(t.Context(), mqtt.Config{Brokers: []string{w.broker.URL()}, ClientID: "mallory"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	if err := c.AwaitConnection(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := c.Publish(t.Context(), mqtt.Message{Topic: mqtt.Topics{}.Cmd("plc-1"), Payload: forged}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); d.br.Stats().Unauthenticated == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the forgery never reached the gateway fence")
		}
	}
	if after, _, err := d.table.Get("plc-1"); err != nil || after.Mark != before.Mark {
		t.Fatalf("plc-1's mark %+v after the forgery, want %+v (%v)", after.Mark, before.Mark, err)
	}
	send("plc-1")

	// One WARN line names the auth: off devices.
	var warned [][]string
	for _, l := range logs.lines(t) {
		if l["level"] == "WARN" && strings.HasPrefix(l["msg"].(string), "auth: off") {
			var devs []string
			for _, x := range l["devices"].([]any) {
				devs = append(devs, x.(string))
			}
			warned = append(warned, devs)
		}
	}
	if len(warned) != 1 || !slices.Equal(warned[0], []string{"dev-2", "plc-2"}) {
		t.Errorf("auth: off warnings %q, want one naming dev-2 and plc-2", warned)
	}
}

// startFleet serves one simulated device on w's broker, requiring
// signatures with keys (nil: plain envelopes) and signing its acks and
// state reports with signers (nil: plain ones).
func startFleet(t *testing.T, w *world, dir, dev string, keys auth.Keys, signers map[string]*auth.Signer) *sim.Fleet {
	t.Helper()
	f, err := sim.NewFleet(t.Context(), sim.FleetConfig{Devices: []string{dev}, DataDir: filepath.Join(dir, dev), Broker: w.broker.URL(),
		ClientID: "devsim-" + dev, Keys: keys, Signers: signers})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = f.Close(ctx)
	})
	if err := f.AwaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	return f
}

// lockedBuffer is a log destination safe for concurrent writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// lines are the JSON log lines written so far.
func (b *lockedBuffer) lines(t *testing.T) []map[string]any {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	for _, s := range strings.Split(strings.TrimSpace(b.b.String()), "\n") {
		var l map[string]any
		if err := json.Unmarshal([]byte(s), &l); err != nil {
			t.Fatalf("log line %q: %v", s, err)
		}
		out = append(out, l)
	}
	return out
}
