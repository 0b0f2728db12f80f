package bridge

import (
	"path/filepath"
	"testing"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
)

// TestSignedCommandsOnlyAtTheGateway: with Config.Keys the gateway fence
// admits only commands signed by a key the operator certified for the
// device. A forged command with token 2^63 is refused before the table
// (mark unchanged, nothing on the wire, counted), and the real holder's
// signed commands go on. (Without Keys a plain envelope is admitted, as in
// every other test of this package.)
func TestSignedCommandsOnlyAtTheGateway(t *testing.T) {
	trust, gw := gatewayKey(t)

	r := newRig(t)
	tbl, err := fence.OpenTable(filepath.Join(t.TempDir(), "fence.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	br, _ := r.startBridgeWith(Config{Table: tbl, Keys: trust})

	// The forger publishes a plain envelope: refused, the table untouched.
	if a := r.write(1<<63, 1, 666); a.Verdict != fence.Invalid {
		t.Fatalf("unsigned forgery: %+v", a)
	}
	// The real holder signs.
	r.cmdr.SignWith(gw.Sign)
	if a := r.write(7, 1, 100); a.Verdict != fence.Accepted {
		t.Fatalf("signed command: %+v", a)
	}
	if rec, _, err := tbl.Get("plc-1"); err != nil || rec.Mark != (fence.Mark{Token: 7, Seq: 1}) {
		t.Fatalf("table mark %+v %v", rec.Mark, err)
	}
	if v := r.register(); v != 100 {
		t.Fatalf("register %d, want the signed write's 100", v)
	}
	// A forger with its own key: refused too.
	mk, err := auth.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	mallory, err := auth.NewSigner([]byte("gw/1"), mk)
	if err != nil {
		t.Fatal(err)
	}
	r.cmdr.SignWith(mallory.Sign)
	if a := r.write(1<<62, 1, 666); a.Verdict != fence.Invalid {
		t.Fatalf("forged signature: %+v", a)
	}
	if st := br.Stats(); st.Unauthenticated != 2 {
		t.Fatalf("stats %+v, want 2 unauthenticated", st)
	}
	if v := r.register(); v != 100 {
		t.Fatalf("register %d after the forgeries", v)
	}
}
