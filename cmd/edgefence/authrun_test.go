package main

import (
	"context"
	"testing"
	"time"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// TestSignedCommandsEndToEnd: `edgefence run` with auth.key_file signs
// every command; devices that require signatures accept them; a broker
// client's unsigned forgery with token 2^63 is refused, the device's mark
// unchanged, and the agent's next command is accepted.
func TestSignedCommandsEndToEnd(t *testing.T) {
	e := newSignedWorld(t) // the devices sign their acks: auth: required wants them so
	sock, _ := e.startAgent(t)
	send := func(setpoint string) agent.SendResult {
		t.Helper()
		r := edgefence(t, "send", "--json", "--socket", sock, "dev-1", "set", `{"setpoint":`+setpoint+`}`)
		return sendResult(t, r)
	}
	if res := send("22"); res.Verdict != "accepted" {
		t.Fatalf("signed command: %+v", res)
	}
	before, err := e.fleet.Mark("dev-1")
	if err != nil {
		t.Fatal(err)
	}

	// A broker client forges a plain envelope with token 2^63.
	forged, err := fence.MarshalEnvelope(&fence.Envelope{V: fence.Version, Device: "dev-1", Token: 1 << 63, Seq: 1, ID: "forged",
		Kind: "set", Body: []byte{0xa1, 0x68, 's', 'e', 't', 'p', 'o', 'i', 'n', 't', 0x18, 99}, Holder: "mallory"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	c := dialMallory(t, ctx, e.world.Broker.URL())
	unauth := e.fleet.Stats().Unauthenticated
	if err := c.Publish(ctx, mqtt.Message{Topic: mqtt.Topics{}.Cmd("dev-1"), Payload: forged}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); e.fleet.Stats().Unauthenticated == unauth; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the forgery never reached the device")
		}
	}
	if m, err := e.fleet.Mark("dev-1"); err != nil || m != before {
		t.Fatalf("mark %v after the forgery, want %v (%v)", m, before, err)
	}
	if res := send("23"); res.Verdict != "accepted" {
		t.Fatalf("the holder after the forgery: %+v", res)
	}
}

// dialMallory connects a broker client with no right to speak for anyone
// (the forger) to the broker at url; it disconnects when the test ends.
func dialMallory(t *testing.T, ctx context.Context, url string) *mqtt.Client {
	t.Helper()
	c, err := mqtt.Dial(ctx, mqtt.Config{Brokers: []string{url}, ClientID: "mallory"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	if err := c.AwaitConnection(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}
