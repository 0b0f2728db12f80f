package bridge

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth/authtest"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// TestTrustUpdatesAtTheGateway: the gateway fence, provisioned with the
// operator root only, learns gateway certificates and revocation lists
// from trust updates on its devices' command topics, in order with the
// commands: a holder's signed command is accepted once its update came; a
// newer list makes the table refuse the revoked holder (invalid, mark
// unchanged) and accept another certified one; a forged update changes
// nothing. After a restart (table and bridge reopened, the Trust with the
// root only) the revocation and the learned certificate hold, and an
// older list is refused.
func TestTrustUpdatesAtTheGateway(t *testing.T) {
	op := authtest.NewOperator(t)
	gws := map[string]*authtest.Gateway{"gw-a": op.Certify("gw-a", "plc-*"), "gw-b": op.Certify("gw-b", "plc-*")}

	r := newRig(t)
	publish := func(stmts ...[]byte) {
		t.Helper()
		raw := authtest.Update(t, stmts...)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := r.cmdr.Client().Publish(ctx, mqtt.Message{Topic: r.topics.Cmd("plc-1"), Payload: raw}); err != nil {
			t.Fatal(err)
		}
	}
	as := func(gw string) { r.cmdr.SignWith(gws[gw].Signer.Sign) }
	path := filepath.Join(t.TempDir(), "fence.db")
	start := func() (*Bridge, *fence.Table, func()) {
		tbl, err := fence.OpenTable(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		br, stop := r.startBridgeWith(Config{Table: tbl, Keys: op.Trust(), TrustDB: tbl.Bolt()})
		return br, tbl, stop
	}
	br, tbl, stop := start()

	as("gw-a")
	if a := r.write(7, 1, 100); a.Verdict != fence.Invalid {
		t.Fatalf("before the trust update: %+v", a)
	}
	publish(gws["gw-a"].Cert, op.Revoke(1))
	if a := r.write(7, 1, 100); a.Verdict != fence.Accepted {
		t.Fatalf("after the trust update: %+v", a)
	}
	publish(gws["gw-b"].Cert, op.Revoke(2, "gw-a"))
	if a := r.write(7, 2, 101); a.Verdict != fence.Invalid {
		t.Fatalf("revoked holder: %+v", a)
	}
	as("gw-b")
	if a := r.write(9, 1, 200); a.Verdict != fence.Accepted {
		t.Fatalf("the certified gateway taking over: %+v", a)
	}
	// Forged: another root's list un-revoking gw-a.
	forged := authtest.NewOperator(t).Revoke(99)
	publish(gws["gw-b"].Cert, forged)
	as("gw-a")
	if a := r.write(10, 1, 666); a.Verdict != fence.Invalid {
		t.Fatalf("revoked holder after a forged update: %+v", a)
	}
	if rec, _, err := tbl.Get("plc-1"); err != nil || rec.Mark != (fence.Mark{Token: 9, Seq: 1}) {
		t.Fatalf("table mark %+v %v", rec.Mark, err)
	}
	if st := br.Stats(); st.TrustApplied != 4 || st.TrustRefused != 2 {
		t.Fatalf("stats %+v", st)
	}
	stop()

	// Restart: the root only, as provisioned; the table's file kept the rest.
	br, _, _ = start()
	publish(op.Revoke(1))
	if a := r.write(11, 1, 667); a.Verdict != fence.Invalid {
		t.Fatalf("revoked holder after a restart and an older list: %+v", a)
	}
	as("gw-b")
	if a := r.write(12, 1, 300); a.Verdict != fence.Accepted {
		t.Fatalf("learned certificate lost in the restart: %+v", a)
	}
	if v := r.register(); v != 300 {
		t.Fatalf("register %d", v)
	}
	if st := br.Stats(); st.TrustRefused != 1 {
		t.Fatalf("stats after the restart %+v", st)
	}
}
