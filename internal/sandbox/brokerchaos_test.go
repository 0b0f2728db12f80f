package sandbox

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"
)

// TestBrokerRestartIsEmpty restarts the broker under a reconnecting
// autopaho client with a persistent session: the client sees the
// connection drop and comes back to an empty broker — no session (CONNACK
// session present = false, its subscription gone), no retained messages.
func TestBrokerRestartIsEmpty(t *testing.T) {
	b := startBroker(t, BrokerConfig{})
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	u, err := url.Parse(b.URL())
	if err != nil {
		t.Fatal(err)
	}
	type up struct{ sessionPresent bool }
	ups := make(chan up, 4)
	msgs := make(chan *paho.Publish, 8)
	cm, err := autopaho.NewConnection(ctx, autopaho.ClientConfig{
		ServerUrls:                    []*url.URL{u},
		KeepAlive:                     30,
		CleanStartOnInitialConnection: true,
		SessionExpiryInterval:         3600, // the client keeps asking for its session
		ReconnectBackoff:              autopaho.NewConstantBackoff(20 * time.Millisecond),
		ConnectTimeout:                2 * time.Second,
		OnConnectionUp: func(_ *autopaho.ConnectionManager, ca *paho.Connack) {
			ups <- up{ca.SessionPresent}
		},
		ClientConfig: paho.ClientConfig{
			ClientID: "survivor",
			OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
				msgs <- pr.Packet
				return true, nil
			}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		dctx, dcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer dcancel()
		_ = cm.Disconnect(dctx)
	}()
	waitUp := func() up {
		t.Helper()
		select {
		case u := <-ups:
			return u
		case <-ctx.Done():
			t.Fatal("autopaho not connected")
			return up{}
		}
	}
	waitUp()
	if _, err := cm.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "chaos/q", QoS: 1}}}); err != nil {
		t.Fatal(err)
	}
	pub := mqttClient(t, ctx, b.Addr(), "pub-before", nil)
	if _, err := pub.Publish(ctx, &paho.Publish{Topic: "chaos/retained", QoS: 1, Retain: true, Payload: []byte("kept?")}); err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(ctx, &paho.Publish{Topic: "chaos/q", QoS: 1, Payload: []byte("before")}); err != nil {
		t.Fatal(err)
	}
	if m := recv(t, ctx, msgs); string(m.Payload) != "before" {
		t.Fatalf("got %q", m.Payload)
	}
	// The retained message is there before the restart.
	if !retainedPresent(t, ctx, b.Addr(), "probe-1") {
		t.Fatal("retained message missing before restart")
	}
	old := b.Server()

	start := time.Now()
	if err := b.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	u2 := waitUp()
	t.Logf("reconnected %v after the restart began", time.Since(start))
	if u2.sessionPresent {
		t.Fatal("session present after restart: the new broker kept state")
	}
	if b.Server() == old {
		t.Fatal("same mochi server after Restart")
	}
	if retainedPresent(t, ctx, b.Addr(), "probe-2") {
		t.Fatal("retained message survived the restart")
	}
	// The old subscription is gone with the session: a publish on chaos/q
	// reaches nobody; a marker on a fresh subscription proves delivery ran.
	pub2 := mqttClient(t, ctx, b.Addr(), "pub-after", nil)
	if _, err := pub2.Publish(ctx, &paho.Publish{Topic: "chaos/q", QoS: 1, Payload: []byte("lost")}); err != nil {
		t.Fatal(err)
	}
	if _, err := cm.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "chaos/marker", QoS: 1}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := pub2.Publish(ctx, &paho.Publish{Topic: "chaos/marker", QoS: 1, Payload: []byte("marker")}); err != nil {
		t.Fatal(err)
	}
	if m := recv(t, ctx, msgs); string(m.Payload) != "marker" {
		t.Fatalf("got %q on %s, want only the marker", m.Payload, m.Topic)
	}
}

// retainedPresent subscribes a fresh client to chaos/retained and reports
// whether a retained message arrives before a marker it publishes itself.
func retainedPresent(t *testing.T, ctx context.Context, addr, id string) bool {
	t.Helper()
	msgs := make(chan *paho.Publish, 4)
	c := mqttClient(t, ctx, addr, id, msgs)
	if _, err := c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "chaos/retained", QoS: 1}, {Topic: "chaos/" + id, QoS: 1}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Publish(ctx, &paho.Publish{Topic: "chaos/" + id, QoS: 1, Payload: []byte("end")}); err != nil {
		t.Fatal(err)
	}
	m := recv(t, ctx, msgs)
	if m.Topic == "chaos/retained" {
		recv(t, ctx, msgs) // the marker
		return true
	}
	return false
}
