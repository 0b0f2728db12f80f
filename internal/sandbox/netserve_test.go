//go:build linux

package sandbox

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// sandboxBinary builds cmd/edgefence-sandbox into the test's temp dir (the
// go build cache makes repeated builds cheap).
func sandboxBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the real binary; skipped with -short")
	}
	dir := t.TempDir()
	start := time.Now()
	if err := BuildCommands(t.Context(), dir, raceEnabled, "edgefence-sandbox"); err != nil {
		t.Fatal(err)
	}
	t.Logf("built edgefence-sandbox in %v", time.Since(start))
	return filepath.Join(dir, "edgefence-sandbox")
}

// TestNetLabSandbox runs `edgefence-sandbox serve` in one namespace and
// uses its etcd and broker from another, across a partition and a heal.
func TestNetLabSandbox(t *testing.T) {
	lab := NewNetLab(t, "srv", "gw")
	bin := sandboxBinary(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	// serve's broker requires credentials: a user of our own.
	users, acl := filepath.Join(t.TempDir(), "users"), filepath.Join(t.TempDir(), "acl")
	if err := os.WriteFile(users, []byte("probe:probe-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(acl, []byte(ObserverACL("edgefence/v1", "probe")), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	sb, err := lab.StartSandbox(ctx, "srv", NetSandboxConfig{Bin: bin, Dir: t.TempDir(), Fast: true, MQTTUsers: users, MQTTACL: acl})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("sandbox in %s ready in %v: etcd %s, mqtt %s", lab.NetNS("srv"), time.Since(start), sb.Etcd, sb.MQTT)
	defer func() {
		if err := sb.Stop(10 * time.Second); err != nil {
			t.Errorf("stop sandbox: %v", err)
		}
	}()
	// ip netns exec execs the program: the Proc is the server itself, so
	// Freeze/Kill reach it.
	if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", sb.Pid())); err != nil || exe != bin {
		t.Fatalf("process %d is %q (%v), want %s", sb.Pid(), exe, err, bin)
	}
	if want := "http://" + lab.HostPort("srv", NetSandboxEtcdPort); sb.Etcd != want {
		t.Fatalf("Etcd = %s, want %s", sb.Etcd, want)
	}

	// An etcd client living in gw: every connection it makes is dialled
	// from gw's namespace.
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{sb.Etcd},
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return lab.DialContext(ctx, "gw", "tcp", strings.TrimPrefix(addr, "http://"))
		})},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	put := func(v string, timeout time.Duration) error {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		_, err := cli.Put(ctx, "chaos/k", v)
		return err
	}
	if err := put("1", 10*time.Second); err != nil {
		t.Fatalf("put from gw: %v", err)
	}
	mqttAddr := strings.TrimPrefix(sb.MQTT, "mqtt://")
	mqttConnect := func(timeout time.Duration) error {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		conn, err := lab.DialContext(cctx, "gw", "tcp", mqttAddr)
		if err != nil {
			return err
		}
		c := paho.NewClient(paho.ClientConfig{ClientID: "gw-probe", Conn: conn})
		if _, err := c.Connect(cctx, &paho.Connect{ClientID: "gw-probe", KeepAlive: 30, CleanStart: true,
			UsernameFlag: true, Username: "probe", PasswordFlag: true, Password: []byte("probe-secret")}); err != nil {
			conn.Close()
			return err
		}
		return c.Disconnect(&paho.Disconnect{})
	}
	if err := mqttConnect(5 * time.Second); err != nil {
		t.Fatalf("MQTT from gw: %v", err)
	}

	if err := lab.Partition("gw", "srv"); err != nil {
		t.Fatal(err)
	}
	if err := put("2", time.Second); err == nil {
		t.Fatal("etcd put succeeded across the partition")
	} else {
		t.Logf("etcd put during partition: %v", err)
	}
	if err := mqttConnect(500 * time.Millisecond); err == nil {
		t.Fatal("MQTT connect succeeded across the partition")
	}

	if err := lab.Heal("gw", "srv"); err != nil {
		t.Fatal(err)
	}
	healed := time.Now()
	if err := put("3", 15*time.Second); err != nil {
		t.Fatalf("put after heal: %v", err)
	}
	t.Logf("etcd put succeeded %v after heal", time.Since(healed))
	if err := mqttConnect(5 * time.Second); err != nil {
		t.Fatalf("MQTT after heal: %v", err)
	}
}
