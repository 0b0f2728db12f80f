package bridge

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/fence/auth/authtest"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// epochRig is a rig whose bridge verifies signatures with a Trust learned
// over the air (the root only, as provisioned), its ledger in the table's
// file, and a gateway key the operator certified.
type epochRig struct {
	*rig
	op       *authtest.Operator
	gw       *authtest.Gateway
	path     string
	requests int
}

func newEpochRig(t *testing.T) *epochRig {
	op := authtest.NewOperator(t)
	return &epochRig{rig: newRig(t), op: op, gw: op.Certify("gw-a", "plc-*"), path: filepath.Join(t.TempDir(), "fence.db")}
}

func (r *epochRig) start(cfg Config) (*Bridge, *fence.Table, func()) {
	r.t.Helper()
	tbl, err := fence.OpenTable(r.path, nil)
	if err != nil {
		r.t.Fatal(err)
	}
	cfg.Table, cfg.Keys, cfg.TrustDB = tbl, r.op.Trust(), tbl.Bolt()
	br, stop := r.startBridgeWith(cfg)
	return br, tbl, stop
}

// request publishes raw on plc-1's command topic as its own client and
// returns the ack naming id.
func (r *epochRig) request(raw []byte, id string) *fence.Ack {
	r.t.Helper()
	r.requests++
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, err := mqtt.Request(ctx, mqtt.Config{Brokers: []string{r.broker.URL()}, ClientID: fmt.Sprintf("operator-%d", r.requests)}, r.topics, "plc-1", raw, id)
	if err != nil {
		r.t.Fatal(err)
	}
	return a
}

// signedWrite is a write in epoch e signed by the certified gateway.
func (r *epochRig) signedWrite(e uint64, tok fence.Token, seq uint64, value uint16) ([]byte, string) {
	r.t.Helper()
	env := r.writeEnv(e, tok, seq, value)
	raw, err := r.gw.Signer.Sign(env)
	if err != nil {
		r.t.Fatal(err)
	}
	return raw, env.ID
}

func (r *epochRig) publish(stmts ...[]byte) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := r.cmdr.Client().Publish(ctx, mqtt.Message{Topic: r.topics.Cmd("plc-1"), Payload: authtest.Update(r.t, stmts...)}); err != nil {
		r.t.Fatal(err)
	}
}

// A reset closes the past at the gateway fence: a signed write captured at
// token T, replayed after a reset (an epoch raise) to a mark below T, is
// refused stale before the wire (the register and the table's mark
// unchanged), also after a restart; then a fleet epoch statement arrives in
// a trust update and closes the reset's epoch too, while a write of the new
// epoch with a low token (etcd rebuilt) reaches the device, and one of an
// epoch the table holds no statement of is refused invalid as
// auth.NeedsTrust knows. On the code before epochs the replay was written
// to the device (issue 29, failure 4).
func TestEpochAtTheGateway(t *testing.T) {
	r := newEpochRig(t)
	_, tbl, stop := r.start(Config{})
	r.publish(r.gw.Cert)
	r.cmdr.SignWith(r.gw.Signer.Sign)
	captured, capturedID := r.signedWrite(0, 900, 1, 666)
	if a := r.request(captured, capturedID); a.Verdict != fence.Accepted {
		t.Fatalf("captured: %+v", a)
	}
	if a := r.writeIn(0, 1000, 1, 100); a.Verdict != fence.Accepted {
		t.Fatalf("%+v", a)
	}
	to := fence.State{Epoch: 7, Mark: fence.Mark{Token: 50, Seq: math.MaxUint64}}
	reset := r.op.Reset(auth.Reset{Device: "plc-1", Token: 50, Seq: math.MaxUint64, Counter: 1, ID: "reset:r", Epoch: 7})
	if a := r.request(reset, "reset:r"); a.Verdict != fence.Accepted || a.State() != to {
		t.Fatalf("reset: %+v", a)
	}
	replay := func(tbl *fence.Table) {
		t.Helper()
		a := r.request(captured, capturedID)
		if a.Verdict != fence.Stale || a.Reason != "epoch 0 closed: the fence point is at epoch 7" || a.State() != to {
			t.Fatalf("replayed pre-reset write: %+v", a)
		}
		if rec, _, err := tbl.Get("plc-1"); err != nil || rec.Epoch != 7 || rec.Mark != to.Mark {
			t.Fatalf("table %+v %v", rec, err)
		}
		if v := r.register(); v != 100 {
			t.Fatalf("register %d: the replay reached the device", v)
		}
	}
	replay(tbl)
	stop()
	_, tbl, _ = r.start(Config{})
	replay(tbl)
	if a := r.writeIn(7, 60, 1, 101); a.Verdict != fence.Accepted || a.Epoch != 7 {
		t.Fatalf("the holder in epoch 7: %+v", a)
	}

	// Etcd rebuilt: the operator's fleet epoch 9, low tokens.
	if a := r.writeIn(9, 3, 1, 102); a.Verdict != fence.Invalid || !auth.NeedsTrust(a) || a.Reason != "unknown epoch 9: the fence point is at epoch 7" {
		t.Fatalf("epoch 9 before its statement: %+v", a)
	}
	r.publish(r.op.Epoch(9))
	if a := r.writeIn(7, 61, 1, 666); a.Verdict != fence.Stale || a.Epoch != 9 {
		t.Fatalf("epoch 7 after the fleet's epoch 9: %+v", a)
	}
	if a := r.writeIn(9, 3, 1, 102); a.Verdict != fence.Accepted || a.State() != (fence.State{Epoch: 9, Mark: fence.Mark{Token: 3, Seq: 1}}) {
		t.Fatalf("epoch 9, token 3: %+v", a)
	}
	if v := r.register(); v != 102 {
		t.Fatalf("register %d", v)
	}
	// A reset must be above the fleet epoch.
	low := r.op.Reset(auth.Reset{Device: "plc-1", Token: 1, Seq: 1, Counter: 2, ID: "reset:low", Epoch: 8})
	if a := r.request(low, "reset:low"); a.Verdict != fence.Invalid || a.Epoch != 9 {
		t.Fatalf("reset in epoch 8 at fleet epoch 9: %+v", a)
	}
}

