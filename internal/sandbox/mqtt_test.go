package sandbox

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
)

// mqttClient connects a plain paho MQTT v5 client to addr; received
// publishes go to msgs; opts may change its config. The client is
// disconnected at test cleanup.
func mqttClient(t *testing.T, ctx context.Context, addr, id string, msgs chan<- *paho.Publish, opts ...func(*paho.ClientConfig)) *paho.Client {
	t.Helper()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	cfg := paho.ClientConfig{
		ClientID: id,
		Conn:     conn,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){
			func(pr paho.PublishReceived) (bool, error) {
				if msgs != nil {
					select {
					case msgs <- pr.Packet:
					default:
						t.Errorf("%s: message dropped, channel full", id)
					}
				}
				return true, nil
			},
		},
	}
	for _, o := range opts {
		o(&cfg)
	}
	c := paho.NewClient(cfg)
	ca, err := c.Connect(ctx, &paho.Connect{ClientID: id, KeepAlive: 30, CleanStart: true})
	if err != nil {
		conn.Close()
		t.Fatalf("connect %s: %v", id, err)
	}
	if ca.ReasonCode != 0 {
		t.Fatalf("connect %s: reason code %#x", id, ca.ReasonCode)
	}
	t.Cleanup(func() { _ = c.Disconnect(&paho.Disconnect{}) })
	return c
}

// pubSubOnce subscribes one client to a topic at QoS 1, publishes one QoS 1
// message from another, and checks it arrives. It returns the round trip.
func pubSubOnce(t *testing.T, addr, topic string) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	msgs := make(chan *paho.Publish, 1)
	sub := mqttClient(t, ctx, addr, "sub-"+t.Name(), msgs)
	pub := mqttClient(t, ctx, addr, "pub-"+t.Name(), nil)

	sa, err := sub.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: topic, QoS: 1}}})
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	if len(sa.Reasons) != 1 || sa.Reasons[0] != 1 {
		t.Fatalf("suback reasons %v, want [1] (granted QoS 1)", sa.Reasons)
	}
	start := time.Now()
	pr, err := pub.Publish(ctx, &paho.Publish{Topic: topic, QoS: 1, Payload: []byte("hello")})
	if err != nil {
		t.Fatalf("publish: %v", err)
	}
	if pr.ReasonCode != 0 {
		t.Fatalf("puback reason %#x", pr.ReasonCode)
	}
	select {
	case m := <-msgs:
		rtt := time.Since(start)
		if m.Topic != topic || string(m.Payload) != "hello" || m.QoS != 1 {
			t.Fatalf("got %q %q qos %d", m.Topic, m.Payload, m.QoS)
		}
		return rtt
	case <-ctx.Done():
		t.Fatal("message not delivered")
	}
	return 0
}
