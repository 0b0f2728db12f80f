package mqtt

import (
	"sync"
	"testing"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
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

// TestRetainAfterRestart: a process that resumes its predecessor's session
// (the same client id, session present) still gets the retained messages
// on its first subscription — its predecessor may have received them and
// died with them (an agent kill -9'd mid firmware job waited a minute for
// device reports it never got) — and asks for them only on that one:
// resubscriptions on its reconnects use Retain Handling 1.
func TestRetainAfterRestart(t *testing.T) {
	subs := &subscribeLog{}
	b := startBroker(t, subs)
	pub := dial(t, b.url(), "rar-pub")
	if err := pub.AwaitConnection(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(timeout(t, 5*time.Second), Message{Topic: "rar/dev/state", Payload: []byte("committed"), Retain: true}); err != nil {
		t.Fatal(err)
	}
	first := make(chan Message, 4)
	a := dial(t, b.url(), "rar-agent")
	a.Subscribe("rar/+/state", func(m Message) { first <- m })
	if err := a.AwaitSubscribed(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if m := recvWithin(t, first, 10*time.Second); m == nil || !m.Retain {
		t.Fatalf("first process: %+v, want the retained report", m)
	}
	// The process ends; the broker keeps its session (a persistent one).
	if err := a.Close(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	got := make(chan Message, 4)
	a2 := dial(t, b.url(), "rar-agent")
	a2.Subscribe("rar/+/state", func(m Message) { got <- m })
	if err := a2.AwaitSubscribed(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if m := recvWithin(t, got, 10*time.Second); m == nil || string(m.Payload) != "committed" {
		t.Fatalf("the restarted process: %+v, want the retained report", m)
	}
	// A reconnect of the same process: the broker drops the connection.
	b.mu.Lock()
	cl, ok := b.srv.Clients.Get("rar-agent")
	b.mu.Unlock()
	if !ok {
		t.Fatal("the broker has no client rar-agent")
	}
	_ = b.srv.DisconnectClient(cl, packets.ErrServerBusy) // it returns the code it sent
	deadline := time.Now().Add(10 * time.Second)
	for a2.Stats().Reconnects == 0 || !a2.Subscribed() {
		if time.Now().After(deadline) {
			t.Fatalf("no reconnect and resubscription: %+v", a2.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// What each SUBSCRIBE of rar-agent asked: the first process's and the
	// restarted one's first, then the reconnect's.
	if got, want := subs.handling("rar-agent"), []byte{0, 0, 1}; string(got) != string(want) {
		t.Fatalf("rar-agent's SUBSCRIBEs asked Retain Handling %v, want %v", got, want)
	}
}

// subscribeLog is a mochi hook that records each client's SUBSCRIBEs'
// Retain Handling.
type subscribeLog struct {
	mochi.HookBase
	mu sync.Mutex
	rh map[string][]byte
}

func (h *subscribeLog) ID() string { return "subscribe-log" }

func (h *subscribeLog) Provides(b byte) bool { return b == mochi.OnSubscribe }

func (h *subscribeLog) OnSubscribe(cl *mochi.Client, pk packets.Packet) packets.Packet {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.rh == nil {
		h.rh = map[string][]byte{}
	}
	for _, f := range pk.Filters {
		h.rh[cl.ID] = append(h.rh[cl.ID], f.RetainHandling)
	}
	return pk
}

func (h *subscribeLog) handling(client string) []byte {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]byte(nil), h.rh[client]...)
}

// recvWithin returns the next message on ch, or nil after d.
func recvWithin(t *testing.T, ch <-chan Message, d time.Duration) *Message {
	t.Helper()
	select {
	case m := <-ch:
		return &m
	case <-time.After(d):
		return nil
	}
}
