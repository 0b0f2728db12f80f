package shim_test

import (
	"errors"
	"math"
	"path/filepath"
	"testing"

	"github.com/edgefence/edgefence/devices/shim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/fence/auth/authtest"
)

// A reset closes the past at the shim: a signed envelope captured at token
// T, replayed after a reset (an epoch raise) to a mark below T, is refused
// stale with the mark unchanged, also after a reopen; the holder's command
// of the new epoch is accepted. On the code before epochs the replay was
// accepted and raised the mark again (issue 29, failure 4).
func TestEpochResetClosesThePast(t *testing.T) {
	op := authtest.NewOperator(t)
	gw := op.Certify("gw-a", "dev-*")
	path := filepath.Join(t.TempDir(), "fence.db")
	trust := op.Trust()
	if _, err := trust.AddCertificate(gw.Cert); err != nil {
		t.Fatal(err)
	}
	s := open(t, path, &shim.Options{Keys: trust})
	dev := &recorder{}
	send := func(s *shim.Shim, raw []byte) fence.Ack { t.Helper(); return s.Handle("dev-1", raw, dev) }
	captured := signed(t, gw.Signer, cmd("dev-1", 900, 1, "old-setpoint"))
	for _, raw := range [][]byte{signed(t, gw.Signer, cmd("dev-1", 100, 1, "c1")), captured, signed(t, gw.Signer, cmd("dev-1", 1<<62, 1, "forged-high"))} {
		if a := send(s, raw); a.Verdict != fence.Accepted {
			t.Fatalf("%+v", a)
		}
	}
	to := fence.Mark{Token: 50, Seq: math.MaxUint64}
	if a := send(s, op.Reset(auth.Reset{Device: "dev-1", Token: to.Token, Seq: to.Seq, Counter: 1, ID: "reset:r", Epoch: 7})); a.Verdict != fence.Accepted || a.State() != (fence.State{Epoch: 7, Mark: to}) {
		t.Fatalf("reset: %+v", a)
	}
	applied := len(dev.marks())
	replay := func(s *shim.Shim) {
		t.Helper()
		a := send(s, captured)
		if a.Verdict != fence.Stale || a.Reason != "epoch 0 closed: the fence point is at epoch 7" || a.State() != (fence.State{Epoch: 7, Mark: to}) {
			t.Fatalf("replayed pre-reset envelope: %+v", a)
		}
		if st, err := s.State("dev-1"); err != nil || st != (fence.State{Epoch: 7, Mark: to}) || len(dev.marks()) != applied {
			t.Fatalf("state %v %v, %d applied", st, err, len(dev.marks()))
		}
	}
	replay(s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, path, &shim.Options{Keys: trust})
	replay(s)
	next := cmd("dev-1", 60, 1, "c2")
	next.Epoch = 7
	if a := send(s, signed(t, gw.Signer, next)); a.Verdict != fence.Accepted || a.Epoch != 7 {
		t.Fatalf("the holder in epoch 7: %+v", a)
	}
	if r, err := s.LastReset("dev-1"); err != nil || r.Epoch != 7 || r.Counter != 1 {
		t.Fatalf("last reset %+v %v", r, err)
	}
}

// A fleet epoch statement in a trust update closes the past for every
// device of a shim that requires signed commands, whatever their marks: a
// command of an earlier epoch is stale, one of the new epoch with a low
// token (etcd rebuilt) is accepted, one of an epoch the shim has no
// statement of is invalid with the reason auth.NeedsTrust knows; the
// epoch outlives a restart (the ledger), and a reset must be above it.
func TestEpochStatementAtTheShim(t *testing.T) {
	op := authtest.NewOperator(t)
	gw := op.Certify("gw-a", "dev-*")
	path := filepath.Join(t.TempDir(), "fence.db")
	s := open(t, path, &shim.Options{Keys: op.Trust()})
	dev := &recorder{}
	at := func(e uint64, dev string, tok fence.Token, seq uint64) []byte {
		c := cmd(dev, tok, seq, "c")
		c.Epoch = e
		return signed(t, gw.Signer, c)
	}
	if res := s.Process("dev-1", authtest.Update(t, gw.Cert), dev); res.Update == nil || res.Update.Applied != 1 {
		t.Fatalf("certificate: %+v", res)
	}
	captured := at(0, "dev-1", 5000, 1)
	for _, raw := range [][]byte{captured, at(0, "dev-2", 7000, 1)} {
		if a := s.Handle(devOf(t, raw), raw, dev); a.Verdict != fence.Accepted {
			t.Fatalf("%+v", a)
		}
	}
	a := s.Handle("dev-1", at(3, "dev-1", 2, 1), dev)
	if a.Verdict != fence.Invalid || a.Reason != "unknown epoch 3: the fence point is at epoch 0" || !auth.NeedsTrust(&a) {
		t.Fatalf("epoch not held yet: %+v", a)
	}
	if res := s.Process("dev-1", authtest.Update(t, gw.Cert, op.Epoch(3)), dev); res.Update == nil || res.Update.Applied != 1 || res.Update.Held != 1 {
		t.Fatalf("epoch statement: %+v", res.Update)
	}
	check := func(s *shim.Shim) {
		t.Helper()
		for _, d := range []string{"dev-1", "dev-2"} {
			a := s.Handle(d, at(0, d, 1<<40, 1), dev)
			if a.Verdict != fence.Stale || !errors.Is(a.Err(), fence.ErrStale) || a.Epoch != 3 || a.Reason != "epoch 0 closed: the fence point is at epoch 3" {
				t.Fatalf("%s: a command of epoch 0 after the statement: %+v", d, a)
			}
		}
		if a := s.Handle("dev-1", captured, dev); a.Verdict != fence.Stale {
			t.Fatalf("captured: %+v", a)
		}
	}
	check(s)
	if a := s.Handle("dev-1", at(3, "dev-1", 2, 1), dev); a.Verdict != fence.Accepted || a.State() != (fence.State{Epoch: 3, Mark: fence.Mark{Token: 2, Seq: 1}}) {
		t.Fatalf("low token in epoch 3: %+v", a)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, path, &shim.Options{Keys: op.Trust()}) // provisioned with the root only: the ledger brings epoch 3 back
	check(s)
	for _, e := range []uint64{2, 3} {
		if a := s.Handle("dev-2", op.Reset(auth.Reset{Device: "dev-2", Token: 1, Seq: 1, Counter: e, ID: "reset:low", Epoch: e}), dev); a.Verdict != fence.Invalid || a.Epoch != 3 {
			t.Fatalf("reset in epoch %d at fleet epoch 3: %+v", e, a)
		}
	}
	if a := s.Handle("dev-2", op.Reset(auth.Reset{Device: "dev-2", Token: 1, Seq: 1, Counter: 4, ID: "reset:ok", Epoch: 4}), dev); a.Verdict != fence.Accepted || a.Epoch != 4 {
		t.Fatalf("reset in epoch 4: %+v", a)
	}
	// An older statement replayed changes nothing.
	if res := s.Process("dev-1", authtest.Update(t, op.Epoch(2)), dev); res.Update.Refused != 1 {
		t.Fatalf("older statement: %+v", res.Update)
	}
	if st, _ := s.State("dev-1"); st.Epoch != 3 {
		t.Fatalf("epoch %d", st.Epoch)
	}
}

func devOf(t *testing.T, raw []byte) string {
	t.Helper()
	env, err := auth.Peek(raw)
	if err != nil {
		t.Fatal(err)
	}
	return env.Device
}
