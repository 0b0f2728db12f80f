package agent

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/bbolt"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgefence/edgefence/devices/shim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/fence/auth/authtest"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/offline"
)

// epochRig is an agent commanding d1 behind a real shim provisioned with
// the operator's root only, with its trust and outbox on disk so that it
// can be restarted.
type epochRig struct {
	t      *testing.T
	op     *authtest.Operator
	sh     *shim.Shim
	fp     *signedShim
	cfg    *Config
	cert   []byte // gw-1's certificate
	dir    string
	prefix string
	close  func() // stops the agent started last and closes its files
	// etcd, if set, is the rig's own etcd (else the package's), and
	// repubEvery the agent's republisher's look interval there.
	etcd       *sandbox.Etcd
	repubEvery time.Duration
}

func newEpochRig(t *testing.T, reissue ...string) *epochRig {
	t.Helper()
	op := authtest.NewOperator(t)
	gw := op.Certify("gw-1", "d*")
	sh, err := shim.Open(filepath.Join(t.TempDir(), "dev.db"), &shim.Options{Keys: op.Trust()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sh.Close() })
	r := &epochRig{t: t, op: op, sh: sh, fp: &signedShim{gw: gw.Signer, shim: sh}, cert: gw.Cert, dir: t.TempDir(), prefix: "/t/" + t.Name()}
	r.cfg = &Config{Gateway: "gw-1", Etcd: EtcdConfig{Endpoints: testEtcd.Endpoints(), Prefix: r.prefix, LeaseTTL: 2 * time.Second},
		MQTT: MQTTConfig{Brokers: []string{"mqtt://127.0.0.1:1"}}, Command: CommandConfig{Timeout: 10 * time.Second},
		Auth: siteAuth(t, op, gw, "gw-1"), Devices: []DeviceConfig{{ID: "d1", Auth: AuthRequired, ReissueKinds: reissue}}}
	return r
}

// start runs the agent on the rig's trust store and outbox.
func (r *epochRig) start() *testAgent {
	r.t.Helper()
	db, err := bbolt.Open(filepath.Join(r.dir, "trust.db"), 0o600, &bbolt.Options{Timeout: time.Second})
	if err != nil {
		r.t.Fatal(err)
	}
	ob, err := offline.Open(filepath.Join(r.dir, offline.File), nil)
	if err != nil {
		r.t.Fatal(err)
	}
	cfg := *r.cfg
	cli := etcdClient(r.t)
	if r.etcd != nil {
		if cli, err = r.etcd.Client(); err != nil {
			r.t.Fatal(err)
		}
		r.t.Cleanup(func() { cli.Close() })
	}
	na, err := newAgent(r.t, &cfg, cli, r.fp, Options{Outbox: ob, TrustDB: db,
		TrustUpdates: &TrustUpdates{Certificate: r.cert, Publisher: r.fp}})
	if err != nil {
		r.t.Fatal(err)
	}
	if r.repubEvery > 0 {
		na.repub.every = r.repubEvery
	}
	a := runStarted(r.t, na)
	a.cli = cli
	r.t.Cleanup(func() { ob.Close(); db.Close() })
	r.close = func() { a.stop(); ob.Close(); db.Close() }
	waitFor(r.t, "holding d1", holdingAll(a, []string{"d1"}))
	return a
}

// send sends one command and returns its ack.
func (r *epochRig) send(a *testAgent) *fence.Ack {
	r.t.Helper()
	ack, _ := a.Send(r.t.Context(), "d1", "set", nil)
	if ack == nil {
		r.t.Fatal("no ack")
	}
	return ack
}

