package auth_test

import (
	"errors"
	"testing"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
)

func reset(dev string, tok fence.Token, counter uint64) auth.Reset {
	return auth.Reset{Device: dev, Token: tok, Seq: 1<<64 - 1, Counter: counter, ID: "reset:test-1", Issued: 1_800_000_000_000, Epoch: 1_800_000_000_000}
}

// A reset is the operator root's statement and nothing else's: checked
// against a whole Trust and against the bare root key alike; refused for
// another device, under a gateway's key (its own kid, or the root's), by
// another root, as another kind of statement; every refusal wraps
// fence.ErrInvalid.
func TestResetVerify(t *testing.T) {
	c := newChain(t)
	raw, err := c.root.Reset(reset("dev-1", 812, 5))
	if err != nil {
		t.Fatal(err)
	}
	if !auth.IsReset(raw) {
		t.Fatal("IsReset: false for a reset")
	}
	rk := newKey(t)
	root, err := auth.NewRoot([]byte("operator"), rk)
	if err != nil {
		t.Fatal(err)
	}
	bare, err := auth.NewRootKey([]byte("operator"), &rk.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	raw2, err := root.Reset(reset("dev-1", 812, 5))
	if err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]struct {
		ver auth.ResetVerifier
		raw []byte
	}{"trust": {c.trust, raw}, "root key": {bare, raw2}} {
		r, err := v.ver.VerifyReset(v.raw, "dev-1")
		if err != nil || r.State() != (fence.State{Epoch: 1_800_000_000_000, Mark: fence.Mark{Token: 812, Seq: 1<<64 - 1}}) || r.Counter != 5 || r.ID != "reset:test-1" {
			t.Fatalf("%s: %+v, %v", name, r, err)
		}
	}

	gw := c.gateway(t, "gw-a/1", 1, "*")
	gwKey := newKey(t)
	gwRoot, _ := auth.NewRoot([]byte("gw-a/1"), gwKey) // a gateway key signing a reset in its own name
	asRoot, _ := auth.NewRoot([]byte("operator"), gwKey)
	cmd, err := gw.Sign(env("dev-1", 9, 1))
	if err != nil {
		t.Fatal(err)
	}
	cert, err := c.root.Certify([]byte("gw-b/1"), &gwKey.PublicKey, []string{"*"}, c.now, c.now.AddDate(1, 0, 0), 1)
	if err != nil {
		t.Fatal(err)
	}
	epoch, err := c.root.Epoch(9, c.now)
	if err != nil {
		t.Fatal(err)
	}
	mustReset := func(r *auth.Root, rs auth.Reset) []byte {
		b, err := r.Reset(rs)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, tc := range []struct {
		name string
		raw  []byte
		dev  string
		want error
	}{
		{"another device", raw, "dev-2", auth.ErrResetDevice},
		{"a gateway key, its own kid", mustReset(gwRoot, reset("dev-1", 812, 6)), "dev-1", auth.ErrUnknownKey},
		{"a gateway key under the root's kid", mustReset(asRoot, reset("dev-1", 812, 6)), "dev-1", auth.ErrBadSignature},
		{"another root", raw2, "dev-1", auth.ErrBadSignature},
		{"a signed command", cmd, "dev-1", auth.ErrMalformed},
		{"a certificate", cert, "dev-1", auth.ErrMalformed},
		{"an epoch statement", epoch, "dev-1", auth.ErrMalformed},
		{"unsigned", []byte{0xa1, 0x01, 0x01}, "dev-1", auth.ErrUnsigned},
		{"truncated", raw[:len(raw)-1], "dev-1", auth.ErrMalformed},
		{"oversized", append(raw, make([]byte, auth.MaxResetSize)...), "dev-1", auth.ErrMalformed},
	} {
		r, err := c.trust.VerifyReset(tc.raw, tc.dev)
		if r != nil || !errors.Is(err, tc.want) || !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("%s: %+v, %v; want %v", tc.name, r, err, tc.want)
		}
	}
	if auth.IsReset(cmd) || auth.IsReset(cert) || auth.IsReset(epoch) || auth.IsReset([]byte{0xd2, 0x84}) {
		t.Error("IsReset: true for something else")
	}
	// Every single-bit flip is refused.
	for i := range len(raw) * 8 {
		b := append([]byte(nil), raw...)
		b[i/8] ^= 1 << (i % 8)
		if _, err := c.trust.VerifyReset(b, "dev-1"); !errors.Is(err, fence.ErrInvalid) {
			t.Fatalf("bit %d flipped: %v", i, err)
		}
	}
	// Nothing invalid is signed.
	for _, bad := range []auth.Reset{
		{Device: "dev-1", Token: 0, Seq: 1, Counter: 1, ID: "reset:x", Epoch: 1},
		{Device: "dev-1", Token: 1, Seq: 0, Counter: 1, ID: "reset:x", Epoch: 1},
		{Device: "dev-1", Token: 1, Seq: 1, Counter: 0, ID: "reset:x", Epoch: 1},
		{Device: "dev-1", Token: 1, Seq: 1, Counter: 1, ID: "0123", Epoch: 1},
		{Device: "dev/1", Token: 1, Seq: 1, Counter: 1, ID: "reset:x", Epoch: 1},
		{Device: "dev-1", Token: 1, Seq: 1, Counter: 1, ID: "reset:x"}, // no epoch
	} {
		if _, err := c.root.Reset(bad); !errors.Is(err, auth.ErrMalformed) {
			t.Errorf("signed %+v: %v", bad, err)
		}
	}
}

