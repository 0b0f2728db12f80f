package bridge

import (
	"context"
	"encoding/json"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// A legacy device that speaks plain MQTT: it applies whatever arrives on its
// topics and acks nothing. The home gateway's table refuses the stale
// holder's command before it is published to the device.
func TestMQTTLinkDevice(t *testing.T) {
	r := newRig(t)
	var mu sync.Mutex
	var got []string
	dev, err := mqtt.Dial(context.Background(), mqtt.Config{Brokers: []string{r.broker.URL()}, ClientID: "plain-device", CleanStart: true,
		Subscriptions: []mqtt.Subscription{{Filter: "site/meter-3/#", Handler: func(m mqtt.Message) {
			mu.Lock()
			got = append(got, m.Topic+" "+string(m.Payload))
			mu.Unlock()
		}}}})
	if err != nil {
		t.Fatal(err)
	}
	defer closeCtx(dev.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := dev.AwaitSubscribed(ctx); err != nil {
		t.Fatal(err)
	}

	tbl, err := fence.OpenTable(filepath.Join(t.TempDir(), "fence.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tbl.Close()
	br, err := New(Config{Table: tbl, Topics: r.topics, Devices: []Device{{ID: "meter-3", Topic: "site/meter-3"}}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := mqtt.Dial(context.Background(), mqtt.Config{Brokers: []string{r.broker.URL()}, ClientID: "home-m", CleanStart: true, Subscriptions: br.Subscriptions()})
	if err != nil {
		t.Fatal(err)
	}
	defer closeCtx(c.Close)
	if err := c.AwaitSubscribed(ctx); err != nil {
		t.Fatal(err)
	}
	if err := br.Start(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	cmdr, err := mqtt.NewCommander(context.Background(), mqtt.Config{Brokers: []string{r.broker.URL()}, ClientID: "holder-m", CleanStart: true},
		r.topics, []string{"meter-3"})
	if err != nil {
		t.Fatal(err)
	}
	defer closeCtx(cmdr.Close)
	// The ack subscription must be in place before the first command, or
	// its ack is published to nobody.
	if err := awaitSubscribed(cmdr); err != nil {
		t.Fatal(err)
	}
	send := func(tok fence.Token, seq uint64, kind string, v any) *fence.Ack {
		body, err := fence.EncodeBody(v)
		if err != nil {
			t.Fatal(err)
		}
		ack, err := cmdr.Send(ctx, &fence.Envelope{V: fence.Version, Device: "meter-3", Token: tok, Seq: seq,
			ID: "m" + itoa(int(tok)) + "-" + itoa(int(seq)), Kind: kind, Body: body})
		if err != nil {
			t.Fatal(err)
		}
		return ack
	}
	if a := send(7, 1, "set", map[string]any{"limit": 100}); a.Verdict != fence.Accepted {
		t.Fatalf("A: %+v", a)
	}
	if a := send(9, 1, "set", map[string]any{"limit": 200}); a.Verdict != fence.Accepted {
		t.Fatalf("B: %+v", a)
	}
	if a := send(7, 2, "set", map[string]any{"limit": 999}); a.Verdict != fence.Stale {
		t.Fatalf("A late: %+v", a)
	}
	if a := send(9, 2, "a/b", map[string]any{"limit": 1}); a.Verdict != fence.Invalid {
		t.Fatalf("kind with a slash: %+v", a)
	}
	// B's last command reached the device before its ack; the device has
	// exactly A's first and B's command.
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n >= 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{`site/meter-3/set {"limit":100}`, `site/meter-3/set {"limit":200}`}
	if b, _ := json.Marshal(got); string(b) != mustJSON(want) {
		t.Fatalf("device got %q, want %q", got, want)
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