// TestEpochFleetRecovery: the operator's epoch statement in etcd moves the
// agent's `auth: required` devices to the new epoch: its next command
// carries it, the device learns the statement from the trust update that
// goes first, and a signed envelope captured before — replayed at the
// device — is refused stale, its epoch closed. The epoch survives the
// agent's restart (trust.db).
func TestEpochFleetRecovery(t *testing.T) {
	r := newEpochRig(t)
	a := r.start()
	if ack := r.send(a); ack.Verdict != fence.Accepted || ack.Epoch != 0 {
		t.Fatalf("before: %+v", ack)
	}
	captured := r.fp.sent[len(r.fp.sent)-1]

	stmt, err := r.op.Root.Epoch(5, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.cli.Put(t.Context(), TrustEpochKey(r.prefix), string(stmt)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "d1 in epoch 5", func() bool { return a.Status().Devices[0].Epoch == 5 })
	ack := r.send(a)
	if ack.Verdict != fence.Accepted || ack.Epoch != 5 {
		t.Fatalf("in epoch 5: %+v", ack)
	}
	replay := r.sh.Handle("d1", captured, acceptAll{})
	if replay.Verdict != fence.Stale || !strings.Contains(replay.Reason, "epoch 0 closed") {
		t.Fatalf("the captured envelope replayed: %+v", replay)
	}

	r.close()
	a = r.start()
	if e := a.Status().Devices[0].Epoch; e != 5 {
		t.Fatalf("after a restart: epoch %d", e)
	}
	if ack := r.send(a); ack.Verdict != fence.Accepted || ack.Epoch != 5 {
		t.Fatalf("after a restart: %+v", ack)
	}
}

// TestEpochAfterEtcdWipe: etcd is wiped under a running agent — its
// revisions start again far below those the agent's watches had reached —
// and the operator publishes the fleet's epoch statement to the rebuilt
// etcd, the runbook's recovery of a signed fleet. Meanwhile another
// session (an etcdctl lock) queued first for the device, so the agent's
// campaign waits for its key to go. The running agent learns the
// statement, and sees the other key go: the republisher's sight of the
// lost data makes the trust follower read etcd again and the lock queue
// watch start again from etcd's revision now. Its device moves to the new
// epoch and is commanded again with a token of the rebuilt etcd, no
// restart. Before, both watches resumed at the old revision and saw
// nothing until the new etcd passed it: the statement never came, and the
// campaign waited for ever (only a restart recovered the device).
func TestEpochAfterEtcdWipe(t *testing.T) {
	e, err := sandbox.StartEtcd(t.Context(), sandbox.EtcdConfig{Dir: t.TempDir(), Fast: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() }) // after the agent has stopped
	r := newEpochRig(t)
	r.etcd, r.repubEvery = e, 50*time.Millisecond
	r.cfg.Etcd.Endpoints = []string{e.Endpoint()}
	cli, err := e.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	for range 300 { // an etcd that has run a while: tokens well above a new one's revisions
		if _, err := cli.Put(t.Context(), "/aged", "x"); err != nil {
			t.Fatal(err)
		}
	}
	a := r.start()
	if ack := r.send(a); ack.Verdict != fence.Accepted || ack.Epoch != 0 {
		t.Fatalf("before: %+v", ack)
	}
	if err := e.Wipe(t.Context()); err != nil {
		t.Fatal(err)
	}
	blocker := a.LockPrefix("d1") + "/maintenance"
	if _, err := cli.Put(t.Context(), blocker, ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the agent queued behind the other session", func() bool {
		resp, err := cli.Get(t.Context(), a.LockPrefix("d1")+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && resp.Count == 2
	})
	stmt, err := r.op.Root.Epoch(5, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(t.Context(), TrustEpochKey(r.prefix), string(stmt)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "d1 in epoch 5", func() bool { return a.Status().Devices[0].Epoch == 5 })
	if _, err := cli.Delete(t.Context(), blocker); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "d1 held in epoch 5", func() bool {
		d := a.Status().Devices[0]
		return d.Epoch == 5 && d.State == StateHolding
	})
	if ack := r.send(a); ack.Verdict != fence.Accepted || ack.Epoch != 5 {
		t.Fatalf("in epoch 5: %+v", ack)
	}
}

// TestEpochFromReset: an operator's reset puts the device in an epoch of
// its own. The agent's next command, of the epoch before, is refused
// stale ("epoch closed") — not a deposition: the agent keeps the lock,
// takes the device's epoch from the answer, and queues the command again
// in it (reissue_kinds), where it is accepted.
func TestEpochFromReset(t *testing.T) {
	r := newEpochRig(t, "set")
	a := r.start()
	if ack := r.send(a); ack.Verdict != fence.Accepted {
		t.Fatalf("before: %+v", ack)
	}
	token, _ := a.Holding("d1")
	reset, err := r.op.Root.Reset(auth.Reset{Device: "d1", Token: 1, Seq: 1, Counter: 1, ID: "reset:1", Epoch: 9})
	if err != nil {
		t.Fatal(err)
	}
	if res := r.sh.Process("d1", reset, acceptAll{}); res.Ack.Verdict != fence.Accepted {
		t.Fatalf("reset: %+v", res.Ack)
	}
	if ack := r.send(a); ack.Verdict != fence.Stale || ack.Epoch != 9 {
		t.Fatalf("after the reset: %+v", ack)
	}
	waitFor(t, "the reissued command accepted in epoch 9", func() bool {
		recs, err := a.outbox.List(offline.Filter{Device: "d1"})
		return err == nil && len(recs) == 3 && recs[2].State == fence.Accepted && recs[2].Ack.Epoch == 9
	})
	if now, _ := a.Holding("d1"); now != token {
		t.Fatalf("token %d after the reset, want the lock kept (%d)", now, token)
	}
	if e := a.Status().Devices[0].Epoch; e != 9 {
		t.Fatalf("epoch %d", e)
	}
}

// TestStaleOfClosedEpochInFlight: etcd was rebuilt, so the device's mark
// (epoch 0) is far above the tokens etcd grants now, and the operator's
// epoch statement moves the agent to epoch 5 while a command of epoch 0 is
// out. Its stale answer, which comes after the move, is of the closed
// epoch: it neither deposes the holder nor sets the token guard of the new
// epoch, and the next command — after the trust update with the statement
// — is accepted in epoch 5. Before, that late answer set the guard to the
// old mark and both gateways refused the device for ever.
func TestStaleOfClosedEpochInFlight(t *testing.T) {
	r := newEpochRig(t)
	up, err := auth.MarshalUpdate([][]byte{r.cert})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.fp.PublishTrust(t.Context(), "d1", up); err != nil {
		t.Fatal(err)
	}
	const old = fence.Token(1 << 40) // a holder's token before the rebuild
	raw, err := r.fp.gw.Sign(&fence.Envelope{V: fence.Version, Device: "d1", Token: old, Seq: 1, ID: "before-the-rebuild", Kind: "set", Holder: "gw-0"})
	if err != nil {
		t.Fatal(err)
	}
	if ack := r.sh.Handle("d1", raw, acceptAll{}); ack.Verdict != fence.Accepted {
		t.Fatalf("the mark before the rebuild: %+v", ack)
	}
	moved := make(chan struct{})
	r.fp.hold = func(env *fence.Envelope) {
		if env.Epoch == 0 && env.Token < old {
			<-moved
		}
	}
	a := r.start()
	first := make(chan *fence.Ack, 1)
	go func() {
		ack, _ := a.Send(t.Context(), "d1", "set", nil)
		first <- ack
	}()
	waitFor(t, "the command of epoch 0 at the device", func() bool {
		r.fp.mu.Lock()
		defer r.fp.mu.Unlock()
		return len(r.fp.sent) > 0
	})
	stmt, err := r.op.Root.Epoch(5, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.cli.Put(t.Context(), TrustEpochKey(r.prefix), string(stmt)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "d1 in epoch 5", func() bool { return a.Status().Devices[0].Epoch == 5 })
	close(moved)
	if ack := <-first; ack == nil || ack.Verdict != fence.Stale || ack.Epoch != 0 {
		t.Fatalf("the command of epoch 0: %+v", ack)
	}
	if ack := r.send(a); ack.Verdict != fence.Accepted || ack.Epoch != 5 {
		t.Fatalf("the next command: %+v; device %+v", ack, a.Status().Devices[0])
	}
}
