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
