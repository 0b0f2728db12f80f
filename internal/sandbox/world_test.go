package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestWorld(t *testing.T) {
	dir := t.TempDir()
	start := time.Now()
	w, err := StartWorld(t.Context(), WorldConfig{Dir: dir, Fast: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("world (fast) up in %v", time.Since(start))
	defer w.Close()

	want := "EDGEFENCE_ETCD=" + w.Etcd.Endpoint() + "\nEDGEFENCE_MQTT=" + w.Broker.URL() + "\n"
	if got := w.Env(); got != want {
		t.Fatalf("Env = %q, want %q", got, want)
	}
	envFile := filepath.Join(dir, "sandbox.env")
	if err := w.WriteEnvFile(envFile); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(envFile); err != nil || string(b) != want {
		t.Fatalf("env file = %q, %v", b, err)
	}
	if leftovers, _ := filepath.Glob(filepath.Join(dir, ".sandbox.env.*")); len(leftovers) > 0 {
		t.Fatalf("temp files left: %v", leftovers)
	}
	if _, err := os.Stat(filepath.Join(dir, "etcd", "member")); err != nil {
		t.Fatalf("etcd data not under Dir/etcd: %v", err)
	}

	c := etcdClient(t, w.Etcd)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if _, err := c.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	pubSubOnce(t, w.Broker.Addr(), "edgefence/world")

	start = time.Now()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("world closed in %v", time.Since(start))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestWorldStartFailsCleanly(t *testing.T) {
	b := startBroker(t, BrokerConfig{})
	// The broker address is taken: etcd starts, the broker fails, etcd is
	// closed again (goleak in TestMain would see it otherwise).
	_, err := StartWorld(t.Context(), WorldConfig{Dir: t.TempDir(), Fast: true, MQTTAddr: b.Addr()})
	if err == nil {
		t.Fatal("StartWorld on a taken MQTT address succeeded")
	}
}
