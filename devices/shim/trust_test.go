package shim_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgefence/edgefence/devices/shim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
)

// otaWorld is an operator root, gateway keys it certified, and a shim
// provisioned with the root only: it learns the rest over the air.
type otaWorld struct {
	root  *auth.Root
	rootK func() *auth.Trust // a new Trust anchored at the root only
	certs map[string][]byte
	gws   map[string]*auth.Signer
}

func newOTAWorld(t testing.TB, gateways ...string) *otaWorld {
	t.Helper()
	rk, err := auth.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	w := &otaWorld{certs: map[string][]byte{}, gws: map[string]*auth.Signer{}}
	if w.root, err = auth.NewRoot([]byte("operator"), rk); err != nil {
		t.Fatal(err)
	}
	w.rootK = func() *auth.Trust {
		tr, err := auth.NewTrust([]byte("operator"), &rk.PublicKey, nil)
		if err != nil {
			t.Fatal(err)
		}
		return tr
	}
	for _, gw := range gateways {
		k, err := auth.NewKey()
		if err != nil {
			t.Fatal(err)
		}
		if w.certs[gw], err = w.root.Certify([]byte(gw), &k.PublicKey, []string{"dev-*"}, time.Now().Add(-time.Hour), time.Now().Add(time.Hour), 1); err != nil {
			t.Fatal(err)
		}
		if w.gws[gw], err = auth.NewSigner([]byte(gw), k); err != nil {
			t.Fatal(err)
		}
	}
	return w
}

func (w *otaWorld) list(t testing.TB, version uint64, revoked ...string) []byte {
	t.Helper()
	var kids [][]byte
	for _, k := range revoked {
		kids = append(kids, []byte(k))
	}
	raw, err := w.root.Revoke(version, kids, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func trustUpdate(t testing.TB, stmts ...[]byte) []byte {
	t.Helper()
	raw, err := auth.MarshalUpdate(stmts)
	if err != nil {
		t.Fatal(err)
	}
	return raw
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
	s := open(t, path, &shim.Options{Keys: w.rootK()})
	dev := &recorder{}
	send := func(s *shim.Shim, gw string, tok fence.Token, seq uint64) fence.Ack {
		t.Helper()
		return s.Handle("dev-1", signed(t, w.gws[gw], cmd("dev-1", tok, seq, fmt.Sprintf("%s-%d-%d", gw, tok, seq))), dev)
	}
	learn := func(s *shim.Shim, stmts ...[]byte) *auth.Learned {
		t.Helper()
		before := mark(t, s, "dev-1")
		res := s.Process("dev-1", trustUpdate(t, stmts...), dev)
		if res.Update == nil || res.Ack != (fence.Ack{}) || res.Applied || mark(t, s, "dev-1") != before {
			t.Fatalf("trust update handled as a command: %+v", res)
		}
		return res.Update
	}

	if a := send(s, "gw-a", 5, 1); a.Verdict != fence.Invalid || mark(t, s, "dev-1") != (fence.Mark{}) {
		t.Fatalf("uncertified gateway: %+v", a)
	}
	if got := learn(s, w.certs["gw-a"], w.list(t, 1)); got.Applied != 2 {
		t.Fatalf("gateway's update: %+v", got)
	}
	if a := send(s, "gw-a", 5, 1); a.Verdict != fence.Accepted {
		t.Fatalf("after the update: %+v", a)
	}
	if got := learn(s, w.certs["gw-a"], w.list(t, 1)); got.Held != 2 || got.Applied+got.Refused != 0 {
		t.Fatalf("the same update again: %+v", got)
	}

	// The operator revokes gw-a; gw-b's update brings its certificate and
	// the list.
	if got := learn(s, w.certs["gw-b"], w.list(t, 2, "gw-a")); got.Applied != 2 {
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
	if got := learn(s, w.certs["gw-b"], forger.list(t, 99)); got.Refused != 2 || got.Applied != 0 {
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
	s = open(t, path, &shim.Options{Keys: w.rootK()})
	if a := send(s, "gw-a", 11, 1); a.Verdict != fence.Invalid || !contains(a.Reason, "revoked") {
		t.Fatalf("revoked gateway after a restart: %+v", a)
	}
	if got := learn(s, w.certs["gw-a"], w.list(t, 1)); got.Refused != 1 || got.Held != 1 {
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
	res := s.Process("dev-1", trustUpdate(t, w.certs["gw-a"]), &recorder{})
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
		s := open(b, filepath.Join(b.TempDir(), "fence.db"), &shim.Options{Keys: w.rootK()})
		ups := make([][]byte, b.N)
		for i := range ups {
			ups[i] = trustUpdate(b, w.certs["gw-a"], w.list(b, uint64(i)+1, "gw-old"))
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
		s := open(b, filepath.Join(b.TempDir(), "fence.db"), &shim.Options{Keys: w.rootK()})
		up := trustUpdate(b, w.certs["gw-a"], w.list(b, 1, "gw-old"))
		s.Process("dev-1", up, nil)
		b.ReportAllocs()
		for b.Loop() {
			if res := s.Process("dev-1", up, nil); res.Update == nil || res.Update.Held != 2 {
				b.Fatalf("%+v", res.Update)
			}
		}
	})
}
