package chaos

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/fence/history"
	"github.com/edgefence/edgefence/internal/backoff"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// lateToken is the token of the round's late command signed by a revoked
// key: above any a round reaches, so that only the revocation can refuse
// it (admitted, it would brick the device, and T1 and the liveness check
// would both fail the round).
const lateToken = 1 << 40

// lateEnvelope waits until the first shim device's fence point recorded a
// revocation list naming k (history.OpTrust), then publishes a command
// signed by k to it from gateway gw's broker login: a late or
// replayed command of the revoked key. The device must refuse it; T1
// checks its verdict. A fence point that records no OpTrust (the C
// device) gets none: the check needs the record.
func (r *round) lateEnvelope(ctx context.Context, gw string, k *sandbox.GatewayKey) error {
	dev, kid := r.shimDevs[0], k.KeyID
	if !r.awaitRevocationRecorded(ctx, kid) {
		r.logf("no revocation of %s recorded at the devices' fence point within %v: no late command sent", kid, trustBound)
		return nil
	}
	key, err := auth.ReadKey(k.KeyFile)
	if err != nil {
		return err
	}
	signer, err := auth.NewSigner([]byte(kid), key)
	if err != nil {
		return err
	}
	body, err := sim.SetBody{Setpoint: new(21.0)}.Encode()
	if err != nil {
		return err
	}
	id := fmt.Sprintf("late-%s-%d", kid, time.Now().UnixNano())
	raw, err := signer.Sign(&fence.Envelope{V: fence.Version, Device: dev, Token: lateToken, Seq: 1, ID: id, Kind: sim.KindSet,
		Body: body, Holder: gw})
	if err != nil {
		return err
	}
	pass, err := r.auth.User(gw)
	if err != nil {
		return err
	}
	cl, err := mqtt.Dial(ctx, mqtt.Config{Brokers: []string{r.mqttURL}, ClientID: "late-" + gw, CleanStart: true,
		Username: gw, Password: []byte(pass)})
	if err != nil {
		return err
	}
	defer cl.Close(context.Background())
	if err := cl.AwaitConnection(ctx); err != nil {
		return err
	}
	if err := cl.Publish(ctx, mqtt.Message{Topic: mqtt.Topics{}.Cmd(dev), Payload: raw}); err != nil {
		return err
	}
	r.fault(FaultLate)
	r.logf("late command %s signed by revoked %s sent to %s: %s", id, kid, dev, r.awaitVerdict(ctx, id))
	return nil
}

// awaitRevocationRecorded waits (trustBound) until the shim devices'
// history has an OpTrust naming kid.
func (r *round) awaitRevocationRecorded(ctx context.Context, kid string) bool {
	deadline := time.Now().Add(trustBound)
	for time.Now().Before(deadline) {
		evs, _ := history.Read(r.path("hist-devsim.jsonl"))
		for _, e := range evs {
			if e.Op == history.OpTrust && slices.Contains(e.Revoked, kid) {
				return true
			}
		}
		if !backoff.Sleep(ctx, 200*time.Millisecond) {
			return false
		}
	}
	return false
}

// awaitVerdict returns the shim's verdict on command id, as recorded, or
// a note that none came (bounded).
func (r *round) awaitVerdict(ctx context.Context, id string) string {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		evs, _ := history.Read(r.path("hist-devsim.jsonl"))
		for _, e := range evs {
			if e.Op == history.OpVerdict && e.ID == id {
				return e.Verdict + " " + e.Reason
			}
		}
		if !backoff.Sleep(ctx, 100*time.Millisecond) {
			break
		}
	}
	return "no verdict recorded"
}
