package auth_test

import (
	"bytes"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
)

// epoch returns the root's statement that the fleet is at epoch n.
func (c *chain) epoch(t testing.TB, n uint64) []byte {
	t.Helper()
	raw, err := c.root.Epoch(n, c.now)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// An epoch statement is issued by the root, checked by a Trust, held
// (newer replaces, equal is held, older is refused alone), given back by
// Statements, and carried over to a fresh Trust.
func TestEpochStatement(t *testing.T) {
	c := newChain(t)
	e5, e7 := c.epoch(t, 5), c.epoch(t, 7)
	if len(e7) > auth.MaxEpochSize || len(e7) > 150 {
		t.Fatalf("epoch statement of %d bytes", len(e7))
	}
	if c.trust.Epoch() != 0 {
		t.Fatal("a fresh trust has an epoch")
	}
	st, err := c.trust.Check(e5)
	if err != nil || st.Content != auth.ContentEpoch || st.Epoch == nil || st.Epoch.Number != 5 ||
		st.Epoch.Issued != c.now.UnixMilli() || st.Slot() != "epoch" || st.Rank() != 5 {
		t.Fatalf("check: %+v %v", st, err)
	}
	if c.trust.Epoch() != 0 {
		t.Fatal("Check took the statement in")
	}
	for _, step := range []struct {
		raw  []byte
		want error
		held uint64
	}{
		{e5, nil, 5}, {e5, auth.ErrHeld, 5}, {e7, nil, 7}, {e5, auth.ErrStaleTrust, 7}, {e7, auth.ErrHeld, 7},
	} {
		if _, err := c.trust.Apply(step.raw); step.want == nil && err != nil || step.want != nil && !errors.Is(err, step.want) {
			t.Fatalf("apply: %v, want %v", err, step.want)
		}
		if c.trust.Epoch() != step.held {
			t.Fatalf("epoch %d, want %d", c.trust.Epoch(), step.held)
		}
	}
	if raw, n := c.trust.EpochStatement(); n != 7 || !bytes.Equal(raw, e7) {
		t.Fatalf("EpochStatement: %d", n)
	}
	cert := c.cert(t, "gw-1", 1)
	if _, err := c.trust.Apply(cert); err != nil {
		t.Fatal(err)
	}
	held := c.trust.Statements()
	if len(held) != 2 || !bytes.Equal(held[0], cert) || !bytes.Equal(held[1], e7) {
		t.Fatalf("statements: %d", len(held))
	}
	fresh := mustTrustLike(t, c)
	for _, raw := range held {
		if _, err := fresh.Apply(raw); err != nil {
			t.Fatal(err)
		}
	}
	if fresh.Epoch() != 7 {
		t.Fatalf("fresh trust at epoch %d", fresh.Epoch())
	}
	// Nothing of epoch 0 is issued.
	if _, err := c.root.Epoch(0, c.now); !errors.Is(err, auth.ErrMalformed) {
		t.Fatalf("epoch 0 issued: %v", err)
	}
}

type epochCase struct {
	name string
	raw  []byte
	want error
}

// epochCases are statements a Trust refuses as epoch statements, each
// with the sentinel it is refused with: forgeries, another signer, other
// kinds of statements under the epoch's content type, malformed payloads,
// bit flips, truncations.
func epochCases(t testing.TB, c *chain) []epochCase {
	t.Helper()
	good := c.epoch(t, 9)
	gwKey := newKey(t)
	gwRoot, _ := auth.NewRoot([]byte("gw-a/1"), gwKey) // a gateway key in its own name
	asRoot, _ := auth.NewRoot([]byte("operator"), gwKey)
	forge := func(r *auth.Root, v any) []byte {
		b, err := r.Forge(auth.ContentEpoch, v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	type payload map[int]any
	cases := []epochCase{
		{"a gateway key, its own kid", forge(gwRoot, auth.Epoch{Number: 9}), auth.ErrUnknownKey},
		{"a gateway key under the root's kid", forge(asRoot, auth.Epoch{Number: 9}), auth.ErrBadSignature},
		{"another root", newChain(t).epoch(t, 9), auth.ErrBadSignature},
		{"epoch 0", forge(c.root, auth.Epoch{Number: 0, Issued: 1}), auth.ErrMalformed},
		{"no epoch", forge(c.root, payload{2: 1}), auth.ErrMalformed},
		{"epoch negative", forge(c.root, payload{1: -1, 2: 1}), auth.ErrMalformed},
		{"epoch text", forge(c.root, payload{1: "9", 2: 1}), auth.ErrMalformed},
		{"unknown key 3", forge(c.root, payload{1: 9, 2: 1, 3: 0}), auth.ErrMalformed},
		{"a revocation list's payload", forge(c.root, auth.Revocations{Version: 9, KeyIDs: [][]byte{[]byte("gw-1")}}), auth.ErrMalformed},
		{"a reset's payload", forge(c.root, auth.Reset{Device: "dev-1", Token: 9, Seq: 1, Counter: 1, ID: "reset:x", Epoch: 9}), auth.ErrMalformed},
		{"over 1 KiB", forge(c.root, payload{1: 9, 2: 1, 3: strings.Repeat("p", auth.MaxEpochSize)}), auth.ErrMalformed},
		{"truncated", good[:len(good)-1], auth.ErrMalformed},
		{"trailing byte", append(bytes.Clone(good), 0), auth.ErrMalformed},
		{"unsigned", []byte{0xa2, 0x01, 0x09, 0x02, 0x01}, auth.ErrUnsigned},
	}
	for i := range len(good) * 8 {
		b := bytes.Clone(good)
		b[i/8] ^= 1 << (i % 8)
		cases = append(cases, epochCase{name: "bit flipped", raw: b, want: fence.ErrInvalid})
	}
	return cases
}

// Every forged or malformed epoch statement is refused, wrapping
// fence.ErrInvalid and its sentinel, and the epoch held stays.
func TestEpochStatementRefusals(t *testing.T) {
	c := newChain(t)
	if _, err := c.trust.Apply(c.epoch(t, 3)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range epochCases(t, c) {
		st, err := c.trust.Check(tc.raw)
		if st != nil || !errors.Is(err, tc.want) || !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("%s: %+v %v; want %v", tc.name, st, err, tc.want)
		}
		if _, err := c.trust.Apply(tc.raw); err == nil {
			t.Errorf("%s: applied", tc.name)
		}
	}
	if c.trust.Epoch() != 3 {
		t.Fatalf("epoch %d after refusals", c.trust.Epoch())
	}
}

// An epoch statement is never taken for another kind of signed object,
// and no other kind for an epoch statement: each names its kind in the
// protected content type.
func TestEpochContentTypeConfusion(t *testing.T) {
	c := newChain(t)
	epoch := c.epoch(t, 9)
	if _, err := c.trust.AddCertificate(epoch); !errors.Is(err, auth.ErrMalformed) {
		t.Errorf("as a certificate: %v", err)
	}
	if err := c.trust.ApplyRevocations(epoch); !errors.Is(err, auth.ErrMalformed) {
		t.Errorf("as a revocation list: %v", err)
	}
	if _, err := c.trust.VerifyReset(epoch, "dev-1"); !errors.Is(err, auth.ErrMalformed) {
		t.Errorf("as a reset: %v", err)
	}
	if auth.IsReset(epoch) || auth.IsUpdate(epoch) {
		t.Error("dispatched as a reset or a trust update")
	}
	if _, err := auth.Verify(epoch, c.trust); !errors.Is(err, auth.ErrMalformed) {
		t.Errorf("as a command: %v", err)
	}
	if _, err := auth.VerifyAck(epoch, c.trust); !errors.Is(err, auth.ErrMalformed) {
		t.Errorf("as an ack: %v", err)
	}
	if _, err := auth.VerifyState(epoch, c.trust); !errors.Is(err, auth.ErrMalformed) {
		t.Errorf("as a state report: %v", err)
	}
	if c.trust.Epoch() != 0 || c.trust.Version() != 0 || len(c.trust.Statements()) != 0 {
		t.Fatal("a refusal changed the trust")
	}
	// The other way round: the root's other statements never raise the
	// epoch, and a command or reset is not a statement an update carries.
	reset, err := c.root.Reset(reset("dev-1", 9, 1))
	if err != nil {
		t.Fatal(err)
	}
	rootCmd, _ := auth.NewSigner([]byte("operator"), c.rk)
	cmd, err := rootCmd.Sign(env("dev-1", 9, 1))
	if err != nil {
		t.Fatal(err)
	}
	for name, raw := range map[string][]byte{"reset": reset, "command": cmd} {
		if _, err := c.trust.Check(raw); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("%s checked as a statement: %v", name, err)
		}
	}
	for _, raw := range [][]byte{c.cert(t, "gw-1", 9), c.list(t, 9)} {
		if st, err := c.trust.Apply(raw); err != nil || st.Epoch != nil {
			t.Fatalf("%+v %v", st, err)
		}
	}
	if c.trust.Epoch() != 0 {
		t.Fatalf("epoch %d from a certificate or a list", c.trust.Epoch())
	}
}

// The ledger keeps the epoch slot: an update's epoch statement is
// committed before it takes effect, comes back on reopen, a newer one
// replaces it, and a replayed older one is refused alone (the rest of its
// update is taken).
func TestLedgerEpoch(t *testing.T) {
	c := newChain(t)
	path := filepath.Join(t.TempDir(), "trust.db")
	db := openDB(t, path)
	l, _, err := auth.OpenLedger(c.trust, db, []byte("trust"))
	if err != nil {
		t.Fatal(err)
	}
	e5, e8 := c.epoch(t, 5), c.epoch(t, 8)
	if got, err := l.Learn(update(t, e5)); err != nil || got.Applied != 1 || c.trust.Epoch() != 5 {
		t.Fatalf("learn: %v %+v", err, got)
	}
	if got, err := l.Learn(update(t, e8, c.cert(t, "gw-1", 1))); err != nil || got.Applied != 2 || c.trust.Epoch() != 8 {
		t.Fatalf("newer: %v %+v", err, got)
	}
	got, err := l.Learn(update(t, e5, c.cert(t, "gw-2", 1)))
	if err != nil || got.Applied != 1 || got.Refused != 1 || !errors.Is(got.Refusals[0], auth.ErrStaleTrust) || c.trust.Epoch() != 8 {
		t.Fatalf("replayed older: %v %+v epoch %d", err, got, c.trust.Epoch())
	}
	if got, _ := l.Learn(update(t, e8)); got.Held != 1 {
		t.Fatalf("the same again: %+v", got)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = openDB(t, path)
	defer db.Close()
	fresh := mustTrustLike(t, c)
	if _, replay, err := auth.OpenLedger(fresh, db, []byte("trust")); err != nil || fresh.Epoch() != 8 || replay.Applied != 3 {
		t.Fatalf("replay: %v %+v epoch %d", err, replay, fresh.Epoch())
	}
}

// NeedsTrust tells the refusals a trust update cures by their reason, as
// every fence point words it.
func TestNeedsTrust(t *testing.T) {
	unknown := (&fence.EpochError{Command: 9, FencePoint: 7}).Error()
	closed := (&fence.EpochError{Command: 5, FencePoint: 7}).Error()
	if unknown != "unknown epoch 9: the fence point is at epoch 7" || closed != "epoch 5 closed: the fence point is at epoch 7" {
		t.Fatalf("reasons %q, %q", unknown, closed)
	}
	ack := func(v fence.Verdict, id, reason string) *fence.Ack {
		return &fence.Ack{V: 1, Device: "dev-1", ID: id, Verdict: v, Reason: reason}
	}
	for _, tc := range []struct {
		a    *fence.Ack
		want bool
	}{
		{ack(fence.Invalid, "c1", "unknown signer key"), true}, // the C library's wording, and now Go's
		{ack(fence.Invalid, "c1", "unknown signer key: no certificate for 6777"), true},
		{ack(fence.Invalid, "c1", unknown), true},
		{ack(fence.Stale, "c1", closed), false},
		{ack(fence.Stale, "c1", unknown), false},
		{ack(fence.Invalid, "reset:x", "unknown signer key"), false},
		{ack(fence.Invalid, "c1", "signer key revoked"), false},
		{ack(fence.Invalid, "c1", "bad signature"), false},
		{ack(fence.Invalid, "c1", "unknown signer keys"), false},
		{ack(fence.Invalid, "c1", ""), false},
		{ack(fence.Accepted, "c1", ""), false},
		{nil, false},
	} {
		if got := auth.NeedsTrust(tc.a); got != tc.want {
			t.Errorf("%+v: %v, want %v", tc.a, got, tc.want)
		}
	}
	// What a fence point writes for Verify's refusals.
	c := newChain(t)
	stranger, _ := auth.NewSigner([]byte("gw-x"), newKey(t))
	raw, err := stranger.Sign(env("dev-1", 9, 1))
	if err != nil {
		t.Fatal(err)
	}
	_, err = auth.Verify(raw, c.trust)
	if r := auth.Reason(err); r != auth.ReasonUnknownKey || !auth.NeedsTrust(ack(fence.Invalid, "c1", r)) {
		t.Fatalf("reason %q for %v", r, err)
	}
	revoked := errors.Join(auth.ErrRevoked)
	if r := auth.Reason(revoked); auth.NeedsTrust(ack(fence.Invalid, "c1", r)) {
		t.Fatalf("revoked: %q", r)
	}
	if r := auth.Reason(&fence.EpochError{Command: 9, FencePoint: 7}); r != unknown {
		t.Fatalf("epoch: %q", r)
	}
}
