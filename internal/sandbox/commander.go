package sandbox

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// Commander is the agent's side of the conversation in tests that run a
// device process (edgefence-devsim, the C device efsdev) on a broker: it
// publishes thermostat set commands on the devices' command topics, as the
// agent's commander does (QoS 1, the ack topic as response topic, the
// command id as correlation data), and collects every ack.
type Commander struct {
	Client *mqtt.Client // a clean-session client, closed when the test ends
	Topics mqtt.Topics
	acks   chan fence.Ack
}

// NewCommander dials url as client "commander" and subscribes to every
// device's ack topic under topics.
func NewCommander(t testing.TB, url string, topics mqtt.Topics) *Commander {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := DialTest(t, url, "commander")
	k := &Commander{Client: c, Topics: topics, acks: make(chan fence.Ack, 64)}
	c.Subscribe(topics.AllAck(), func(m mqtt.Message) {
		if a, err := fence.UnmarshalAck(m.Payload); err == nil {
			k.acks <- *a
		}
	})
	if err := c.AwaitSubscribed(ctx); err != nil {
		t.Fatal(err)
	}
	return k
}

// DialTest dials a clean-session client that is closed when the test ends.
func DialTest(t testing.TB, url, clientID string) *mqtt.Client {
	t.Helper()
	c, err := mqtt.Dial(context.Background(), mqtt.Config{Brokers: []string{url}, ClientID: clientID, CleanStart: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c.Close(ctx)
	})
	return c
}

// Send publishes a set command and waits for its ack.
func (k *Commander) Send(t testing.TB, dev string, token fence.Token, seq uint64, set sim.SetBody) fence.Ack {
	t.Helper()
	return k.Await(t, k.Publish(t, dev, token, seq, set))
}

// CommandID is the id Publish gives the command (token, seq) to dev.
func CommandID(dev string, token fence.Token, seq uint64) string {
	return fmt.Sprintf("%s-%d-%d", dev, token, seq)
}

// Publish sends a set command (holder gw-test) and returns its id.
func (k *Commander) Publish(t testing.TB, dev string, token fence.Token, seq uint64, set sim.SetBody) string {
	t.Helper()
	body, err := set.Encode()
	if err != nil {
		t.Fatal(err)
	}
	id := CommandID(dev, token, seq)
	raw, err := fence.MarshalEnvelope(&fence.Envelope{V: fence.Version, Device: dev, Token: token, Seq: seq,
		ID: id, Kind: sim.KindSet, Body: body, Holder: "gw-test"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := k.Client.Publish(ctx, mqtt.Message{Topic: k.Topics.Cmd(dev), Payload: raw, ResponseTopic: k.Topics.Ack(dev),
		CorrelationData: []byte(id)}); err != nil {
		t.Fatal(err)
	}
	return id
}

// Await returns the next ack for command id, skipping others.
func (k *Commander) Await(t testing.TB, id string) fence.Ack {
	t.Helper()
	timeout := time.After(15 * time.Second)
	for {
		select {
		case a := <-k.acks:
			if a.ID == id {
				return a
			}
		case <-timeout:
			t.Fatalf("no ack for %s", id)
		}
	}
}

// AwaitResending is Await for a command left in flight by a kill: like the
// agent, it publishes the same command again every 2 s until an ack comes
// (the broker's redelivery to the restarted process can lag on a loaded
// machine, and libmosquitto acknowledges a QoS 1 message to the broker
// before its callback runs, so a command a kill caught there is not
// redelivered at all; the fence answers a repeat of an applied command as
// a duplicate, so a resend never applies twice).
func (k *Commander) AwaitResending(t testing.TB, dev string, tok fence.Token, seq uint64, set sim.SetBody) fence.Ack {
	t.Helper()
	id := CommandID(dev, tok, seq)
	deadline := time.After(60 * time.Second)
	resend := time.NewTicker(2 * time.Second)
	defer resend.Stop()
	for {
		select {
		case a := <-k.acks:
			if a.ID == id {
				return a
			}
		case <-resend.C:
			k.Publish(t, dev, tok, seq, set)
		case <-deadline:
			t.Fatalf("no ack for %s", id)
		}
	}
}

// AppliedOnce checks a device process's verdict log after kills and
// restarts: no mark accepted twice, and a Stale verdict only for a command
// at or below the mark (a redelivery held back until a newer command moved
// the mark on: refused, never applied again). It returns how many commands
// were answered Duplicate and Stale, and how many accepted lines it read
// (a kill between the commit and the log's write loses the line, not the
// effect).
func AppliedOnce(recs []sim.VerdictRecord) (dups, late, accepted int, err error) {
	seen := map[fence.Mark]bool{}
	for _, r := range recs {
		m := fence.Mark{Token: r.Token, Seq: r.Seq}
		switch r.Verdict {
		case fence.Accepted:
			if seen[m] {
				return dups, late, len(seen), fmt.Errorf("%v accepted twice", m)
			}
			seen[m] = true
		case fence.Duplicate:
			dups++
		case fence.Stale:
			if r.MaxToken < r.Token || (r.MaxToken == r.Token && r.LastSeq < r.Seq) {
				return dups, late, len(seen), fmt.Errorf("stale verdict for a command above the mark: %+v", r)
			}
			late++
		default:
			return dups, late, len(seen), fmt.Errorf("unexpected verdict: %+v", r)
		}
	}
	return dups, late, len(seen), nil
}
