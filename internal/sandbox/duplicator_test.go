package sandbox

import (
	"context"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
)

func TestTopicMatch(t *testing.T) {
	for _, c := range []struct {
		filter, topic string
		want          bool
	}{
		{"a/b", "a/b", true},
		{"a/b", "a/c", false},
		{"a/+", "a/b", true},
		{"a/+", "a/b/c", false},
		{"a/#", "a", true},
		{"a/#", "a/b/c", true},
		{"#", "a/b", true},
		{"#", "$SYS/x", false},
		{"+/cmd", "dev/cmd", true},
		{"a/b/c", "a/b", false},
	} {
		if got := topicMatch(c.filter, c.topic); got != c.want {
			t.Errorf("topicMatch(%q, %q) = %v", c.filter, c.topic, got)
		}
	}
}

// recv waits for the next message or fails.
func recv(t *testing.T, ctx context.Context, msgs <-chan *paho.Publish) *paho.Publish {
	t.Helper()
	select {
	case m := <-msgs:
		return m
	case <-ctx.Done():
		t.Fatal("no message")
		return nil
	}
}

// TestDuplicator checks that a matching QoS 1 PUBLISH reaches the
// subscriber twice with the same payload and properties, a non-matching
// one once, delayed duplicates arrive after later messages, and the hook
// is re-attached by a broker restart.
func TestDuplicator(t *testing.T) {
	d := NewDuplicator(DuplicateConfig{Probability: 1, Topics: []string{"chaos/dup/#"}, Seed: 1})
	b := startBroker(t, BrokerConfig{Setup: d.Attach})
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	msgs := make(chan *paho.Publish, 16)
	sub := mqttClient(t, ctx, b.Addr(), "dup-sub", msgs)
	pub := mqttClient(t, ctx, b.Addr(), "dup-pub", nil)
	if _, err := sub.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "chaos/#", QoS: 1}}}); err != nil {
		t.Fatal(err)
	}
	publish := func(c *paho.Client, topic, payload string) {
		t.Helper()
		_, err := c.Publish(ctx, &paho.Publish{Topic: topic, QoS: 1, Payload: []byte(payload),
			Properties: &paho.PublishProperties{CorrelationData: []byte("id-" + payload)}})
		if err != nil {
			t.Fatalf("publish %s: %v", topic, err)
		}
	}
	expect := func(topic, payload string) {
		t.Helper()
		m := recv(t, ctx, msgs)
		if m.Topic != topic || string(m.Payload) != payload || m.QoS != 1 ||
			m.Properties == nil || string(m.Properties.CorrelationData) != "id-"+payload {
			t.Fatalf("got %s %q qos %d props %+v, want %s %q", m.Topic, m.Payload, m.QoS, m.Properties, topic, payload)
		}
	}

	publish(pub, "chaos/other", "once")
	publish(pub, "chaos/dup/x", "twice")
	// In order on one subscription: "once" exactly once, then both copies.
	expect("chaos/other", "once")
	expect("chaos/dup/x", "twice")
	expect("chaos/dup/x", "twice")
	if n := d.Duplicated(); n != 1 {
		t.Fatalf("Duplicated = %d, want 1", n)
	}

	// Delayed duplicates are overtaken by later messages.
	d.Set(DuplicateConfig{Probability: 1, Topics: []string{"chaos/dup/#"}, Delay: 200 * time.Millisecond})
	publish(pub, "chaos/dup/y", "a")
	publish(pub, "chaos/dup/y", "b")
	expect("chaos/dup/y", "a")
	expect("chaos/dup/y", "b")
	// Then both duplicates, in either order (independent timers).
	seen := map[string]bool{}
	for range 2 {
		m := recv(t, ctx, msgs)
		if m.Topic != "chaos/dup/y" || m.Properties == nil || string(m.Properties.CorrelationData) != "id-"+string(m.Payload) {
			t.Fatalf("got %s %q props %+v", m.Topic, m.Payload, m.Properties)
		}
		seen[string(m.Payload)] = true
	}
	if !seen["a"] || !seen["b"] {
		t.Fatalf("delayed duplicates %v, want a and b", seen)
	}

	// Off, then a restart: the new server has the hook again.
	d.Set(DuplicateConfig{})
	publish(pub, "chaos/dup/z", "off")
	publish(pub, "chaos/other", "marker")
	expect("chaos/dup/z", "off")
	expect("chaos/other", "marker")

	d.Set(DuplicateConfig{Probability: 1})
	if err := b.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	msgs2 := make(chan *paho.Publish, 16)
	sub2 := mqttClient(t, ctx, b.Addr(), "dup-sub2", msgs2)
	pub2 := mqttClient(t, ctx, b.Addr(), "dup-pub2", nil)
	if _, err := sub2.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "chaos/#", QoS: 1}}}); err != nil {
		t.Fatal(err)
	}
	msgs = msgs2
	publish(pub2, "chaos/any", "again")
	expect("chaos/any", "again")
	expect("chaos/any", "again")
	// At least 4: an old client reconnecting to the new server may resend
	// a publish it had in flight, and with every topic on that one is
	// duplicated too.
	if n := d.Duplicated(); n < 4 {
		t.Fatalf("Duplicated = %d, want at least 4", n)
	}
}

// TestDuplicatorProbability checks the probability is honoured roughly.
func TestDuplicatorProbability(t *testing.T) {
	d := NewDuplicator(DuplicateConfig{Probability: 0.5, Seed: 7})
	b := startBroker(t, BrokerConfig{Setup: d.Attach})
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	msgs := make(chan *paho.Publish, 512)
	sub := mqttClient(t, ctx, b.Addr(), "p-sub", msgs)
	pub := mqttClient(t, ctx, b.Addr(), "p-pub", nil)
	if _, err := sub.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "p/#", QoS: 1}}}); err != nil {
		t.Fatal(err)
	}
	const n = 100
	for i := range n {
		if _, err := pub.Publish(ctx, &paho.Publish{Topic: "p/x", QoS: 1, Payload: []byte{byte(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	// QoS 0 is never duplicated; it doubles as the end marker.
	if _, err := pub.Publish(ctx, &paho.Publish{Topic: "p/end", QoS: 0, Payload: []byte("end")}); err != nil {
		t.Fatal(err)
	}
	got := 0
	for m := recv(t, ctx, msgs); m.Topic != "p/end"; m = recv(t, ctx, msgs) {
		got++
	}
	dups := got - n
	t.Logf("%d duplicates of %d at p=0.5", dups, n)
	if int64(dups) != d.Duplicated() || dups < 25 || dups > 75 {
		t.Fatalf("%d duplicates (counter %d), want about 50", dups, d.Duplicated())
	}
}
