package daemon

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/offline"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// world is a real etcd and MQTT broker for daemons under test.
type world struct {
	etcd   *sandbox.Etcd
	broker *sandbox.Broker
	cli    *clientv3.Client // the test's own
}

func newWorld(t *testing.T) *world {
	t.Helper()
	etcd, err := sandbox.StartEtcd(t.Context(), sandbox.EtcdConfig{Dir: filepath.Join(t.TempDir(), "etcd"), Fast: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { etcd.Close() })
	br, err := sandbox.StartBroker(sandbox.BrokerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { br.Close() })
	cli, err := etcd.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return &world{etcd: etcd, broker: br, cli: cli}
}

// config is gateway gw-1 with devices dev-1 and dev-2, its state under dir.
func (w *world) config(t *testing.T, dir string) *agent.Config {
	t.Helper()
	sock, err := os.MkdirTemp("", "daemon-") // a socket path must stay under 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sock) })
	return &agent.Config{Gateway: "gw-1", StateDir: dir,
		Etcd:    agent.EtcdConfig{Endpoints: w.etcd.Endpoints(), LeaseTTL: 10 * time.Second},
		MQTT:    agent.MQTTConfig{Brokers: []string{w.broker.URL()}},
		API:     agent.APIConfig{Socket: filepath.Join(sock, "gw.sock")},
		Devices: []agent.DeviceConfig{{ID: "dev-1", Auth: agent.AuthOff}, {ID: "dev-2", Auth: agent.AuthOff}}}
}

// lockKeys counts the lock keys in etcd under the default prefix.
func (w *world) lockKeys(t *testing.T) int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := w.cli.Get(ctx, agent.DefaultEtcdPrefix+"/devices/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Error(err)
		return -1
	}
	return resp.Count
}

// A New that fails (here: etcd auth, etcd out of reach, given up when ctx
// ends) after it claimed the API socket and opened the outbox closes them
// again: a second New on the same config and state dir succeeds.
func TestNewFailureReleasesWhatItOpened(t *testing.T) {
	w := newWorld(t)
	dir := t.TempDir()
	cfg := w.config(t, dir)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "http://" + ln.Addr().String()
	ln.Close()
	bad := *cfg
	bad.Etcd.Endpoints, bad.Etcd.Username, bad.Etcd.DialTimeout = []string{refused}, "gw-1", time.Second
	bad.Etcd.Password = agent.NewSecret("secret")
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	if d, err := New(ctx, &bad, Options{Notify: func(string) error { return nil }}); err == nil {
		d.Close()
		t.Fatal("New with etcd auth and etcd out of reach succeeded")
	}
	if _, err := os.Stat(filepath.Join(dir, offline.File)); err != nil {
		t.Fatalf("the failed New did not get as far as the outbox: %v", err)
	}

	d, err := New(t.Context(), cfg, Options{Notify: func(string) error { return nil }})
	if err != nil {
		t.Fatalf("second New on the same state dir and socket: %v", err)
	}
	d.Close()
	if err := d.Run(t.Context()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Run after Close: %v, want ErrClosed", err)
	}
}

// notifications records sd_notify messages.
type notifications struct {
	mu   sync.Mutex
	msgs []string
	on   func(string) // called with each, before it is recorded
}

func (n *notifications) send(s string) error {
	if n.on != nil {
		n.on(s)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.msgs = append(n.msgs, s)
	return nil
}

func (n *notifications) all() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.msgs)
}

// Run holds the devices and serves the API until ctx ends; the shutdown
// says STOPPING=1 while the locks are still held, releases them, removes
// the API socket and closes the outbox, all before Run returns.
func TestRunShutdownOrder(t *testing.T) {
	w := newWorld(t)
	dir := t.TempDir()
	cfg := w.config(t, dir)
	var locksAtStopping int64 = -1
	rec := &notifications{}
	rec.on = func(s string) {
		if strings.HasPrefix(s, "STOPPING=1") {
			locksAtStopping = w.lockKeys(t)
		}
	}
	d, err := New(t.Context(), cfg, Options{Notify: rec.send, Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()

	api := agent.NewAPIClient(cfg.API.Socket)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		st, err := api.Status(t.Context())
		if err == nil && st.Counters.Acquired == uint64(len(cfg.Devices)) && slices.ContainsFunc(rec.all(), func(m string) bool { return strings.HasPrefix(m, "READY=1") }) {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatalf("not holding every device and ready after 30s: %v; notified %q", err, rec.all())
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run after ctx ended: %v, want nil", err)
	}
	if locksAtStopping != int64(len(cfg.Devices)) {
		t.Errorf("%d lock keys in etcd at STOPPING=1, want %d (still held)", locksAtStopping, len(cfg.Devices))
	}
	if n := w.lockKeys(t); n != 0 {
		t.Errorf("%d lock keys in etcd after Run returned, want 0 (released)", n)
	}
	if _, err := os.Stat(cfg.API.Socket); !os.IsNotExist(err) {
		t.Errorf("API socket after Run returned: %v, want removed", err)
	}
	ob, err := offline.Open(filepath.Join(dir, offline.File), &offline.Options{Timeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatalf("outbox after Run returned: %v, want closed", err)
	}
	ob.Close()
	if err := d.Run(t.Context()); !errors.Is(err, ErrClosed) {
		t.Errorf("second Run: %v, want ErrClosed", err)
	}
}
