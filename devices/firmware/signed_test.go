package firmware

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/sha256"
	"encoding/asn1"
	"fmt"
	"math/big"
	"math/rand/v2"
	"path/filepath"
	"strings"

	"github.com/edgefence/edgefence/devices/shim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
)

// The signed vectors' keys: gw-a may command every device, gw-b only
// dev-b, gw-x is unknown to the fence point. Fixed scalars and RFC 6979
// signatures keep the header the same from one generation to the next.
type vkey struct {
	kid     string
	priv    *ecdsa.PrivateKey
	known   bool
	devices []string // nil: all
}

var vkeys = func() []vkey {
	mk := func(kid string, b byte, known bool, devs ...string) vkey {
		k, err := ecdsa.ParseRawPrivateKey(elliptic.P256(), bytes.Repeat([]byte{b}, 32))
		if err != nil {
			panic(err)
		}
		return vkey{kid, k, known, devs}
	}
	return []vkey{mk("gw-a", 0x0a, true), mk("gw-b", 0x0b, true, "dev-b"), mk("gw-x", 0x0c, false),
		mk("operator", 0x0d, false)} // the operator's root: signs resets, never commands
}()

func findKey(kid string) *vkey {
	for i := range vkeys {
		if vkeys[i].kid == kid {
			return &vkeys[i]
		}
	}
	return nil
}

// vectorKeys is the fence point's auth.Keys: vkeys' known keys.
type vectorKeys struct{}

func (vectorKeys) Key(kid []byte, device string) (*ecdsa.PublicKey, error) {
	k := findKey(string(kid))
	switch {
	case k == nil || !k.known:
		return nil, fmt.Errorf("%w: %w: %q", fence.ErrInvalid, auth.ErrUnknownKey, kid)
	case k.devices != nil && !strings.Contains(strings.Join(k.devices, " "), device):
		return nil, fmt.Errorf("%w: %w: %q for %s", fence.ErrInvalid, auth.ErrNotAuthorised, kid, device)
	}
	return &k.priv.PublicKey, nil
}

// cose is one signed command's parts, put together by bytes().
type cose struct {
	prefix      []byte // tag and array head
	protected   []byte // the protected header's map (wrapped in a bstr by pbstr)
	pbstr       func([]byte) []byte
	unprotected []byte
	payload     []byte // a whole item (normally bstr(envelope))
	sig         []byte // a whole item; nil: sign
	signer      string
	tail        []byte
}

func bstrOf(b []byte) []byte { return append(hd(2, uint64(len(b))), b...) }

func newCose(kid string, env []byte) *cose {
	return &cose{prefix: []byte{0xd2, 0x84}, protected: cat(hd(5, 2), u(1), neg(6), u(4), bstr(kid)), pbstr: bstrOf,
		unprotected: hd(5, 0), payload: bstrOf(env), signer: kid}
}

// bytes signs (unless sig is set) the Sig_structure as go-cose builds it:
// the protected header's bytes with a shortest head, the payload's bytes.
func (c *cose) bytes() []byte {
	sig := c.sig
	if sig == nil {
		var payload []byte
		r := &efsReader{b: c.payload}
		payload = r.bstrContent()
		tbs := cat(hd(4, 4), tstr("Signature1"), bstrOf(c.protected), hd(2, 0), bstrOf(payload))
		sig = bstrOf(es256(findKey(c.signer).priv, tbs))
	}
	return cat(c.prefix, c.pbstr(c.protected), c.unprotected, c.payload, sig, c.tail)
}

// es256 is the deterministic (RFC 6979) ES256 signature r || s of tbs.
func es256(priv *ecdsa.PrivateKey, tbs []byte) []byte {
	digest := sha256.Sum256(tbs)
	der, err := priv.Sign(nil, digest[:], crypto.SHA256)
	if err != nil {
		panic(err)
	}
	var rs struct{ R, S *big.Int }
	if _, err := asn1.Unmarshal(der, &rs); err != nil {
		panic(err)
	}
	raw := make([]byte, 64)
	rs.R.FillBytes(raw[:32])
	rs.S.FillBytes(raw[32:])
	return raw
}

