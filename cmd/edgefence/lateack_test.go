package main

import (
	"context"
	"testing"
	"time"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/internal/mochihold"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// TestLateAckRecordsFirstVerdict: the first verdict a device gives is the
// one recorded (invariant I9), also when its ack comes after the agent's
// first wait for it ended. The device's ack is held at the broker — a slow
// link, as when a home gateway's Modbus write needed a bus retry — until
// `edgefence run` logs that it had no verdict in time and will resend,
// then released while the agent waits to resend: `edgefence send` prints
// accepted, the outbox records accepted (before: the late ack was dropped,
// "ack for no pending command", and the resend's duplicate was recorded),
// the device applied the command once, and the transport counts the late
// ack it kept.
func TestLateAckRecordsFirstVerdict(t *testing.T) {
	e := newEnv(t, "dev-1")
	cfg, sock := e.config("gw-1", 30*time.Second)
	a := e.startAgent("gw-1", cfg)
	e.waitHolding(a, sock)
	hold, err := mochihold.Add(e.world.Broker.Server(), mqtt.Topics{}.Ack("dev-1"), 1)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	released := make(chan error, 1)
	go func() {
		if err := a.WaitLine(ctx, "no verdict yet; command stays queued and will be resent"); err != nil {
			released <- err
			return
		}
		released <- hold.Release()
	}()
	r := edgefence(t, "send", "--json", "--socket", sock, "dev-1", "set", `{"setpoint":1}`)
	res := sendResult(t, r)
	if err := <-released; err != nil {
		t.Fatal(err)
	}
	if r.code != 0 || res.Verdict != "accepted" {
		t.Fatalf("send: %+v, want the device's first verdict, accepted\n%s", res, r)
	}
	l := outboxList(t, sock)
	if len(l.Records) != 1 || l.Records[0].ID != res.ID || l.Records[0].State != fence.Accepted {
		t.Fatalf("outbox: %+v, want %s accepted", l.Records, res.ID)
	}
	if m, err := e.fleet.Mark("dev-1"); err != nil || m.Seq != 1 {
		t.Fatalf("device mark %+v %v, want seq 1 (applied once)", m, err)
	}
	st, r := status(t, sock)
	if st == nil || st.Counters.Accepted != 1 || st.Counters.Duplicate != 0 || st.Counters.NoAck == 0 {
		t.Fatalf("counters: %+v\n%s", st, r)
	}
	if late, _ := st.Transport["acks_late"].(float64); late != 1 {
		t.Errorf("transport %v: want acks_late 1", st.Transport)
	}
}
