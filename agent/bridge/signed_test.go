package bridge

import (
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
)

// gatewayKey returns a trust anchored at a new operator root and a gateway
// key it certified for plc-*.
func gatewayKey(t testing.TB) (*auth.Trust, *auth.Signer) {
	t.Helper()
	rk, err := auth.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	root, err := auth.NewRoot([]byte("operator"), rk)
	if err != nil {
		t.Fatal(err)
	}
	trust, err := auth.NewTrust([]byte("operator"), &rk.PublicKey, nil)
	if err != nil {
		t.Fatal(err)
	}
	gk, err := auth.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	cert, err := root.Certify([]byte("gw/1"), &gk.PublicKey, []string{"plc-*"}, time.Now().Add(-time.Hour), time.Now().Add(time.Hour), 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := trust.AddCertificate(cert); err != nil {
		t.Fatal(err)
	}
	gw, err := auth.NewSigner([]byte("gw/1"), gk)
	if err != nil {
		t.Fatal(err)
	}
	return trust, gw
}

// With Config.Signer the table's acks are signed by the home gateway's
// key, so a holder that checks them (auth.GatewayAcks, bound to the
// command) resolves its commands: accepted, then stale.
func TestBridgeSignsItsAcks(t *testing.T) {
	trust, gw := gatewayKey(t)
	r := newRig(t)
	tbl, err := fence.OpenTable(filepath.Join(t.TempDir(), "fence.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	r.startBridgeWith(Config{Table: tbl, Signer: gw})
	var verified atomic.Int64
	r.cmdr.CheckAcksWith(func(env *fence.Envelope, raw []byte) (*fence.Ack, error) {
		v, err := auth.VerifyAck(raw, auth.GatewayAcks{Keys: trust})
		if err == nil {
			err = auth.BoundTo(v.Ack, env)
		}
		if err != nil {
			t.Errorf("ack of %s: %v", env.ID, err)
			return nil, err
		}
		verified.Add(1)
		return v.Ack, nil
	})
	if a := r.write(7, 1, 100); a.Verdict != fence.Accepted {
		t.Fatalf("write: %+v", a)
	}
	if a := r.write(6, 1, 5); a.Verdict != fence.Stale {
		t.Fatalf("stale write: %+v", a)
	}
	if verified.Load() != 2 {
		t.Fatalf("%d verified acks, want 2", verified.Load())
	}
}