// efsReader reads a byte string's content (any head width), for signing
// a payload written with a long head.
type efsReader struct{ b []byte }

func (r *efsReader) bstrContent() []byte {
	if len(r.b) == 0 || r.b[0]>>5 != 2 {
		return nil
	}
	ai := r.b[0] & 0x1f
	if ai < 24 {
		return r.b[1:]
	}
	return r.b[1+(1<<(ai-24)):]
}

func signedEnv(dev string, t fence.Token, seq uint64) []byte {
	return mustEnvelope(fence.Envelope{Device: dev, Token: t, Seq: seq, ID: fmt.Sprintf("s-%d-%d", t, seq), Kind: "set"})
}

// signedCorpus is every signed input for dev: valid ones, each COSE rule
// at and past its edge, forgeries, truncations and mutations.
func signedCorpus(dev string) []decodeCase {
	var cs []decodeCase
	env := signedEnv(dev, 7, 1)
	add := func(name string, c *cose) { cs = append(cs, decodeCase{name, c.bytes()}) }
	mod := func(f func(c *cose)) *cose { c := newCose("gw-a", env); f(c); return c }
	add("signed by gw-a", newCose("gw-a", env))
	add("signed by gw-b (not for this device)", newCose("gw-b", env))
	add("signed by gw-x (unknown)", newCose("gw-x", env))
	add("gw-b's signature, kid gw-a", mod(func(c *cose) { c.signer = "gw-b" }))
	add("labels kid, alg", mod(func(c *cose) { c.protected = cat(hd(5, 2), u(4), bstr("gw-a"), u(1), neg(6)) }))
	add("alg in 2 bytes", mod(func(c *cose) { c.protected = cat(hd(5, 2), u(1), hw(1, 24, 6), u(4), bstr("gw-a")) }))
	add("label 4 in 8 bytes", mod(func(c *cose) { c.protected = cat(hd(5, 2), u(1), neg(6), hw(0, 27, 4), bstr("gw-a")) }))
	add("map head in 2 bytes", mod(func(c *cose) { c.protected = cat(hw(5, 24, 2), u(1), neg(6), u(4), bstr("gw-a")) }))
	add("protected bstr head in 2 bytes", mod(func(c *cose) { c.pbstr = func(b []byte) []byte { return cat(hw(2, 24, uint64(len(b))), b) } }))
	add("payload head in 3 bytes", mod(func(c *cose) { c.payload = cat(hw(2, 25, uint64(len(env))), env) }))
	add("unprotected empty map in 2 bytes", mod(func(c *cose) { c.unprotected = hw(5, 24, 0) }))
	for name, p := range map[string][]byte{
		"alg ES384":             cat(hd(5, 2), u(1), neg(34), u(4), bstr("gw-a")),
		"alg EdDSA":             cat(hd(5, 2), u(1), neg(7), u(4), bstr("gw-a")),
		"alg 7":                 cat(hd(5, 2), u(1), u(7), u(4), bstr("gw-a")),
		"alg text":              cat(hd(5, 2), u(1), tstr("ES256"), u(4), bstr("gw-a")),
		"alg tagged":            cat(hd(5, 2), u(1), []byte{0xc1}, neg(6), u(4), bstr("gw-a")),
		"no alg":                cat(hd(5, 1), u(4), bstr("gw-a")),
		"no kid":                cat(hd(5, 1), u(1), neg(6)),
		"alg twice":             cat(hd(5, 3), u(1), neg(6), u(4), bstr("gw-a"), u(1), neg(6)),
		"kid twice":             cat(hd(5, 3), u(1), neg(6), u(4), bstr("gw-a"), hw(0, 24, 4), bstr("gw-a")),
		"kid text":              cat(hd(5, 2), u(1), neg(6), u(4), tstr("gw-a")),
		"kid empty":             cat(hd(5, 2), u(1), neg(6), u(4), bstr("")),
		"kid of 64":             cat(hd(5, 2), u(1), neg(6), u(4), bstr(strings.Repeat("k", 64))),
		"kid of 65":             cat(hd(5, 2), u(1), neg(6), u(4), bstr(strings.Repeat("k", 65))),
		"content type":          cat(hd(5, 3), u(1), neg(6), u(3), tstr("x"), u(4), bstr("gw-a")),
		"content type 0":        cat(hd(5, 3), u(1), neg(6), u(3), u(0), u(4), bstr("gw-a")),
		"critical":              cat(hd(5, 3), u(1), neg(6), u(2), cat(hd(4, 1), u(1)), u(4), bstr("gw-a")),
		"label text alg":        cat(hd(5, 3), u(1), neg(6), tstr("alg"), neg(6), u(4), bstr("gw-a")),
		"label -1":              cat(hd(5, 3), u(1), neg(6), neg(0), u(0), u(4), bstr("gw-a")),
		"trailing byte":         cat(hd(5, 2), u(1), neg(6), u(4), bstr("gw-a"), u(0)),
		"array":                 cat(hd(4, 2), u(1), neg(6)),
		"empty":                 nil,
		"indefinite map":        cat([]byte{0xbf}, u(1), neg(6), u(4), bstr("gw-a"), []byte{0xff}),
		"empty map":             hd(5, 0),
		"kid of 64, alg second": cat(hd(5, 2), u(4), bstr(strings.Repeat("k", 64)), u(1), neg(6)),
	} {
		add("protected: "+name, mod(func(c *cose) { c.protected = p }))
	}
	for name, f := range map[string]func(c *cose){
		"untagged":                   func(c *cose) { c.prefix = []byte{0x84} },
		"tag 98":                     func(c *cose) { c.prefix = []byte{0xd8, 0x62, 0x84} },
		"tag 18 in 2 bytes":          func(c *cose) { c.prefix = []byte{0xd8, 0x12, 0x84} },
		"array of 4 in 2 bytes":      func(c *cose) { c.prefix = []byte{0xd2, 0x98, 0x04} },
		"array of 5":                 func(c *cose) { c.prefix = []byte{0xd2, 0x85}; c.tail = u(0) },
		"trailing byte":              func(c *cose) { c.tail = u(0) },
		"unprotected kid":            func(c *cose) { c.unprotected = cat(hd(5, 1), u(4), bstr("gw-a")) },
		"unprotected null":           func(c *cose) { c.unprotected = []byte{0xf6} },
		"unprotected array":          func(c *cose) { c.unprotected = hd(4, 0) },
		"payload null (detached)":    func(c *cose) { c.payload = []byte{0xf6} },
		"payload text":               func(c *cose) { c.payload = cat(hd(3, uint64(len(env))), env) },
		"payload tagged":             func(c *cose) { c.payload = cat([]byte{0xc1}, bstrOf(env)) },
		"payload not an envelope":    func(c *cose) { c.payload = bstrOf(u(1)) },
		"payload for another device": func(c *cose) { c.payload = bstrOf(signedEnv("other", 7, 1)) },
		"payload with trailing byte": func(c *cose) { c.payload = bstrOf(append(bytes.Clone(env), 0)) },
		"payload unsigned authenticator": func(c *cose) {
			c.payload = bstrOf(encMap(append(basePairs(dev), pair{u(15), bstr("x")})))
		},
		"signature empty":         func(c *cose) { c.sig = hd(2, 0) },
		"signature null":          func(c *cose) { c.sig = []byte{0xf6} },
		"signature of 63":         func(c *cose) { c.sig = bstrOf(make([]byte, 63)) },
		"signature of 65":         func(c *cose) { c.sig = bstrOf(make([]byte, 65)) },
		"signature zero":          func(c *cose) { c.sig = bstrOf(make([]byte, 64)) },
		"signature text":          func(c *cose) { c.sig = cat(hd(3, 64), bytes.Repeat([]byte("a"), 64)) },
		"protected not a bstr":    func(c *cose) { c.pbstr = func(b []byte) []byte { return b } },
		"protected bstr of a map": func(c *cose) { c.pbstr = func(b []byte) []byte { return cat(hd(2, uint64(len(b)+1)), b, u(0)) } },
	} {
		add(name, mod(f))
	}
	good := newCose("gw-a", env).bytes()
	cs = append(cs, decodeCase{"plain envelope", env})
	for _, bit := range []int{0, 9, 17, 8 * 5, 8 * (len(good) - 70), 8 * (len(good) - 40), 8*len(good) - 1} {
		b := bytes.Clone(good)
		b[bit/8] ^= 1 << (bit % 8)
		cs = append(cs, decodeCase{fmt.Sprintf("bit %d flipped", bit), b})
	}
	cs = append(cs, damaged(good, 3, 7, 60)...)
	return sortedCases(cs)
}