// The replay rule a fence point applies with the stored record and the
// device's epoch: the counter above the last reset's, the epoch above the
// device's.
func TestCheckReset(t *testing.T) {
	last := fence.ResetRecord{Counter: 5, Epoch: 7, ID: "reset:a"}
	for _, tc := range []struct {
		e, counter, epoch uint64
		ok                bool
	}{
		{7, 1, 8, false}, {7, 4, 8, false}, {7, 5, 8, false}, // counter replayed
		{7, 6, 7, false}, {7, 6, 3, false}, {9, 6, 9, false}, // epoch not above the device's
		{7, 6, 8, true}, {9, 6, 10, true},
	} {
		err := fence.CheckReset(last, tc.e, tc.counter, tc.epoch)
		if tc.ok != (err == nil) || !tc.ok && (!errors.Is(err, auth.ErrReplayedReset) || !errors.Is(err, fence.ErrInvalid)) {
			t.Errorf("counter %d epoch %d after %+v at epoch %d: %v", tc.counter, tc.epoch, last, tc.e, err)
		}
	}
	if err := fence.CheckReset(fence.ResetRecord{}, 0, 1, 1); err != nil {
		t.Error(err)
	}
}

// A reset without key 7 (as one signed before epochs existed) is refused
// malformed: it cannot say which epoch it opens.
func TestResetWithoutEpoch(t *testing.T) {
	c := newChain(t)
	r := reset("dev-1", 812, 5)
	r.Epoch = 0
	raw, err := c.root.Forge(auth.ContentReset, r)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := c.trust.VerifyReset(raw, "dev-1"); got != nil || !errors.Is(err, auth.ErrMalformed) {
		t.Fatalf("%+v %v", got, err)
	}
}

func FuzzVerifyReset(f *testing.F) {
	c := newChain(f)
	good, err := c.root.Reset(reset("dev-1", 812, 5))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	if ep, err := c.root.Epoch(7, c.now); err == nil {
		f.Add(ep) // another kind of root statement
	}
	f.Add([]byte{0xd2, 0x84, 0x40, 0xa0, 0x40, 0x40})
	f.Add([]byte{0xd2, 0x84, 0x41, 0xa0})
	f.Fuzz(func(t *testing.T, raw []byte) {
		_ = auth.IsReset(raw)
		r, err := c.trust.VerifyReset(raw, "dev-1")
		if err == nil && (r == nil || r.Device != "dev-1" || r.Validate() != nil) {
			t.Fatalf("accepted %+v", r)
		}
		if err != nil && !errors.Is(err, fence.ErrInvalid) {
			t.Fatalf("refusal does not wrap fence.ErrInvalid: %v", err)
		}
		if p, err := auth.PeekReset(raw); err == nil && p == nil {
			t.Fatal("PeekReset: nil without an error")
		}
	})
}

// BenchmarkResetVerify is the signature check of a reset at a fence point
// (docs/BENCHMARKS.md, "Authorised fence reset").
func BenchmarkResetVerify(b *testing.B) {
	c := newChain(b)
	raw, err := c.root.Reset(reset("dev-1", 812, 5))
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := c.trust.VerifyReset(raw, "dev-1"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkIsReset is what a signed command pays for the dispatch: the
// protected header read, the command not a reset.
func BenchmarkIsReset(b *testing.B) {
	s, _ := world(b)
	raw, err := s.Sign(env("dev-1", 7, 3))
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if auth.IsReset(raw) {
			b.Fatal("a command is not a reset")
		}
	}
}
