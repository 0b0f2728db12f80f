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
	r.cmdr.SignWith(forger(t).Sign)
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

// TestAuthOffDeviceAtTheGateway: an `auth: off` device's table entry takes
// plain envelopes although the gateway fence verifies (counted in
// Stats.Unsigned, edgefence_fence_table_unsigned_total), and still checks
// a signed one: a forged signature is refused. (TestSignedCommandsOnly-
// AtTheGateway is the same device with auth: required, refusing plain.)
func TestAuthOffDeviceAtTheGateway(t *testing.T) {
	trust, gw := gatewayKey(t)
	r := newRig(t)
	tbl, err := fence.OpenTable(filepath.Join(t.TempDir(), "fence.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	br, _ := r.startBridgeWith(Config{Table: tbl, Keys: trust, Devices: []Device{{AuthOff: true}}})
	if a := r.write(5, 1, 50); a.Verdict != fence.Accepted {
		t.Fatalf("plain command to an auth: off device: %+v", a)
	}
	r.cmdr.SignWith(gw.Sign)
	if a := r.write(5, 2, 51); a.Verdict != fence.Accepted {
		t.Fatalf("signed command to an auth: off device: %+v", a)
	}
	r.cmdr.SignWith(forger(t).Sign)
	if a := r.write(5, 3, 666); a.Verdict != fence.Invalid {
		t.Fatalf("forged signature to an auth: off device: %+v", a)
	}
	if st := br.Stats(); st.Unsigned != 1 || st.Unauthenticated != 1 || st.Accepted != 2 {
		t.Fatalf("stats %+v, want 1 unsigned, 1 unauthenticated, 2 accepted", st)
	}
	if v := r.register(); v != 51 {
		t.Fatalf("register %d, want 51", v)
	}
}

// forger is a signer under gw/1's key id with a key of its own, which no
// certificate names.
func forger(t *testing.T) *auth.Signer {
	t.Helper()
	mk, err := auth.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	mallory, err := auth.NewSigner([]byte("gw/1"), mk)
	if err != nil {
		t.Fatal(err)
	}
	return mallory
}
