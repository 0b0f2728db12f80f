package mqtt

import (
	"testing"
	"time"
)

// TestRetain: a message published with Retain is kept by the broker and
// delivered, flagged Retain, to a client that subscribes afterwards; a
// plain one is not.
func TestRetain(t *testing.T) {
	b := startBroker(t)
	pub := dial(t, b.url(), "ret-pub")
	if err := pub.AwaitConnection(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(timeout(t, 5*time.Second), Message{Topic: "ret/kept", Payload: []byte("last"), Retain: true}); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(timeout(t, 5*time.Second), Message{Topic: "ret/gone", Payload: []byte("live")}); err != nil {
		t.Fatal(err)
	}
	got := make(chan Message, 4)
	sub := dial(t, b.url(), "ret-sub")
	sub.Subscribe("ret/+", func(m Message) { got <- m })
	if err := sub.AwaitSubscribed(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-got:
		if m.Topic != "ret/kept" || string(m.Payload) != "last" || !m.Retain {
			t.Fatalf("received %+v, want the retained message", m)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("retained message not received")
	}
	// A live message after the subscription is not flagged retained.
	if err := pub.Publish(timeout(t, 5*time.Second), Message{Topic: "ret/gone", Payload: []byte("now")}); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-got:
		if m.Topic != "ret/gone" || string(m.Payload) != "now" || m.Retain {
			t.Fatalf("received %+v, want the live message", m)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("live message not received")
	}
}