// An `auth: off` device at a gateway table ignores the fleet epoch: its
// plain commands of epoch 0 go on after the trust brought epoch 9, and
// its epoch is its last reset's.
func TestEpochAuthOffAtTheGateway(t *testing.T) {
	r := newEpochRig(t)
	r.start(Config{Devices: []Device{{AuthOff: true}}})
	r.publish(r.op.Epoch(9))
	if a := r.write(5, 1, 50); a.Verdict != fence.Accepted || a.Epoch != 0 {
		t.Fatalf("plain write of epoch 0 after the fleet's epoch 9: %+v", a)
	}
	reset := r.op.Reset(auth.Reset{Device: "plc-1", Token: 4, Seq: math.MaxUint64, Counter: 1, ID: "reset:off", Epoch: 2})
	if a := r.request(reset, "reset:off"); a.Verdict != fence.Accepted || a.Epoch != 2 {
		t.Fatalf("reset in epoch 2: %+v", a)
	}
	if a := r.write(5, 2, 51); a.Verdict != fence.Stale {
		t.Fatalf("epoch 0 after the reset: %+v", a)
	}
	if a := r.writeIn(2, 5, 2, 52); a.Verdict != fence.Accepted {
		t.Fatalf("epoch 2: %+v", a)
	}
}

// A write admitted before a reset and still queued behind the device's
// current command is not written to the device after the reset closed its
// epoch: it is answered stale.
func TestEpochQueuedBeforeReset(t *testing.T) {
	r := newEpochRig(t)
	hold, release := make(chan struct{}), make(chan struct{})
	first := true
	_, tbl, _ := r.start(Config{Devices: []Device{{AuthOff: true}}, beforeWire: func(env *fence.Envelope) {
		if first {
			first = false
			close(hold)
			<-release
		}
	}})
	type result struct{ a *fence.Ack }
	results := make(chan result, 2)
	go func() { results <- result{r.write(7, 1, 100)} }()
	<-hold // the first write is on its way to the wire
	queued := r.writeEnv(0, 7, 2, 666)
	go func() { results <- result{r.send(queued)} }()
	// Wait until the second is admitted (queued): the table holds it.
	deadline := time.Now().Add(30 * time.Second)
	for {
		rec, _, err := tbl.Get("plc-1")
		if err == nil && rec.Mark == (fence.Mark{Token: 7, Seq: 2}) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("second write never admitted: %+v %v", rec, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	reset := r.op.Reset(auth.Reset{Device: "plc-1", Token: 6, Seq: math.MaxUint64, Counter: 1, ID: "reset:q", Epoch: 1})
	if a := r.request(reset, "reset:q"); a.Verdict != fence.Accepted {
		t.Fatalf("reset: %+v", a)
	}
	close(release)
	got := map[uint64]fence.Verdict{}
	for range 2 {
		res := <-results
		got[res.a.Seq] = res.a.Verdict
	}
	if got[1] != fence.Accepted || got[2] != fence.Stale {
		t.Fatalf("verdicts %v: want the first accepted, the queued one stale", got)
	}
	if v := r.register(); v != 100 {
		t.Fatalf("register %d: the queued write of the closed epoch reached the device", v)
	}
}
