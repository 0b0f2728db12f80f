package mochihold_test

import (
	"testing"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"

	"github.com/edgefence/edgefence/internal/mochihold"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// TestHoldUntilRelease: the first publish on the held topic is
// acknowledged to its publisher at once and reaches the subscriber only
// at Release, after a later one on another topic; the next one on the
// held topic passes (one was to be held), and its properties (correlation
// data) reach the subscriber unchanged.
func TestHoldUntilRelease(t *testing.T) {
	var h *mochihold.Hold
	b, err := sandbox.StartBroker(sandbox.BrokerConfig{Setup: func(srv *mochi.Server) (err error) {
		h, err = mochihold.Add(srv, "d/ack", 1)
		return err
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	got := make(chan mqtt.Message, 8)
	ctx := t.Context()
	sub, err := mqtt.Dial(ctx, mqtt.Config{Brokers: []string{b.URL()}, ClientID: "sub", CleanStart: true, SessionExpiry: -1,
		Subscriptions: []mqtt.Subscription{{Filter: "d/#", Handler: func(m mqtt.Message) { got <- m }}}})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close(ctx)
	if err := sub.AwaitSubscribed(ctx); err != nil {
		t.Fatal(err)
	}
	pub, err := mqtt.Dial(ctx, mqtt.Config{Brokers: []string{b.URL()}, ClientID: "pub", CleanStart: true, SessionExpiry: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(ctx)
	if err := pub.AwaitConnection(ctx); err != nil {
		t.Fatal(err)
	}
	publish := func(topic, corr string) {
		t.Helper()
		if err := pub.Publish(ctx, mqtt.Message{Topic: topic, Payload: []byte(corr), CorrelationData: []byte(corr)}); err != nil {
			t.Fatal(err) // acknowledged at once, held or not
		}
	}
	next := func() mqtt.Message {
		t.Helper()
		select {
		case m := <-got:
			return m
		case <-time.After(10 * time.Second):
			t.Fatal("nothing delivered")
			return mqtt.Message{}
		}
	}
	publish("d/ack", "first")
	publish("d/other", "second")
	if m := next(); m.Topic != "d/other" {
		t.Fatalf("got %s (%s) before the release", m.Topic, m.CorrelationData)
	}
	if n, _ := h.Held(); n != 1 {
		t.Fatalf("held %d, want 1", n)
	}
	if err := h.Release(); err != nil {
		t.Fatal(err)
	}
	if m := next(); m.Topic != "d/ack" || string(m.CorrelationData) != "first" || string(m.Payload) != "first" {
		t.Fatalf("released: %s %q %q", m.Topic, m.CorrelationData, m.Payload)
	}
	publish("d/ack", "third")
	if m := next(); m.Topic != "d/ack" || string(m.CorrelationData) != "third" {
		t.Fatalf("after the release: %s %q", m.Topic, m.CorrelationData)
	}
	if n, _ := h.Held(); n != 0 {
		t.Errorf("held %d after the release", n)
	}
}
