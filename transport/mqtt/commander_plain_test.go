package mqtt

import (
	"bytes"
	"context"
	"errors"
	"sync"
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
	if m.Drop("held") {
		t.Fatal("Drop of a lapsed wait reported the command waiting")
	}
	close(release)
	waitStatus(t, m, "acks_late", 1) // the held command's first ack, kept
	select {
	case a := <-answers:
		t.Fatalf("an answer after Drop: %+v", a)
	default:
	}
	// The kept ack answers the command's next Post at once, before Post
	// returns, and nothing is published again.
	if err := m.Post(timeout(t, 10*time.Second), held, answer); err != nil {
		t.Fatal(err)
	}
	select {
	case a := <-answers:
		if a.ID != "held" || a.Verdict != fence.Accepted {
			t.Fatalf("answer %+v", a)
		}
	default:
		t.Fatal("the held command's next Post was not answered at once by its late ack")
	}
	if got := m.Status()["acks"].(uint64); got != 2 {
		t.Fatalf("acks %d, want 2", got)
	}
}

// waitStatus waits until m's Status()[key] reaches n.
func waitStatus(t *testing.T, m *Commander, key string, n uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for m.Status()[key].(uint64) < n {
		if time.Now().After(deadline) {
			t.Fatalf("want %s ≥ %d: %v", key, n, m.Status())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// lateDevice answers each command like a fence point — accepted the
// first time it sees its id, duplicate after —, off the delivery
// goroutine, and a command whose id has a gate only once the gate is
// closed.
type lateDevice struct {
	mu    sync.Mutex
	seen  map[string]int // command id → copies received
	gates map[string]chan struct{}
}

func (d *lateDevice) received(id string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.seen[id]
}

// TestLateAckAnswersResend: a device that answers after the Send stopped
// waiting (its ctx ended) has that first verdict (accepted) heard: the
// ack is kept, and the command's next Send returns it at once without
// publishing the command again, where before it was dropped as unmatched
// and the resend answered duplicate. The lapsed wait ends when another
// command to the device registers (one in flight per device: the sender
// settled the first), so lapsed waits stay one per device; an ack for it
// then counts as unmatched.
func TestLateAckAnswersResend(t *testing.T) {
	b := startBroker(t)
	topics := Topics{}
	d := &lateDevice{seen: map[string]int{}, gates: map[string]chan struct{}{"slow-1": make(chan struct{}), "slow-2": make(chan struct{})}}
	dev := dial(t, b.url(), "late-device")
	dev.Subscribe(topics.AllCmd(), func(m Message) {
		env, err := fence.UnmarshalEnvelope(m.Payload)
		if err != nil {
			t.Error(err)
			return
		}
		d.mu.Lock()
		d.seen[env.ID]++
		v, gate := fence.Accepted, d.gates[env.ID]
		if d.seen[env.ID] > 1 {
			v = fence.Duplicate
		}
		d.mu.Unlock()
		go func() {
			if gate != nil {
				<-gate
			}
			ack := fence.NewAck(env, v, fence.Mark{Token: env.Token, Seq: env.Seq}, "")
			raw, err := fence.MarshalAck(&ack)
			if err != nil {
				t.Error(err)
				return
			}
			if err := dev.Publish(timeout(t, 5*time.Second), Message{Topic: topics.Ack(env.Device), Payload: raw}); err != nil && t.Context().Err() == nil {
				t.Error(err)
			}
		}()
	})
	if err := dev.AwaitSubscribed(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	m, err := NewCommander(t.Context(), Config{Brokers: []string{b.url()}, ClientID: "late-gw", Logger: testLogger(t)}, topics, []string{"dev-1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close(timeout(t, 5*time.Second)) })
	if err := m.Client().AwaitSubscribed(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	env := func(id string, seq uint64) *fence.Envelope {
		return &fence.Envelope{V: fence.Version, Device: "dev-1", Token: 7, Seq: seq, ID: id, Kind: "set", Holder: "gw"}
	}
	gaveUp := func(e *fence.Envelope) {
		t.Helper()
		ctx, cancel := context.WithCancel(t.Context())
		go func() {
			for d.received(e.ID) == 0 && ctx.Err() == nil {
				time.Sleep(time.Millisecond)
			}
			cancel() // the command is at the device: stop waiting
		}()
		if ack, err := m.Send(ctx, e); !errors.Is(err, context.Canceled) {
			t.Fatalf("Send %s: %+v %v, want it to give up", e.ID, ack, err)
		}
		if st := m.Status(); st["in_flight"] != 0 || st["waits_lapsed"] != 1 {
			t.Fatalf("after giving up on %s: %v", e.ID, st)
		}
	}

	slow := env("slow-1", 1)
	gaveUp(slow)
	close(d.gates["slow-1"])
	waitStatus(t, m, "acks_late", 1)
	ack, err := m.Send(timeout(t, 10*time.Second), slow)
	if err != nil || ack.Verdict != fence.Accepted {
		t.Fatalf("the resend: %+v %v, want the late accepted", ack, err)
	}
	if n := d.received("slow-1"); n != 1 {
		t.Errorf("the device got slow-1 %d times, want once (the kept ack answered the resend)", n)
	}
	if st := m.Status(); st["waits_lapsed"] != 0 || st["in_flight"] != 0 {
		t.Errorf("after the resend: %v", st)
	}

	gaveUp(env("slow-2", 2))
	if ack, err := m.Send(timeout(t, 10*time.Second), env("next-3", 3)); err != nil || ack.Verdict != fence.Accepted {
		t.Fatalf("next-3: %+v %v", ack, err)
	}
	if st := m.Status(); st["waits_lapsed"] != 0 {
		t.Errorf("slow-2's wait not ended by the device's next command: %v", st)
	}
	unmatched := m.Status()["acks_unmatched"].(uint64)
	close(d.gates["slow-2"])
	waitStatus(t, m, "acks_unmatched", unmatched+1)
	if n := m.Status()["acks_late"].(uint64); n != 1 {
		t.Errorf("acks_late %d, want 1 (slow-2's ack came after its wait ended)", n)
	}
}
