package auth_test

import (
	"bytes"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/fxamacker/cbor/v2"
	"go.etcd.io/bbolt"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
)

// statements returns a certificate (kid, serial) and a revocation list
// (version, revoking revoked) signed by c's root.
func (c *chain) cert(t testing.TB, kid string, serial uint64) []byte {
	t.Helper()
	k := newKey(t)
	raw, err := c.root.Certify([]byte(kid), &k.PublicKey, []string{"dev-*"}, c.now.Add(-time.Hour), c.now.Add(time.Hour), serial)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func (c *chain) list(t testing.TB, version uint64, revoked ...string) []byte {
	t.Helper()
	var kids [][]byte
	for _, k := range revoked {
		kids = append(kids, []byte(k))
	}
	raw, err := c.root.Revoke(version, kids, c.now)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func update(t testing.TB, stmts ...[]byte) []byte {
	t.Helper()
	raw, err := auth.MarshalUpdate(stmts)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func TestUpdateCodec(t *testing.T) {
	c := newChain(t)
	cert, list := c.cert(t, "gw-1", 1), c.list(t, 1)
	raw := update(t, cert, list)
	if !auth.IsUpdate(raw) || raw[0] != 0x82 {
		t.Fatalf("update starts %#x", raw[0])
	}
	// The same bytes as the CBOR library's deterministic encoding.
	if want, _ := cbor.Marshal([][]byte{cert, list}); !bytes.Equal(raw, want) {
		t.Fatal("update is not the deterministic CBOR array of byte strings")
	}
	got, err := auth.ParseUpdate(raw)
	if err != nil || len(got) != 2 || !bytes.Equal(got[0], cert) || !bytes.Equal(got[1], list) {
		t.Fatalf("round trip: %v", err)
	}
	for _, n := range []int{1, 23, 24, 255, 256, 65535, auth.MaxTrustSize} {
		s := bytes.Repeat([]byte{7}, n)
		if got, err := auth.ParseUpdate(update(t, s)); err != nil || !bytes.Equal(got[0], s) {
			t.Fatalf("statement of %d bytes: %v", n, err)
		}
	}
	nine := make([][]byte, 9)
	for i := range nine {
		nine[i] = []byte{1}
	}
	for _, bad := range [][][]byte{nil, nine, {{}}, {make([]byte, auth.MaxTrustSize+1)}} {
		if _, err := auth.MarshalUpdate(bad); err == nil {
			t.Errorf("MarshalUpdate of %d statements accepted", len(bad))
		}
	}

	for name, raw := range map[string][]byte{
		"empty":             nil,
		"empty array":       {0x80},
		"nine":              append([]byte{0x89}, bytes.Repeat([]byte{0x41, 1}, 9)...),
		"long array head":   {0x98, 0x01, 0x41, 1},
		"indefinite array":  {0x9f, 0x41, 1, 0xff},
		"text statement":    {0x81, 0x61, 'a'},
		"empty statement":   {0x81, 0x40},
		"indefinite bytes":  {0x81, 0x5f, 0x41, 1, 0xff},
		"non-shortest head": {0x81, 0x58, 0x01, 1},
		"8-byte head":       {0x81, 0x5b, 0, 0, 0, 0, 0, 0, 0, 1, 1},
		"truncated":         {0x81, 0x43, 1, 2},
		"missing":           {0x82, 0x41, 1},
		"trailing":          {0x81, 0x41, 1, 0},
		"tagged statement":  {0x81, 0xd8, 0x18, 0x41, 1},
		"map":               {0xa1, 0x01, 0x01},
		"oversize":          append([]byte{0x81, 0x5a, 0, 2, 0, 0}, make([]byte, auth.MaxUpdateSize)...),
	} {
		if _, err := auth.ParseUpdate(raw); !errors.Is(err, auth.ErrMalformed) || !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestTrustApply: Apply dispatches on the content type; versions and
// serials only go up; Statements gives back what a Trust holds, and a
// fresh Trust fed them holds the same.
func TestTrustApply(t *testing.T) {
	c := newChain(t)
	cert1, cert2, list1, list2 := c.cert(t, "gw-1", 1), c.cert(t, "gw-1", 2), c.list(t, 1), c.list(t, 2, "gw-9")
	for _, step := range []struct {
		raw  []byte
		want error
	}{
		{cert1, nil}, {cert1, auth.ErrHeld}, {cert2, nil}, {cert1, auth.ErrStaleTrust},
		{list2, nil}, {list2, auth.ErrHeld}, {list1, auth.ErrStaleTrust},
	} {
		st, err := c.trust.Apply(step.raw)
		if step.want == nil && (err != nil || st == nil) || step.want != nil && !errors.Is(err, step.want) {
			t.Fatalf("apply: %v, want %v", err, step.want)
		}
	}
	if c.trust.Version() != 2 {
		t.Fatalf("version %d", c.trust.Version())
	}
	if _, err := c.trust.Key([]byte("gw-9"), "dev-1"); !errors.Is(err, auth.ErrUnknownKey) {
		t.Fatal(err)
	}
	held := c.trust.Statements()
	if len(held) != 2 || !bytes.Equal(held[0], cert2) || !bytes.Equal(held[1], list2) {
		t.Fatalf("statements: %d", len(held))
	}
	if l, v := c.trust.RevocationList(); v != 2 || !bytes.Equal(l, list2) {
		t.Fatalf("revocation list %d", v)
	}
	fresh := mustTrustLike(t, c)
	for _, raw := range held {
		if _, err := fresh.Apply(raw); err != nil {
			t.Fatal(err)
		}
	}
	if fresh.Version() != 2 || len(fresh.Statements()) != 2 {
		t.Fatal("statements do not carry over")
	}

	// Not a statement of this root, or not one an update carries: refused.
	other := newChain(t)
	cmdSigner, _ := auth.NewSigner([]byte("operator"), c.rk) // the root's own key, no content type
	cmd, err := cmdSigner.Sign(env("dev-1", 1, 1))
	if err != nil {
		t.Fatal(err)
	}
	for name, raw := range map[string][]byte{
		"foreign certificate": other.cert(t, "gw-x", 9),
		"foreign list":        other.list(t, 99, "gw-1"),
		"root-signed command": cmd,
		"garbage":             {0xd2, 0x84, 0x40},
	} {
		if _, err := c.trust.Apply(raw); !errors.Is(err, fence.ErrInvalid) || errors.Is(err, auth.ErrStaleTrust) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if c.trust.Version() != 2 || len(c.trust.Statements()) != 2 {
		t.Fatal("a refused statement changed the trust")
	}
}

// mustTrustLike returns an empty Trust anchored where c's is.
func mustTrustLike(t *testing.T, c *chain) *auth.Trust {
	t.Helper()
	tr, err := auth.NewTrust([]byte("operator"), &c.rk.PublicKey, func() time.Time { return c.now })
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func openDB(t *testing.T, path string) *bbolt.DB {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return db
}

// TestLedger: what an update brings is durable before it takes effect and
// comes back on reopen; an older list replayed after the reopen is
// refused; an update with one statement not of the root changes nothing.
func TestLedger(t *testing.T) {
	c := newChain(t)
	path := filepath.Join(t.TempDir(), "trust.db")
	db := openDB(t, path)
	l, replay, err := auth.OpenLedger(c.trust, db, []byte("trust"))
	if err != nil || replay.Applied+replay.Held+replay.Refused != 0 {
		t.Fatalf("open: %v %+v", err, replay)
	}
	cert, list1, list2 := c.cert(t, "gw-1", 1), c.list(t, 1), c.list(t, 2, "gw-0")
	got, err := l.Learn(update(t, cert, list2))
	if err != nil || got.Applied != 2 {
		t.Fatalf("learn: %v %+v", err, got)
	}
	got, err = l.Learn(update(t, cert, list1))
	if err != nil || got.Held != 1 || got.Refused != 1 || !errors.Is(got.Refusals[0], auth.ErrStaleTrust) {
		t.Fatalf("older list: %v %+v", err, got)
	}
	other := newChain(t)
	forged := update(t, c.cert(t, "gw-2", 1), other.list(t, 9))
	if got, err := l.Learn(forged); !errors.Is(err, auth.ErrBadSignature) || got.Refused != 2 || got.Applied != 0 {
		t.Fatalf("forged: %v %+v", err, got)
	}
	if _, err := c.trust.Key([]byte("gw-2"), "dev-1"); !errors.Is(err, auth.ErrUnknownKey) {
		t.Fatalf("the forged update's good certificate took effect: %v", err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	// A restart: a Trust with only the root, the ledger replayed.
	db = openDB(t, path)
	defer db.Close()
	fresh := mustTrustLike(t, c)
	l, replay, err = auth.OpenLedger(fresh, db, []byte("trust"))
	if err != nil || replay.Applied != 2 || fresh.Version() != 2 {
		t.Fatalf("replay: %v %+v version %d", err, replay, fresh.Version())
	}
	if _, err := fresh.Key([]byte("gw-1"), "dev-1"); err != nil {
		t.Fatalf("learned certificate lost: %v", err)
	}
	if got, err := l.Learn(update(t, list1)); err != nil || got.Refused != 1 || fresh.Version() != 2 {
		t.Fatalf("older list after restart: %v %+v", err, got)
	}
	if got, _ := l.Learn([]byte{0x81, 0x40}); got.Refused != 1 {
		t.Fatalf("malformed: %+v", got)
	}
}

// FuzzUpdate: ParseUpdate and Ledger.Learn never panic; whatever is fed,
// the revocation version and the epoch never go down, and nothing but the
// root's statements is ever held. The seeds are the epoch statement cases
// of TestEpochStatementRefusals too, each in an update.
func FuzzUpdate(f *testing.F) {
	c := newChain(f)
	cert, list, epoch := c.cert(f, "gw-1", 1), c.list(f, 3, "gw-0"), c.epoch(f, 5)
	for _, seed := range [][]byte{
		update(f, cert, list), update(f, list), update(f, cert, list, epoch), update(f, epoch),
		{0x81, 0x41, 1}, {0x80}, {0x9f, 0xff}, {0x81, 0x5a, 0xff, 0xff, 0xff, 0xff},
	} {
		f.Add(seed)
	}
	for _, tc := range epochCases(f, c) {
		if len(tc.raw) > 0 && len(tc.raw) <= auth.MaxTrustSize {
			f.Add(update(f, tc.raw))
		}
	}
	l, _, err := auth.OpenLedger(c.trust, nil, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		before, epochBefore := c.trust.Version(), c.trust.Epoch()
		n := len(c.trust.Statements())
		if stmts, err := auth.ParseUpdate(raw); err == nil {
			if back, err := auth.MarshalUpdate(stmts); err != nil || !bytes.Equal(back, raw) {
				t.Fatalf("parsed update does not marshal back: %v", err)
			}
		}
		got, err := l.Learn(raw)
		if err != nil && got.Applied != 0 {
			t.Fatalf("refused update applied %d", got.Applied)
		}
		if c.trust.Version() < before || c.trust.Epoch() < epochBefore || len(c.trust.Statements()) < n {
			t.Fatal("trust went back")
		}
		if got.Applied > 0 {
			for _, s := range c.trust.Statements() {
				if !bytes.Equal(s, cert) && !bytes.Equal(s, list) && !bytes.Equal(s, epoch) {
					t.Fatal("a statement the root did not sign is held")
				}
			}
		}
	})
}

// LearnEach takes statements read one by one: one that is not the root's
// is refused alone, the newer others are committed together and kept.
func TestLedgerLearnEach(t *testing.T) {
	c := newChain(t)
	path := filepath.Join(t.TempDir(), "trust.db")
	db := openDB(t, path)
	l, _, err := auth.OpenLedger(c.trust, db, []byte("trust"))
	if err != nil {
		t.Fatal(err)
	}
	other := newChain(t)
	got, err := l.LearnEach([][]byte{c.cert(t, "gw-1", 1), other.cert(t, "gw-2", 1), c.list(t, 2, "gw-0"), c.cert(t, "gw-1", 1)})
	if err != nil || got.Applied != 2 || got.Refused != 1 || got.Held != 1 || !errors.Is(got.Refusals[0], auth.ErrBadSignature) {
		t.Fatalf("learn each: %v %+v", err, got)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = openDB(t, path)
	defer db.Close()
	fresh := mustTrustLike(t, c)
	if _, replay, err := auth.OpenLedger(fresh, db, []byte("trust")); err != nil || replay.Applied != 2 {
		t.Fatalf("replayed: %v %+v", err, replay)
	}
	if _, err := fresh.Key([]byte("gw-1"), "dev-1"); err != nil || fresh.Version() != 2 {
		t.Fatalf("after the replay: %v, list %d", err, fresh.Version())
	}
}
