package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// TestDevsimCredentials: on a broker that requires credentials and applies
// deploy/mosquitto's rules, devsim logs in with --mqtt-user and the
// password from $EDGEFENCE_MQTT_PASSWORD or --mqtt-password-file and serves
// its device; with a wrong password it is refused and never ready.
func TestDevsimCredentials(t *testing.T) {
	const prefix = mqtt.DefaultPrefix
	auth, err := sandbox.NewBrokerAuth(sandbox.DeviceACL(prefix) + sandbox.GatewayACL(prefix, "gw-1"))
	if err != nil {
		t.Fatal(err)
	}
	devPass, err := auth.User("dev-1")
	if err != nil {
		t.Fatal(err)
	}
	gwPass, err := auth.User("gw-1")
	if err != nil {
		t.Fatal(err)
	}
	b, err := sandbox.StartBroker(sandbox.BrokerConfig{Auth: auth})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })

	t.Setenv(envMQTTPassword, "wrong")
	bad := startDevsim(t, "--mqtt", b.URL(), "--devices", "dev-1", "--dir", t.TempDir(), "--mqtt-user", "dev-1", "--client-id", "bad")
	deadline := time.Now().Add(30 * time.Second)
	for auth.Refused() == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case <-bad.ready:
		t.Fatalf("ready with a wrong password:\n%s", bad.log())
	default:
	}
	if auth.Refused() == 0 {
		t.Fatalf("the broker refused nobody:\n%s", bad.log())
	}
	bad.stop(t, os.Interrupt)

	pf := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(pf, []byte(devPass+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	vlog := filepath.Join(t.TempDir(), "verdicts.jsonl")
	d := startDevsim(t, "--mqtt", b.URL(), "--devices", "dev-1", "--dir", t.TempDir(), "--log", vlog,
		"--mqtt-user", "dev-1", "--mqtt-password-file", pf)
	d.awaitReady(t)
	if !strings.Contains(d.log(), "user=dev-1") {
		t.Errorf("ready line does not name the user:\n%s", d.log())
	}

	// The gateway's command reaches the device and its ack comes back.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	topics := mqtt.Topics{Prefix: prefix}
	gw, err := mqtt.NewCommander(ctx, mqtt.Config{Brokers: []string{b.URL()}, ClientID: "gw-1", CleanStart: true,
		Username: "gw-1", Password: []byte(gwPass)}, topics, []string{"dev-1"})
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close(context.Background())
	if err := gw.Client().AwaitSubscribed(ctx); err != nil { // else the ack may reach nobody
		t.Fatal(err)
	}
	body, err := sim.SetBody{Setpoint: ptr(22.0)}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	ack, err := gw.Send(ctx, &fence.Envelope{V: fence.Version, Device: "dev-1", Token: 7, Seq: 1, ID: "c1", Kind: sim.KindSet, Body: body, Holder: "gw-1"})
	if err != nil {
		t.Fatal(err)
	}
	if ack.Verdict != fence.Accepted {
		t.Fatalf("ack %+v", ack)
	}
	d.stop(t, os.Interrupt)
	if recs := readVerdictLog(t, vlog); len(recs) != 1 || recs[0].ID != "c1" {
		t.Fatalf("verdicts %+v", recs)
	}
}
