package sandbox

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

func startEtcd(t *testing.T, cfg EtcdConfig) *Etcd {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	start := time.Now()
	e, err := StartEtcd(t.Context(), cfg)
	if err != nil {
		t.Fatalf("StartEtcd: %v", err)
	}
	t.Logf("etcd (fast=%v) ready in %v at %s", cfg.Fast, time.Since(start), e.Endpoint())
	t.Cleanup(func() {
		start := time.Now()
		if err := e.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		t.Logf("etcd closed in %v", time.Since(start))
	})
	return e
}

func etcdClient(t *testing.T, e *Etcd) *clientv3.Client {
	t.Helper()
	c, err := e.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestEtcdPutGet(t *testing.T) {
	for _, fast := range []bool{false, true} {
		t.Run(map[bool]string{false: "default", true: "fast"}[fast], func(t *testing.T) {
			e := startEtcd(t, EtcdConfig{Fast: fast})
			c := etcdClient(t, e)
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			if _, err := c.Put(ctx, "sandbox/k", "v"); err != nil {
				t.Fatalf("put: %v", err)
			}
			r, err := c.Get(ctx, "sandbox/k")
			if err != nil {
				t.Fatalf("get: %v", err)
			}
			if len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "v" {
				t.Fatalf("get = %v", r.Kvs)
			}
		})
	}
}

func TestEtcdFixedClientAddr(t *testing.T) {
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", itoa(port))
	e := startEtcd(t, EtcdConfig{Fast: true, ClientAddr: addr})
	if got, want := e.Endpoint(), "http://"+addr; got != want {
		t.Fatalf("Endpoint = %q, want %q", got, want)
	}
	// A second etcd on the same address fails cleanly, leaving nothing behind.
	_, err = StartEtcd(t.Context(), EtcdConfig{Dir: t.TempDir(), Fast: true, ClientAddr: addr})
	if err == nil {
		t.Fatal("second StartEtcd on a taken address succeeded")
	}
	t.Logf("taken address: %v", err)
}

// TestEtcdLeaseExpiry checks that under Fast a TTL=1 session's lease
// expires soon after its keep-alive stops (the client is closed without
// revoking), and measures how soon.
func TestEtcdLeaseExpiry(t *testing.T) {
	e := startEtcd(t, EtcdConfig{Fast: true})
	watcher := etcdClient(t, e)
	holder, err := e.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	s, err := concurrency.NewSession(holder, concurrency.WithTTL(1))
	if err != nil {
		t.Fatalf("session: %v", err)
	}
	const key = "sandbox/lease-holder"
	put, err := holder.Put(ctx, key, "x", clientv3.WithLease(s.Lease()))
	if err != nil {
		t.Fatalf("put: %v", err)
	}
	wch := watcher.Watch(ctx, key, clientv3.WithRev(put.Header.Revision+1))

	// Let a keep-alive or two go through, so expiry is not just the grant's TTL.
	time.Sleep(700 * time.Millisecond)
	ttl, err := watcher.TimeToLive(ctx, s.Lease())
	if err != nil || ttl.TTL < 0 { // -1 = expired; 0 = under a second left

		t.Fatalf("lease should be alive: ttl=%v err=%v", ttl, err)
	}

	closed := time.Now()
	holder.Close() // keep-alive stops; the lease is not revoked
	select {
	case <-s.Done():
	case <-ctx.Done():
		t.Fatal("session not done after client close")
	}
	for {
		select {
		case wr, ok := <-wch:
			if !ok || wr.Err() != nil {
				t.Fatalf("watch ended: %v", wr.Err())
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete {
					took := time.Since(closed)
					t.Logf("TTL=1 lease expired %v after keep-alive stopped", took)
					// About 1 s; bounded generously (a loaded machine's etcd
					// checks its leases late), but far below never.
					if took > 20*time.Second {
						t.Fatalf("lease took %v to expire, want about 1 s", took)
					}
					return
				}
			}
		case <-ctx.Done():
			t.Fatal("lease did not expire")
		}
	}
}

func TestEtcdRestartKeepsData(t *testing.T) {
	e := startEtcd(t, EtcdConfig{Fast: true})
	c := etcdClient(t, e)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := c.Put(ctx, "sandbox/persist", "1"); err != nil {
		t.Fatal(err)
	}
	endpoint := e.Endpoint()

	start := time.Now()
	if err := e.Restart(ctx); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	t.Logf("etcd restart (stop+start) took %v", time.Since(start))
	if e.Endpoint() != endpoint {
		t.Fatalf("endpoint changed: %s -> %s", endpoint, e.Endpoint())
	}
	// The same client reconnects on its own.
	r, err := c.Get(ctx, "sandbox/persist")
	if err != nil {
		t.Fatalf("get after restart: %v", err)
	}
	if len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "1" {
		t.Fatalf("after restart: %v", r.Kvs)
	}

	// Stop, then Start: the endpoint refuses meanwhile, data survives.
	if err := e.Stop(); err != nil {
		t.Fatal(err)
	}
	if conn, err := net.DialTimeout("tcp", e.Endpoint()[len("http://"):], time.Second); err == nil {
		conn.Close()
		t.Fatal("stopped etcd still accepts connections")
	}
	if err := e.Start(ctx); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if r, err = c.Get(ctx, "sandbox/persist"); err != nil || len(r.Kvs) != 1 {
		t.Fatalf("get after stop/start: %v %v", r, err)
	}

	// A new Etcd on the same dir sees the data too.
	dir := e.Dir()
	e.Close()
	if err := e.Start(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Start after Close = %v, want ErrClosed", err)
	}
	e2 := startEtcd(t, EtcdConfig{Fast: true, Dir: dir})
	c2 := etcdClient(t, e2)
	if r, err = c2.Get(ctx, "sandbox/persist"); err != nil || len(r.Kvs) != 1 {
		t.Fatalf("get on reopened dir: %v %v", r, err)
	}
}

func TestEtcdStartErrors(t *testing.T) {
	if _, err := StartEtcd(t.Context(), EtcdConfig{}); err == nil {
		t.Fatal("StartEtcd without Dir succeeded")
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	e, err := StartEtcd(ctx, EtcdConfig{Dir: t.TempDir()})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("StartEtcd with cancelled ctx = %v, %v; want context.Canceled", e, err)
	}
	if err := e.Close(); err != nil { // nil *Etcd
		t.Fatal(err)
	}
}

func TestEtcdCloseIdempotent(t *testing.T) {
	e := startEtcd(t, EtcdConfig{Fast: true})
	for range 3 {
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Restart(t.Context()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Restart after Close = %v", err)
	}
}
