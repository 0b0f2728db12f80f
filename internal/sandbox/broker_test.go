package sandbox

import (
	"context"
	"errors"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"
)

func startBroker(t testing.TB, cfg BrokerConfig) *Broker {
	t.Helper()
	start := time.Now()
	b, err := StartBroker(cfg)
	if err != nil {
		t.Fatalf("StartBroker: %v", err)
	}
	t.Logf("broker listening in %v at %s", time.Since(start), b.URL())
	t.Cleanup(func() {
		start := time.Now()
		if err := b.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		t.Logf("broker closed in %v", time.Since(start))
	})
	return b
}

func TestBrokerPubSubQoS1(t *testing.T) {
	b := startBroker(t, BrokerConfig{})
	if b.URL() != "mqtt://"+b.Addr() {
		t.Fatalf("URL %q, Addr %q", b.URL(), b.Addr())
	}
	rtt := pubSubOnce(t, b.Addr(), "edgefence/test/cmd")
	t.Logf("mochi QoS 1 publish→receive %v", rtt)
}

func TestBrokerFixedAddr(t *testing.T) {
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", itoa(port))
	b := startBroker(t, BrokerConfig{Addr: addr})
	if b.Addr() != addr {
		t.Fatalf("Addr = %q, want %q", b.Addr(), addr)
	}
	if _, err := StartBroker(BrokerConfig{Addr: addr}); err == nil {
		t.Fatal("second broker on the same address started")
	}
}

// TestBrokerCloseDropsClients checks that Close disconnects a connected
// client and also a raw connection that never sent CONNECT (which mochi
// alone would wait for forever).
func TestBrokerCloseDropsClients(t *testing.T) {
	b, err := StartBroker(BrokerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	c := mqttClient(t, ctx, b.Addr(), "victim", nil)
	raw, err := net.Dial("tcp", b.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	// Wait until mochi has accepted both connections.
	for deadline := time.Now().Add(5 * time.Second); b.openConns() < 2; {
		if time.Now().After(deadline) {
			t.Fatalf("broker holds %d connections, want 2", b.openConns())
		}
		time.Sleep(time.Millisecond)
	}

	start := time.Now()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	t.Logf("broker Close with a silent raw connection took %v", took)
	// Close must not wait for the silent connection forever; how long it
	// takes under load is a figure, not a verdict (bounded generously).
	if took > brokerCloseGrace+30*time.Second {
		t.Fatalf("Close took %v", took)
	}
	select {
	case <-c.Done():
	case <-ctx.Done():
		t.Fatal("client still connected after Close")
	}
	raw.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := raw.Read(make([]byte, 1)); err == nil {
		t.Fatal("raw connection still open after Close")
	}
	if err := b.Close(); err != nil { // idempotent
		t.Fatal(err)
	}
	if err := b.Start(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Start after Close = %v", err)
	}
}

// TestBrokerRestart restarts the broker under an autopaho client, which
// reconnects to the same address, and publishes through the new broker.
func TestBrokerRestart(t *testing.T) {
	b := startBroker(t, BrokerConfig{})
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	u, err := url.Parse(b.URL())
	if err != nil {
		t.Fatal(err)
	}
	ups := make(chan struct{}, 4)
	cm, err := autopaho.NewConnection(ctx, autopaho.ClientConfig{
		ServerUrls:                    []*url.URL{u},
		KeepAlive:                     30,
		CleanStartOnInitialConnection: true,
		ReconnectBackoff:              autopaho.NewConstantBackoff(20 * time.Millisecond),
		ConnectTimeout:                2 * time.Second,
		OnConnectionUp: func(*autopaho.ConnectionManager, *paho.Connack) {
			select {
			case ups <- struct{}{}:
			default:
			}
		},
		ClientConfig: paho.ClientConfig{ClientID: "auto-" + t.Name()},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		dctx, dcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer dcancel()
		if err := cm.Disconnect(dctx); err != nil {
			t.Errorf("autopaho disconnect: %v", err)
		}
	}()
	waitUp := func(what string) {
		t.Helper()
		select {
		case <-ups:
		case <-ctx.Done():
			t.Fatalf("autopaho not connected %s", what)
		}
	}
	waitUp("initially")
	rtt := pubSubOnce(t, b.Addr(), "edgefence/test/before")
	t.Logf("before restart: publish→receive %v", rtt)

	start := time.Now()
	if err := b.Restart(ctx); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	t.Logf("broker restart took %v", time.Since(start))
	waitUp("after restart")
	t.Logf("autopaho reconnected %v after restart began", time.Since(start))

	// Through the new broker: a fresh subscriber, the reconnected publisher.
	msgs := make(chan *paho.Publish, 1)
	sub := mqttClient(t, ctx, b.Addr(), "sub-after-"+t.Name(), msgs)
	if _, err := sub.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "edgefence/test/after", QoS: 1}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := cm.Publish(ctx, &paho.Publish{Topic: "edgefence/test/after", QoS: 1, Payload: []byte("again")}); err != nil {
		t.Fatalf("publish after restart: %v", err)
	}
	select {
	case m := <-msgs:
		if string(m.Payload) != "again" {
			t.Fatalf("payload %q", m.Payload)
		}
	case <-ctx.Done():
		t.Fatal("not delivered after restart")
	}

	// Stop/Start with a gap: the address refuses connections meanwhile.
	if err := b.Stop(); err != nil {
		t.Fatal(err)
	}
	if b.Server() != nil {
		t.Fatal("Server() non-nil while stopped")
	}
	if c, err := net.DialTimeout("tcp", b.Addr(), time.Second); err == nil {
		c.Close()
		t.Fatal("stopped broker accepts connections")
	}
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitUp("after stop/start")
}

// openConns counts the connections the broker has accepted and not closed.
func (b *Broker) openConns() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ln == nil {
		return 0
	}
	b.ln.mu.Lock()
	defer b.ln.mu.Unlock()
	return len(b.ln.conns)
}
