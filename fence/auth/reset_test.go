package auth_test

import (
	"errors"
	"testing"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
)

func reset(dev string, tok fence.Token, counter uint64) auth.Reset {
	return auth.Reset{Device: dev, Token: tok, Seq: 1<<64 - 1, Counter: counter, ID: "reset:test-1", Issued: 1_800_000_000_000}
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
		if err != nil || r.Mark() != (fence.Mark{Token: 812, Seq: 1<<64 - 1}) || r.Counter != 5 || r.ID != "reset:test-1" {
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
		{"unsigned", []byte{0xa1, 0x01, 0x01}, "dev-1", auth.ErrUnsigned},
		{"truncated", raw[:len(raw)-1], "dev-1", auth.ErrMalformed},
		{"oversized", append(raw, make([]byte, auth.MaxResetSize)...), "dev-1", auth.ErrMalformed},
	} {
		r, err := c.trust.VerifyReset(tc.raw, tc.dev)
		if r != nil || !errors.Is(err, tc.want) || !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("%s: %+v, %v; want %v", tc.name, r, err, tc.want)
		}
	}
	if auth.IsReset(cmd) || auth.IsReset(cert) || auth.IsReset([]byte{0xd2, 0x84}) {
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
		{Device: "dev-1", Token: 0, Seq: 1, Counter: 1, ID: "reset:x"},
		{Device: "dev-1", Token: 1, Seq: 0, Counter: 1, ID: "reset:x"},
		{Device: "dev-1", Token: 1, Seq: 1, Counter: 0, ID: "reset:x"},
		{Device: "dev-1", Token: 1, Seq: 1, Counter: 1, ID: "0123"},
		{Device: "dev/1", Token: 1, Seq: 1, Counter: 1, ID: "reset:x"},
	} {
		if _, err := c.root.Reset(bad); !errors.Is(err, auth.ErrMalformed) {
			t.Errorf("signed %+v: %v", bad, err)
		}
	}
}

// The replay rule a fence point applies with the stored record.
func TestCheckReset(t *testing.T) {
	last := fence.ResetRecord{Counter: 5, ID: "reset:a"}
	for _, n := range []uint64{1, 4, 5} {
		if err := fence.CheckReset(last, n); !errors.Is(err, auth.ErrReplayedReset) || !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("counter %d after 5: %v", n, err)
		}
	}
	if err := fence.CheckReset(last, 6); err != nil {
		t.Error(err)
	}
	if err := fence.CheckReset(fence.ResetRecord{}, 1); err != nil {
		t.Error(err)
	}
}

func FuzzVerifyReset(f *testing.F) {
	c := newChain(f)
	good, err := c.root.Reset(reset("dev-1", 812, 5))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
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