// damaged is good truncated every step bytes, then count copies of it with
// one byte set at random (seeded with seed: the same cases every time).
func damaged(good []byte, step int, seed uint64, count int) []decodeCase {
	var cs []decodeCase
	for n := 0; n < len(good); n += step {
		cs = append(cs, decodeCase{fmt.Sprintf("truncated to %d", n), good[:n]})
	}
	r := rand.New(rand.NewPCG(16, seed))
	for i := 0; i < count; i++ {
		b := bytes.Clone(good)
		p := r.IntN(len(b))
		b[p] = byte(r.IntN(256))
		cs = append(cs, decodeCase{fmt.Sprintf("byte %d set to %02x", p, b[p]), b})
	}
	return cs
}

// sortedCases orders cases by name (the corpus is built from maps).
func sortedCases(cs []decodeCase) []decodeCase {
	out := make([]decodeCase, len(cs))
	copy(out, cs)
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j].name < out[j-1].name; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

// signedVectors answers the signed corpus with a real devices/shim that
// requires signatures (Options.Keys), each case on a fresh file from the
// mark 5/3, and writes the keys the C runner's port knows.
func (w *hdr) signedVectors(dir string) error {
	cases := signedCorpus("dev-a")
	devs := make([]string, len(cases))
	for i := range devs {
		devs[i] = "dev-a"
	}
	cases = append(cases, decodeCase{"gw-b for dev-b", newCose("gw-b", signedEnv("dev-b", 7, 1)).bytes()},
		decodeCase{"gw-a for dev-b", newCose("gw-a", signedEnv("dev-b", 7, 1)).bytes()})
	devs = append(devs, "dev-b", "dev-b")
	var rows []string
	for i, c := range cases {
		s, err := shim.Open(filepath.Join(dir, fmt.Sprintf("signed-%d.db", i)), &shim.Options{Keys: vectorKeys{}})
		if err != nil {
			return err
		}
		prime := newCose("gw-a", signedEnv(devs[i], 5, 3)).bytes()
		if a := s.Handle(devs[i], prime, nopDevice{}); a.Verdict != fence.Accepted {
			s.Close()
			return fmt.Errorf("signed %s: prime: %v %s", c.name, a.Verdict, a.Reason)
		}
		a := s.Handle(devs[i], c.in, nopDevice{})
		if err := s.Close(); err != nil {
			return err
		}
		row, err := w.processRow(c.name, prime, devs[i], c.in, a)
		if err != nil {
			return err
		}
		rows = append(rows, row)
	}
	w.table("efs_vprocess", "efs_vsigned", rows)
	return w.keyTable()
}

// keyTable writes the known keys: kid, uncompressed point, the one device
// it may command (NULL: all).
func (w *hdr) keyTable() error {
	var rows []string
	for _, k := range vkeys {
		if !k.known {
			continue
		}
		pt, err := k.priv.PublicKey.Bytes()
		if err != nil {
			return err
		}
		dev := "NULL"
		if k.devices != nil {
			dev = cstr(k.devices[0])
		}
		rows = append(rows, fmt.Sprintf("\t{%s, %s, %s},\n", cstr(k.kid), w.blob(pt), dev))
	}
	w.table("efs_vkey", "efs_vkeys", rows)
	return nil
}
