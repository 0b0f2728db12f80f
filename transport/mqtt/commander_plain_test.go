package mqtt

import (
	"bytes"
	"testing"
	"time"

	"github.com/edgefence/edgefence/fence"
)

// TestSignWithPlainDevices: with SignWith(sign, "dev-2"), commands to dev-1
// go out as sign encodes them and commands to dev-2 (its policy `auth:
// off`) as plain envelopes, each plain one counted in Status "unsigned".
// Without a signer every command is plain, and counted.
func TestSignWithPlainDevices(t *testing.T) {
	b := startBroker(t)
	topics := Topics{}
	got := make(chan Message, 8)
	dev := dial(t, b.url(), "plain-devices")
	dev.Subscribe(topics.AllCmd(), func(m Message) {
		got <- m
		d, _, _ := topics.Parse(m.Topic)
		ack, err := fence.MarshalAck(&fence.Ack{V: fence.Version, ID: string(m.CorrelationData), Verdict: fence.Accepted, Token: 7, Seq: 1, MaxToken: 7, LastSeq: 1})
		if err != nil {
			t.Error(err)
			return
		}
		// The commander may have the ack (and the test may be over)
		// before the broker's PUBACK reaches the device: a publish cut
		// short by the test's end is not an error.
		if err := dev.Publish(timeout(t, 5*time.Second), Message{Topic: topics.Ack(d), Payload: ack}); err != nil && t.Context().Err() == nil {
			t.Error(err)
		}
	})
	if err := dev.AwaitSubscribed(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	m, err := NewCommander(t.Context(), Config{Brokers: []string{b.url()}, ClientID: "plain-gw", Logger: testLogger(t)}, topics, []string{"dev-1", "dev-2"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close(timeout(t, 5*time.Second)) })
	if err := m.Client().AwaitSubscribed(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	send := func(device string) []byte {
		t.Helper()
		env := &fence.Envelope{V: fence.Version, Device: device, Token: 7, Seq: 1, ID: "c-" + device + time.Now().Format("150405.000000000"), Kind: "set", Holder: "gw"}
		if _, err := m.Send(timeout(t, 10*time.Second), env); err != nil {
			t.Fatal(err)
		}
		select {
		case msg := <-got:
			return msg.Payload
		case <-time.After(10 * time.Second):
			t.Fatal("command not received")
			return nil
		}
	}
	unsigned := func() uint64 { return m.Status()["unsigned"].(uint64) }

	if p := send("dev-1"); !isPlain(p) || unsigned() != 1 {
		t.Fatalf("no signer: payload %x, unsigned %d", p, unsigned())
	}
	marker := []byte("signed")
	m.SignWith(func(*fence.Envelope) ([]byte, error) { return marker, nil }, "dev-2")
	if p := send("dev-1"); !bytes.Equal(p, marker) || unsigned() != 1 {
		t.Fatalf("auth: required device: payload %x, unsigned %d", p, unsigned())
	}
	if p := send("dev-2"); !isPlain(p) || unsigned() != 2 {
		t.Fatalf("auth: off device: payload %x, unsigned %d", p, unsigned())
	}
}

func isPlain(p []byte) bool {
	_, err := fence.UnmarshalEnvelope(p)
	return err == nil
}

// TestPostAnswersOnce: Post returns once the broker has the command; the
// device's ack reaches answer once, even when the device answers twice;
// a command dropped before its ack never reaches answer (the ack counts as
// unmatched), and Drop after the answer reports false.
func TestPostAnswersOnce(t *testing.T) {
	b := startBroker(t)
	topics := Topics{}
	release := make(chan struct{})
	dev := dial(t, b.url(), "post-device")
	dev.Subscribe(topics.AllCmd(), func(m Message) {
		env, err := fence.UnmarshalEnvelope(m.Payload)
		if err != nil {
			t.Error(err)
			return
		}
		go func() { // answers off the delivery goroutine: the held one waits for release
			if env.ID == "held" {
				<-release
			}
			ack := fence.NewAck(env, fence.Accepted, fence.Mark{Token: env.Token, Seq: env.Seq}, "")
			raw, err := fence.MarshalAck(&ack)
			if err != nil {
				t.Error(err)
				return
			}
			for range 2 { // a device that answers twice: the first counts
				if err := dev.Publish(timeout(t, 5*time.Second), Message{Topic: topics.Ack(env.Device), Payload: raw}); err != nil && t.Context().Err() == nil {
					t.Error(err)
				}
			}
		}()
	})
	if err := dev.AwaitSubscribed(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	m, err := NewCommander(t.Context(), Config{Brokers: []string{b.url()}, ClientID: "post-gw", Logger: testLogger(t)}, topics, []string{"dev-1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close(timeout(t, 5*time.Second)) })
	if err := m.Client().AwaitSubscribed(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	answers := make(chan *fence.Ack, 4)
	answer := func(a *fence.Ack) { answers <- a }
	env := &fence.Envelope{V: fence.Version, Device: "dev-1", Token: 7, Seq: 1, ID: "first", Kind: "set", Holder: "gw"}
	if err := m.Post(timeout(t, 10*time.Second), env, answer); err != nil {
		t.Fatal(err)
	}
	select {
	case a := <-answers:
		if a.ID != "first" || a.Verdict != fence.Accepted {
			t.Fatalf("answer %+v", a)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no answer")
	}
	if m.Drop("first") {
		t.Fatal("Drop after the answer reported the command waiting")
	}
	unmatchedAtLeast := func(n uint64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for m.Status()["acks_unmatched"].(uint64) < n {
			if time.Now().After(deadline) {
				t.Fatalf("want %d unmatched acks: %v", n, m.Status())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	unmatchedAtLeast(1) // the first command's second ack
	held := &fence.Envelope{V: fence.Version, Device: "dev-1", Token: 7, Seq: 2, ID: "held", Kind: "set", Holder: "gw"}
	if err := m.Post(timeout(t, 10*time.Second), held, answer); err != nil {
		t.Fatal(err)
	}
	if !m.Drop("held") {
		t.Fatal("Drop of a command waiting for its ack reported false")
	}
	close(release)
	unmatchedAtLeast(3) // and the held command's two
	select {
	case a := <-answers:
		t.Fatalf("a second answer: %+v", a)
	default:
	}
	if got := m.Status()["acks"].(uint64); got != 1 {
		t.Fatalf("acks %d, want 1", got)
	}
}
