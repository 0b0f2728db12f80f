package shim_test

import (
	"math"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgefence/edgefence/devices/shim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
)

// authWorld is a shim that requires signed envelopes, the operator root
// it trusts, and a gateway certified for dev-1.
type authWorld struct {
	s     *shim.Shim
	trust *auth.Trust
	root  *auth.Root
	gw    *auth.Signer
	dev   *recorder
}

func newAuthWorld(t *testing.T) *authWorld {
	t.Helper()
	rk, err := auth.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	w := &authWorld{dev: &recorder{}}
	if w.root, err = auth.NewRoot([]byte("operator"), rk); err != nil {
		t.Fatal(err)
	}
	if w.trust, err = auth.NewTrust([]byte("operator"), &rk.PublicKey, nil); err != nil {
		t.Fatal(err)
	}
	w.gw = w.certify(t, "gw-a/1", "dev-1")
	w.s = open(t, filepath.Join(t.TempDir(), "fence.db"), &shim.Options{Keys: w.trust})
	return w
}

func (w *authWorld) certify(t *testing.T, kid string, devices ...string) *auth.Signer {
	t.Helper()
	k, err := auth.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	cert, err := w.root.Certify([]byte(kid), &k.PublicKey, devices, time.Now().Add(-time.Hour), time.Now().Add(time.Hour), 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.trust.AddCertificate(cert); err != nil {
		t.Fatal(err)
	}
	s, err := auth.NewSigner([]byte(kid), k)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func cmd(dev string, tok fence.Token, seq uint64, id string) *fence.Envelope {
	return &fence.Envelope{V: fence.Version, Device: dev, Token: tok, Seq: seq, ID: id, Kind: "ok", Holder: "gw-a"}
}

func signed(t *testing.T, s *auth.Signer, e *fence.Envelope) []byte {
	t.Helper()
	raw, err := s.Sign(e)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// The forgeries of issue 13 at a shim that requires signatures: each is
// refused invalid before the admit rule, the mark unchanged, counted; the
// real holder's next command is accepted afterwards. Without Options.Keys
// the first one bricks the device (the control at the end).
func TestSignedCommandsOnly(t *testing.T) {
	w := newAuthWorld(t)
	if a := w.s.Handle("dev-1", signed(t, w.gw, cmd("dev-1", 5, 1, "c1")), w.dev); a.Verdict != fence.Accepted {
		t.Fatalf("signed command: %+v", a)
	}
	plain := func(e *fence.Envelope) []byte {
		b, err := fence.MarshalEnvelope(e)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	mallory := func() *auth.Signer {
		k, err := auth.NewKey()
		if err != nil {
			t.Fatal(err)
		}
		s, err := auth.NewSigner([]byte("gw-a/1"), k) // claims the real kid
		if err != nil {
			t.Fatal(err)
		}
		return s
	}()
	other := w.certify(t, "gw-b/1", "dev-2") // certified, but not for dev-1
	revoked := w.certify(t, "gw-c/1", "dev-1")
	list, err := w.root.Revoke(1, [][]byte{[]byte("gw-c/1")}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := w.trust.ApplyRevocations(list); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		raw  []byte
	}{
		{"unsigned, token 2^63", plain(cmd("dev-1", 1<<63, 1, "f1"))},
		{"unsigned, token and seq 2^64-1", plain(cmd("dev-1", math.MaxUint64, math.MaxUint64, "f2"))},
		{"unsigned, current token, seq 2^64-1", plain(cmd("dev-1", 5, math.MaxUint64, "f3"))},
		{"forged signature under the real kid", signed(t, mallory, cmd("dev-1", 1<<63, 1, "f4"))},
		{"certified for another device", signed(t, other, cmd("dev-1", 1<<63, 1, "f5"))},
		{"revoked gateway", signed(t, revoked, cmd("dev-1", 1<<63, 1, "f6"))},
		{"re-targeted: dev-2's command sent to dev-1", signed(t, other, cmd("dev-2", 1<<63, 1, "f7"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := w.s.Stats().Unauthenticated
			a := w.s.Handle("dev-1", tc.raw, w.dev)
			if a.Verdict != fence.Invalid {
				t.Fatalf("verdict %v (%s), want invalid", a.Verdict, a.Reason)
			}
			if m := mark(t, w.s, "dev-1"); m != (fence.Mark{Token: 5, Seq: 1}) {
				t.Fatalf("mark moved to %v", m)
			}
			if tc.name != "re-targeted: dev-2's command sent to dev-1" && w.s.Stats().Unauthenticated != before+1 {
				t.Fatalf("not counted: %+v", w.s.Stats())
			}
		})
	}
	// A replayed old envelope, properly signed: the admit rule answers it.
	if a := w.s.Handle("dev-1", signed(t, w.gw, cmd("dev-1", 5, 1, "c1")), w.dev); a.Verdict != fence.Duplicate {
		t.Fatalf("replay: %+v", a)
	}
	if a := w.s.Handle("dev-1", signed(t, w.gw, cmd("dev-1", 5, 2, "c2")), w.dev); a.Verdict != fence.Accepted {
		t.Fatalf("the holder's next command after the forgeries: %+v", a)
	}
	if got := w.dev.marks(); len(got) != 2 {
		t.Fatalf("applied %v, want the two real commands", got)
	}

	// Control: the same first forgery at a shim without Keys raises the mark for good.
	unauth := open(t, filepath.Join(t.TempDir(), "fence.db"), nil)
	if a := unauth.Handle("dev-1", plain(cmd("dev-1", 1<<63, 1, "f1")), &recorder{}); a.Verdict != fence.Accepted {
		t.Fatalf("control: %+v", a)
	}
	if a := unauth.Handle("dev-1", plain(cmd("dev-1", 6, 1, "c3")), &recorder{}); a.Verdict != fence.Stale {
		t.Fatalf("control: after the forgery the real holder is %v", a.Verdict)
	}
}

// A refused signed command's ack names it (id, token, seq), so that its
// sender learns why; the mark in the ack is the device's, unchanged.
func TestRefusalNamesTheCommand(t *testing.T) {
	w := newAuthWorld(t)
	k, err := auth.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := auth.NewSigner([]byte("nobody"), k)
	if err != nil {
		t.Fatal(err)
	}
	a := w.s.Handle("dev-1", signed(t, stranger, cmd("dev-1", 9, 1, "c9")), w.dev)
	if a.Verdict != fence.Invalid || a.ID != "c9" || a.Token != 9 {
		t.Fatalf("ack %+v", a)
	}
}
