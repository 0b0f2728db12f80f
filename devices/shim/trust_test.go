package shim_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgefence/edgefence/devices/shim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/fence/auth/authtest"
	"github.com/edgefence/edgefence/fence/history"
)

// otaWorld is an operator root and gateway keys it certified; shims are
// provisioned with the root only and learn the rest over the air.
type otaWorld struct {
	*authtest.Operator
	certs map[string][]byte
	gws   map[string]*auth.Signer
}

func newOTAWorld(t testing.TB, gateways ...string) *otaWorld {
	t.Helper()
	w := &otaWorld{Operator: authtest.NewOperator(t), certs: map[string][]byte{}, gws: map[string]*auth.Signer{}}
	for _, gw := range gateways {
		g := w.Certify(gw, "dev-*")
		w.certs[gw], w.gws[gw] = g.Cert, g.Signer
	}
	return w
}

// TestTrustOverTheAir: a shim provisioned with the operator root only
// accepts a gateway's signed commands once a trust update brought its
// certificate; a newer revocation list makes it refuse the revoked
// gateway (invalid, mark unchanged) while another certified gateway is
// accepted; an update with a statement not of the root changes nothing;
// after a reopen (a restart) the shim still refuses the revoked key and
// still knows the learned certificate, and an older list replayed is
// refused. A trust update is no command: no ack, no mark change.
func TestTrustOverTheAir(t *testing.T) {
	w := newOTAWorld(t, "gw-a", "gw-b")
	path := filepath.Join(t.TempDir(), "fence.db")
	s := open(t, path, &shim.Options{Keys: w.Trust()})
	dev := &recorder{}
	send := func(s *shim.Shim, gw string, tok fence.Token, seq uint64) fence.Ack {
		t.Helper()
		return s.Handle("dev-1", signed(t, w.gws[gw], cmd("dev-1", tok, seq, fmt.Sprintf("%s-%d-%d", gw, tok, seq))), dev)
	}
	learn := func(s *shim.Shim, stmts ...[]byte) *auth.Learned {
		t.Helper()
		before := mark(t, s, "dev-1")
		res := s.Process("dev-1", authtest.Update(t, stmts...), dev)
		if res.Update == nil || res.Ack != (fence.Ack{}) || res.Applied || mark(t, s, "dev-1") != before {
			t.Fatalf("trust update handled as a command: %+v", res)
		}
		return res.Update
	}

	if a := send(s, "gw-a", 5, 1); a.Verdict != fence.Invalid || mark(t, s, "dev-1") != (fence.Mark{}) {
		t.Fatalf("uncertified gateway: %+v", a)
	}
	if got := learn(s, w.certs["gw-a"], w.Revoke(1)); got.Applied != 2 {
		t.Fatalf("gateway's update: %+v", got)
	}
	if a := send(s, "gw-a", 5, 1); a.Verdict != fence.Accepted {
		t.Fatalf("after the update: %+v", a)
	}
	if got := learn(s, w.certs["gw-a"], w.Revoke(1)); got.Held != 2 || got.Applied+got.Refused != 0 {
		t.Fatalf("the same update again: %+v", got)
	}

	// The operator revokes gw-a; gw-b's update brings its certificate and
	// the list.
	if got := learn(s, w.certs["gw-b"], w.Revoke(2, "gw-a")); got.Applied != 2 {
		t.Fatalf("revocation: %+v", got)
	}
	if a := send(s, "gw-a", 5, 2); a.Verdict != fence.Invalid || !contains(a.Reason, "revoked") || mark(t, s, "dev-1") != (fence.Mark{Token: 5, Seq: 1}) {
		t.Fatalf("revoked gateway: %+v, mark %v", a, mark(t, s, "dev-1"))
	}
	if a := send(s, "gw-b", 9, 1); a.Verdict != fence.Accepted {
		t.Fatalf("the gateway taking over: %+v", a)
	}

	// Forged: a list un-revoking gw-a under another root, beside a good
	// statement: the whole update is refused.
	forger := newOTAWorld(t)
	if got := learn(s, w.certs["gw-b"], forger.Revoke(99)); got.Refused != 2 || got.Applied != 0 {
		t.Fatalf("forged update: %+v", got)
	}
	if a := send(s, "gw-a", 10, 1); a.Verdict != fence.Invalid {
		t.Fatalf("after the forged update: %+v", a)
	}
	st := s.Stats()
	if st.TrustApplied != 4 || st.TrustHeld != 2 || st.TrustRefused != 2 || st.Accepted != 2 {
		t.Fatalf("stats %+v", st)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// Restart: provisioned with the root only, as before.
	s = open(t, path, &shim.Options{Keys: w.Trust()})
	if a := send(s, "gw-a", 11, 1); a.Verdict != fence.Invalid || !contains(a.Reason, "revoked") {
		t.Fatalf("revoked gateway after a restart: %+v", a)
	}
	if got := learn(s, w.certs["gw-a"], w.Revoke(1)); got.Refused != 1 || got.Held != 1 {
		t.Fatalf("older list replayed after a restart: %+v", got)
	}
	if a := send(s, "gw-a", 11, 2); a.Verdict != fence.Invalid {
		t.Fatalf("revoked gateway after the replay: %+v", a)
	}
	if a := send(s, "gw-b", 12, 1); a.Verdict != fence.Accepted {
		t.Fatalf("learned certificate lost in the restart: %+v", a)
	}
	if m := mark(t, s, "dev-1"); m != (fence.Mark{Token: 12, Seq: 1}) {
		t.Fatalf("mark %v", m)
	}
}

// Without a Trust (plain envelopes, or Keys that are not an *auth.Trust)
// a trust update is what it was before: an invalid command.
func TestTrustUpdateWithoutTrust(t *testing.T) {
	w := newOTAWorld(t, "gw-a")
	s := open(t, filepath.Join(t.TempDir(), "fence.db"), nil)
	res := s.Process("dev-1", authtest.Update(t, w.certs["gw-a"]), &recorder{})
	if res.Update != nil || res.Ack.Verdict != fence.Invalid {
		t.Fatalf("%+v", res)
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

// BenchmarkTrustUpdate: the cost at the shim of a trust update carrying
// the gateway's certificate and a revocation list: "new-list" (verify
// both, commit the newer list with fsync, take it in), "held" (verify
// both, nothing newer: no write).
func BenchmarkTrustUpdate(b *testing.B) {
	w := newOTAWorld(b, "gw-a")
	b.Run("new-list", func(b *testing.B) {
		s := open(b, filepath.Join(b.TempDir(), "fence.db"), &shim.Options{Keys: w.Trust()})
		ups := make([][]byte, b.N)
		for i := range ups {
			ups[i] = authtest.Update(b, w.certs["gw-a"], w.Revoke(uint64(i)+1, "gw-old"))
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			if res := s.Process("dev-1", ups[i], nil); res.Update == nil || res.Update.Applied == 0 {
				b.Fatalf("%+v", res.Update)
			}
		}
	})
	b.Run("held", func(b *testing.B) {
		s := open(b, filepath.Join(b.TempDir(), "fence.db"), &shim.Options{Keys: w.Trust()})
		up := authtest.Update(b, w.certs["gw-a"], w.Revoke(1, "gw-old"))
		s.Process("dev-1", up, nil)
		b.ReportAllocs()
		for b.Loop() {
			if res := s.Process("dev-1", up, nil); res.Update == nil || res.Update.Held != 2 {
				b.Fatalf("%+v", res.Update)
			}
		}
	})
}

// TestTrustHistory: with a History, the shim records who signed each
// command it verified (Event.Signer) and each revocation list it commits
// (history.OpTrust, after the commit, naming the revoked key ids; again
// at open for the list it keeps), which is what history's T1 check reads.
func TestTrustHistory(t *testing.T) {
	w := newOTAWorld(t, "gw-a", "gw-b")
	dir := t.TempDir()
	hpath := filepath.Join(dir, "hist.jsonl")
	hw, err := history.Create(hpath, "shim")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "fence.db")
	s := open(t, path, &shim.Options{Keys: w.Trust(), History: hw})
	dev := &recorder{}
	send := func(gw string, tok fence.Token, seq uint64) fence.Ack {
		t.Helper()
		return s.Handle("dev-1", signed(t, w.gws[gw], cmd("dev-1", tok, seq, fmt.Sprintf("%s-%d-%d", gw, tok, seq))), dev)
	}
	s.Process("dev-1", authtest.Update(t, w.certs["gw-a"]), dev)
	if a := send("gw-a", 5, 1); a.Verdict != fence.Accepted {
		t.Fatalf("gw-a: %+v", a)
	}
	s.Process("dev-2", authtest.Update(t, w.certs["gw-b"], w.Revoke(2, "gw-a")), dev)
	if a := send("gw-a", 5, 2); a.Verdict != fence.Invalid {
		t.Fatalf("revoked gw-a: %+v", a)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, path, &shim.Options{Keys: w.Trust(), History: hw})
	defer s.Close()
	evs, err := history.Read(hpath)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range evs {
		got = append(got, fmt.Sprintf("%s %s %s %s %v", e.Op, e.Device, e.Verdict, e.Signer, e.Revoked))
	}
	want := []string{
		"verdict dev-1 accepted gw-a []",
		"trust dev-2   [gw-a]",
		"verdict dev-1 invalid  []", // refused before its signature verified: no signer claimed
		"trust    [gw-a]",           // at open: the list kept
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("history:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if r := history.Check(evs); !r.OK() {
		t.Fatalf("check: %v", r.Violations)
	}
}
