package agent

import (
	"context"
	"testing"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"

	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/internal/mochihold"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// TestLateAckRecordsFirstVerdict: a device whose ack reaches the agent
// only after the worker's first wait for it ended (held at the broker
// until the worker counted no ack, then released while it waits to
// resend) has that first verdict recorded — accepted —, waited for on the
// worker's goroutine and parked alike: the transport kept the late ack,
// and the resend is answered by it. Before, the late ack was dropped ("ack
// for no pending command") and the resend's answer, duplicate, recorded.
func TestLateAckRecordsFirstVerdict(t *testing.T) {
	for _, parked := range []bool{false, true} {
		t.Run(map[bool]string{false: "waiting", true: "parked"}[parked], func(t *testing.T) {
			if parked {
				parkEverySend(t)
			}
			const dev = "dev-late"
			topics := mqtt.Topics{Prefix: "bench"}
			var hold *mochihold.Hold
			br, err := sandbox.StartBroker(sandbox.BrokerConfig{Setup: func(srv *mochi.Server) (err error) {
				hold, err = mochihold.Add(srv, topics.Ack(dev), 1)
				return err
			}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { br.Close() })
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			fresh := mqtt.Config{CleanStart: true, SessionExpiry: -1}
			f, err := sim.NewFleet(ctx, sim.FleetConfig{Devices: []string{dev}, DataDir: t.TempDir(), Broker: br.URL(),
				Prefix: topics.Prefix, ClientID: "late-fleet", MQTT: fresh})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { f.Close(context.Background()) })
			if err := f.AwaitReady(ctx); err != nil {
				t.Fatal(err)
			}
			mc := fresh
			mc.Brokers, mc.ClientID = []string{br.URL()}, "late-agent"
			cmdr, err := mqtt.NewCommander(ctx, mc, topics, []string{dev})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cmdr.Close(context.Background()) })
			if err := cmdr.Client().AwaitSubscribed(ctx); err != nil {
				t.Fatal(err)
			}
			a := startBenchAgent(t, []string{dev}, cmdr, br.URL(), nil)
			waitHeld(t, a, 1)
			released := make(chan error, 1)
			go func() {
				for a.delivery.stats.noAck.Load() == 0 && ctx.Err() == nil {
					time.Sleep(time.Millisecond)
				}
				released <- hold.Release() // the worker's first wait ended: it sleeps before the resend
			}()
			ack, err := a.Send(ctx, dev, sim.KindPing, nil)
			if err != nil || ack.Verdict != fence.Accepted {
				t.Fatalf("Send: %+v %v, want the device's first verdict, accepted", ack, err)
			}
			if err := <-released; err != nil {
				t.Fatal(err)
			}
			if n, _ := hold.Held(); n != 0 {
				t.Fatal("the ack was never held")
			}
			r, err := a.outbox.Get(ack.ID)
			if err != nil || r.State != fence.Accepted {
				t.Fatalf("recorded %+v %v, want accepted", r, err)
			}
			c := a.Status().Counters
			if c.Accepted != 1 || c.Duplicate != 0 || c.NoAck == 0 {
				t.Errorf("counters %+v: want 1 accepted, no duplicate, a wait that ended without an ack", c)
			}
			if st := cmdr.Status(); st["acks_late"].(uint64) != 1 {
				t.Errorf("transport %v: want one late ack kept", st)
			}
		})
	}
}
