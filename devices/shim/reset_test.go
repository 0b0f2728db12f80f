package shim_test

import (
	"errors"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgefence/edgefence/devices/shim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
)

// operator is the operator's root key, as signer and as a bare RootKey.
type operator struct {
	root *auth.Root
	key  *auth.RootKey
}

func newOperator(t testing.TB) operator {
	t.Helper()
	k, err := auth.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	var o operator
	if o.root, err = auth.NewRoot([]byte("operator"), k); err != nil {
		t.Fatal(err)
	}
	if o.key, err = auth.NewRootKey([]byte("operator"), &k.PublicKey); err != nil {
		t.Fatal(err)
	}
	return o
}

// signReset signs a reset of dev to `to` in epoch counter (each test's
// counters go up, so do their epochs).
func signReset(t testing.TB, r *auth.Root, dev string, to fence.Mark, counter uint64, id string) []byte {
	t.Helper()
	return signEpochReset(t, r, dev, to, counter, counter, id)
}

func signEpochReset(t testing.TB, r *auth.Root, dev string, to fence.Mark, counter, epoch uint64, id string) []byte {
	t.Helper()
	raw, err := r.Reset(auth.Reset{Device: dev, Token: to.Token, Seq: to.Seq, Counter: counter, ID: id, Epoch: epoch})
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// A device of the unsigned era (no Keys), provisioned only with the
// operator's root, is bricked by one forged envelope with token 2^63; the
// operator's reset brings it back: the holder's command, in the reset's
// epoch, is accepted again.
// The same reset replayed, a reset for another device, one signed by a
// gateway's key, and any reset at a shim with no root are refused invalid,
// the mark unchanged; the counter survives a reopen.
func TestResetBrickedDevice(t *testing.T) {
	op := newOperator(t)
	path := filepath.Join(t.TempDir(), "fence.db")
	dev := &recorder{}
	s := open(t, path, &shim.Options{Root: op.key})

	if a := s.Handle("dev-1", envelope(t, "dev-1", 10, 1, "ok"), dev); a.Verdict != fence.Accepted {
		t.Fatalf("holder: %+v", a)
	}
	if a := s.Handle("dev-1", envelope(t, "dev-1", 1<<63, 1, "ok"), dev); a.Verdict != fence.Accepted {
		t.Fatalf("the forgery (no Keys: accepted, as issue 13 found): %+v", a)
	}
	if a := s.Handle("dev-1", envelope(t, "dev-1", 10, 2, "ok"), dev); a.Verdict != fence.Stale {
		t.Fatalf("bricked: the holder's next command %+v, want stale", a)
	}

	to := fence.Mark{Token: 9, Seq: math.MaxUint64}
	good := signReset(t, op.root, "dev-1", to, 1, "reset:one")
	a := s.Handle("dev-1", good, dev)
	if a.Verdict != fence.Accepted || a.ID != "reset:one" || a.Mark() != to || a.Epoch != 1 || a.Device != "dev-1" {
		t.Fatalf("reset: %+v", a)
	}
	if a := s.Handle("dev-1", epochEnvelope(t, "dev-1", 1, 10, 3, "ok"), dev); a.Verdict != fence.Accepted {
		t.Fatalf("the holder after the reset: %+v", a)
	}
	after := fence.Mark{Token: 10, Seq: 3}

	gw, err := auth.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	gwRoot, _ := auth.NewRoot([]byte("gw-a/1"), gw)
	asRoot, _ := auth.NewRoot([]byte("operator"), gw)
	for _, tc := range []struct {
		name string
		raw  []byte
		want error
	}{
		{"the same reset replayed", good, auth.ErrReplayedReset},
		{"an older counter", signReset(t, op.root, "dev-1", to, 1, "reset:older"), auth.ErrReplayedReset},
		{"for another device", signReset(t, op.root, "dev-2", to, 7, "reset:other"), auth.ErrResetDevice},
		{"a gateway's key", signReset(t, gwRoot, "dev-1", to, 8, "reset:gw"), auth.ErrUnknownKey},
		{"a gateway's key as the root", signReset(t, asRoot, "dev-1", to, 9, "reset:gw2"), auth.ErrBadSignature},
	} {
		a := s.Handle("dev-1", tc.raw, dev)
		if a.Verdict != fence.Invalid || a.Mark() != after || !strings.Contains(a.Reason, tc.want.Error()) {
			t.Errorf("%s: %+v, want invalid (%v) with mark %v", tc.name, a, tc.want, after)
		}
		if a.Device != "dev-1" || !auth.ValidResetID(a.ID) {
			t.Errorf("%s: the refusal names %q/%q, want the reset's id", tc.name, a.Device, a.ID)
		}
	}
	if m := mark(t, s, "dev-1"); m != after {
		t.Fatalf("mark %v after the refusals, want %v", m, after)
	}
	st := s.Stats()
	if st.Resets != 1 || st.ResetsRefused != 5 {
		t.Fatalf("stats %+v", st)
	}

	// Durable: the counter survives a reopen; the next counter works.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, path, &shim.Options{Root: op.key})
	if a := s.Handle("dev-1", good, dev); a.Verdict != fence.Invalid || !strings.Contains(a.Reason, auth.ErrReplayedReset.Error()) {
		t.Fatalf("replay after a reopen: %+v", a)
	}
	if r, err := s.LastReset("dev-1"); err != nil || r.Counter != 1 || r.ID != "reset:one" {
		t.Fatalf("last reset %+v, %v", r, err)
	}
	if a := s.Handle("dev-1", signReset(t, op.root, "dev-1", fence.Mark{Token: 3, Seq: 1}, 2, "reset:two"), dev); a.Verdict != fence.Accepted || a.Mark() != (fence.Mark{Token: 3, Seq: 1}) {
		t.Fatalf("the next reset: %+v", a)
	}

	// No root: every reset refused.
	bare := open(t, filepath.Join(t.TempDir(), "fence.db"), nil)
	if a := bare.Handle("dev-1", signReset(t, op.root, "dev-1", to, 50, "reset:noroot"), dev); a.Verdict != fence.Invalid || !strings.Contains(a.Reason, auth.ErrNoRoot.Error()) {
		t.Fatalf("no root: %+v", a)
	}
}

// At a shim that requires signed commands, the trust chain's root checks
// resets: no Options.Root needed. A seq advance the shim held in memory
// (PersistOnTokenChangeOnly) does not outlive a reset.
func TestResetSignedShim(t *testing.T) {
	w := newAuthWorld(t)
	if a := w.s.Handle("dev-1", signed(t, w.gw, cmd("dev-1", 500, 1, "c1")), w.dev); a.Verdict != fence.Accepted {
		t.Fatalf("%+v", a)
	}
	to := fence.Mark{Token: 40, Seq: math.MaxUint64}
	if a := w.s.Handle("dev-1", signReset(t, w.root, "dev-1", to, 1, "reset:a"), w.dev); a.Verdict != fence.Accepted || a.Mark() != to {
		t.Fatalf("reset with the Trust's root: %+v", a)
	}
	c2 := cmd("dev-1", 41, 1, "c2")
	c2.Epoch = 1
	if a := w.s.Handle("dev-1", signed(t, w.gw, c2), w.dev); a.Verdict != fence.Accepted {
		t.Fatalf("after the reset: %+v", a)
	}

	op := newOperator(t)
	lazy := open(t, filepath.Join(t.TempDir(), "fence.db"), &shim.Options{Root: op.key, PersistOnTokenChangeOnly: true})
	for seq := uint64(1); seq <= 3; seq++ {
		if a := lazy.Handle("dev-1", envelope(t, "dev-1", 1<<63, seq, "ok"), w.dev); a.Verdict != fence.Accepted {
			t.Fatalf("%+v", a)
		}
	}
	if a := lazy.Handle("dev-1", signReset(t, op.root, "dev-1", fence.Mark{Token: 7, Seq: 1}, 1, "reset:lazy"), w.dev); a.Verdict != fence.Accepted {
		t.Fatalf("%+v", a)
	}
	if m := mark(t, lazy, "dev-1"); m != (fence.Mark{Token: 7, Seq: 1}) {
		t.Fatalf("mark %v after the reset: a seq held in memory came back", m)
	}
	if err := lazy.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := lazy.Mark("dev-1"); !errors.Is(err, shim.ErrClosed) {
		t.Fatal(err)
	}
}

// BenchmarkReset is a reset at a shim: verify and apply (one fsynced
// transaction), each with a new counter (docs/BENCHMARKS.md, "Authorised
// fence reset").
func BenchmarkReset(b *testing.B) {
	op := newOperator(b)
	s := open(b, filepath.Join(b.TempDir(), "fence.db"), &shim.Options{Root: op.key})
	var resets [][]byte
	for i := range 256 {
		resets = append(resets, signReset(b, op.root, "dev-1", fence.Mark{Token: 9, Seq: 1}, uint64(i+1), "reset:bench"))
	}
	i := 0
	for b.Loop() {
		if i == len(resets) {
			b.StopTimer()
			if err := s.Close(); err != nil {
				b.Fatal(err)
			}
			s = open(b, filepath.Join(b.TempDir(), "fence.db"), &shim.Options{Root: op.key})
			i = 0
			b.StartTimer()
		}
		if a := s.Handle("dev-1", resets[i], nil); a.Verdict != fence.Accepted {
			b.Fatalf("%+v", a)
		}
		i++
	}
}
