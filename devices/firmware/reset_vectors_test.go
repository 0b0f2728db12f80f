package firmware

import (
	"bytes"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/edgefence/edgefence/devices/shim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
)

// The reset vectors: the operator's reset statements (fence/auth) answered
// by a real devices/shim with the operator's root (Options.Root) and plain
// commands, each case on a fresh file from the mark 5/3, some after a first
// reset (counter 3, epoch 3, to 2/1). The C runner compares verdict, state
// and ack.

// resetDev is the device every reset case is addressed to.
const resetDev = "dev-r"

// resetPayload is a reset's payload in fence/auth's deterministic encoding.
func resetPayload(dev string, t, seq, counter uint64, id string, epoch uint64) []byte {
	return cat(hd(5, 7), u(1), tstr(dev), u(2), u(t), u(3), u(seq), u(4), u(counter), u(5), tstr(id), u(6), u(1700000000000),
		u(7), u(epoch))
}

// newReset is a reset statement signed by kid's key over payload.
func newReset(kid string, payload []byte) *cose {
	return &cose{prefix: []byte{0xd2, 0x84}, protected: resetProtected(kid), pbstr: bstrOf,
		unprotected: hd(5, 0), payload: bstrOf(payload), signer: kid}
}

func resetProtected(kid string) []byte {
	return cat(hd(5, 3), u(1), neg(6), u(3), tstr(auth.ContentReset), u(4), bstr(kid))
}

type resetCase struct {
	name   string
	before []byte // applied first, if set
	dev    string // addressed; "" resetDev
	in     []byte
}

// resetCorpus is every reset case: valid ones (down, up), replays, another
// device, a gateway's key, a forged signature, malformed payloads and
// statements, truncations and mutations.
func resetCorpus() []resetCase {
	goodIn := func(t, seq, counter, epoch uint64) []byte {
		return newReset("operator", resetPayload(resetDev, t, seq, counter, fmt.Sprintf("reset:c%d", counter), epoch)).bytes()
	}
	good := func(t, seq, counter uint64) []byte { return goodIn(t, seq, counter, counter) } // epoch: the counter
	first := good(2, 1, 3)
	var cs []resetCase
	add := func(name string, in []byte) { cs = append(cs, resetCase{name: name, in: in}) }
	after := func(name string, in []byte) { cs = append(cs, resetCase{name: name, before: first, in: in}) }
	pay := func(name string, p []byte) { add("payload: "+name, newReset("operator", p).bytes()) }
	add("down to 2/1", first)
	add("up to 9/4", good(9, 4, 1))
	add("to 2^63/max", good(1<<63, 1<<64-1, 1))
	after("replayed", first)
	after("older counter", good(7, 1, 2))
	after("next counter", good(7, 1, 4))
	after("next counter, the same epoch", goodIn(7, 1, 4, 3))
	after("next counter, an older epoch", goodIn(7, 1, 4, 2))
	after("next counter, epoch 2^64-1", goodIn(7, 1, 4, 1<<64-1))
	add("another device", newReset("operator", resetPayload("dev-z", 2, 1, 1, "reset:z", 1)).bytes())
	cs = append(cs, resetCase{name: "addressed device invalid", dev: "bad device", in: first})
	add("signed by gw-a (a gateway, not the root)", newReset("gw-a", resetPayload(resetDev, 2, 1, 1, "reset:g", 1)).bytes())
	forged := newReset("operator", resetPayload(resetDev, 2, 1, 1, "reset:f", 1))
	forged.signer = "gw-a"
	add("gw-a's signature, the root's kid", forged.bytes())
	add("a command signed by the root", newCose("operator", signedEnv(resetDev, 7, 1)).bytes())
	pay("token 0", resetPayload(resetDev, 0, 1, 1, "reset:x", 1))
	pay("seq 0", resetPayload(resetDev, 2, 0, 1, "reset:x", 1))
	pay("counter 0", resetPayload(resetDev, 2, 1, 0, "reset:x", 1))
	pay("epoch 0", resetPayload(resetDev, 2, 1, 1, "reset:x", 0))
	pay("id without prefix", resetPayload(resetDev, 2, 1, 1, "x", 1))
	pay("id prefix only", resetPayload(resetDev, 2, 1, 1, "reset:", 1))
	pay("id of 64", resetPayload(resetDev, 2, 1, 1, "reset:"+strings.Repeat("a", 58), 1))
	pay("id of 65", resetPayload(resetDev, 2, 1, 1, "reset:"+strings.Repeat("a", 59), 1))
	pay("id with a slash", resetPayload(resetDev, 2, 1, 1, "reset:a/b", 1))
	pay("device invalid", resetPayload("bad device", 2, 1, 1, "reset:x", 1))
	// f is a payload's fields 1 to 5 (device, token 2, seq 1, counter 1,
	// id), each one a key and its value; the cases add or change others.
	f := func(id string) []byte {
		return cat(u(1), tstr(resetDev), u(2), u(2), u(3), u(1), u(4), u(1), u(5), tstr(id))
	}
	ep := cat(u(7), u(1)) // epoch 1
	pay("non-shortest heads", cat(hw(5, 24, 7), hw(0, 25, 1), tstr(resetDev), u(2), hw(0, 27, 2), u(3), hw(0, 26, 1),
		u(4), hw(0, 24, 1), u(5), cat(hw(3, 24, 7), []byte("reset:n")), u(6), hw(1, 27, 5), hw(0, 24, 7), hw(0, 27, 1)))
	pay("keys in another order", cat(hd(5, 6), ep, u(5), tstr("reset:o"), u(4), u(1), u(3), u(1), u(2), u(2), u(1), tstr(resetDev)))
	pay("no issued", cat(hd(5, 6), f("reset:i"), ep))
	pay("no epoch", cat(hd(5, 6), f("reset:i"), u(6), u(1)))
	pay("epoch null", cat(hd(5, 6), f("reset:i"), u(7), []byte{0xf6}))
	pay("epoch undefined", cat(hd(5, 6), f("reset:i"), u(7), []byte{0xf7}))
	pay("epoch negative", cat(hd(5, 6), f("reset:i"), u(7), neg(0)))
	pay("epoch text", cat(hd(5, 6), f("reset:i"), u(7), tstr("1")))
	pay("epoch float", cat(hd(5, 6), f("reset:i"), u(7), []byte{0xf9, 0x3c, 0x00}))
	pay("epoch 2^64-1", cat(hd(5, 6), f("reset:i"), u(7), hd(0, 1<<64-1)))
	pay("epoch twice", cat(hd(5, 7), f("reset:i"), ep, hw(0, 24, 7), u(2)))
	pay("issued null", cat(hd(5, 7), f("reset:i"), u(6), []byte{0xf6}, ep))
	pay("issued negative", cat(hd(5, 7), f("reset:i"), u(6), neg(9), ep))
	pay("issued -2^64", cat(hd(5, 7), f("reset:i"), u(6), neg(1<<64-1), ep))
	pay("token null", cat(hd(5, 6), u(1), tstr(resetDev), u(2), []byte{0xf6}, u(3), u(1), u(4), u(1), u(5), tstr("reset:t"), ep))
	pay("token negative", cat(hd(5, 6), u(1), tstr(resetDev), u(2), neg(1), u(3), u(1), u(4), u(1), u(5), tstr("reset:t"), ep))
	pay("token float", cat(hd(5, 6), u(1), tstr(resetDev), u(2), []byte{0xf9, 0x40, 0x00}, u(3), u(1), u(4), u(1), u(5), tstr("reset:t"), ep))
	pay("token tagged", cat(hd(5, 6), u(1), tstr(resetDev), u(2), []byte{0xc1}, u(2), u(3), u(1), u(4), u(1), u(5), tstr("reset:t"), ep))
	pay("device bytes", cat(hd(5, 6), u(1), bstr(resetDev), u(2), u(2), u(3), u(1), u(4), u(1), u(5), tstr("reset:t"), ep))
	pay("id not UTF-8", cat(hd(5, 6), u(1), tstr(resetDev), u(2), u(2), u(3), u(1), u(4), u(1), u(5), cat(hd(3, 7), []byte("reset:\xff")), ep))
	pay("unknown key 8", cat(hd(5, 7), f("reset:k"), ep, u(8), u(0)))
	pay("key twice", cat(hd(5, 7), f("reset:k"), ep, u(4), u(2)))
	pay("negative key", cat(hd(5, 7), f("reset:k"), ep, neg(0), u(2)))
	pay("trailing byte", append(resetPayload(resetDev, 2, 1, 1, "reset:x", 1), 0))
	pay("an array", cat(hd(4, 1), u(1)))
	pay("null", []byte{0xf6})
	pay("indefinite map", cat([]byte{0xbf}, f("reset:k"), ep, []byte{0xff}))
	big := newReset("operator", nil)
	add("statement of 1025 bytes", padTo(big, 1025))
	add("statement of 1024 bytes", padTo(big, 1024))
	for name, p := range map[string][]byte{
		"content type twice": cat(hd(5, 4), u(1), neg(6), u(3), tstr(auth.ContentReset), u(4), bstr("operator"), hw(0, 24, 3), tstr(auth.ContentReset)),
		"alg ES384":          cat(hd(5, 3), u(1), neg(34), u(3), tstr(auth.ContentReset), u(4), bstr("operator")),
		"no kid":             cat(hd(5, 2), u(1), neg(6), u(3), tstr(auth.ContentReset)),
		"no alg":             cat(hd(5, 2), u(3), tstr(auth.ContentReset), u(4), bstr("operator")),
		"label 2":            cat(hd(5, 4), u(1), neg(6), u(2), hd(4, 0), u(3), tstr(auth.ContentReset), u(4), bstr("operator")),
		"kid, ct, alg":       cat(hd(5, 3), u(4), bstr("operator"), u(3), tstr(auth.ContentReset), u(1), neg(6)),
		"ct in a long head":  cat(hd(5, 3), u(1), neg(6), hw(0, 26, 3), cat(hw(3, 25, uint64(len(auth.ContentReset))), []byte(auth.ContentReset)), u(4), bstr("operator")),
		"another ct":         cat(hd(5, 3), u(1), neg(6), u(3), tstr("application/edgefence-cert+cbor"), u(4), bstr("operator")),
	} {
		c := newReset("operator", resetPayload(resetDev, 2, 1, 1, "reset:p", 1))
		c.protected = p
		add("protected: "+name, c.bytes())
	}
	g := newReset("operator", resetPayload(resetDev, 2, 1, 1, "reset:m", 1))
	for name, f := range map[string]func(c *cose){
		"unprotected kid": func(c *cose) { c.unprotected = cat(hd(5, 1), u(4), bstr("operator")) },
		"trailing byte":   func(c *cose) { c.tail = u(0) },
		"signature of 63": func(c *cose) { c.sig = bstrOf(make([]byte, 63)) },
		"signature zero":  func(c *cose) { c.sig = bstrOf(make([]byte, 64)) },
		"payload null":    func(c *cose) { c.payload = []byte{0xf6} },
		"untagged":        func(c *cose) { c.prefix = []byte{0x84} },
		"payload long head": func(c *cose) {
			p := resetPayload(resetDev, 2, 1, 1, "reset:m", 1)
			c.payload = cat(hw(2, 26, uint64(len(p))), p)
		},
		"protected long head": func(c *cose) { c.pbstr = func(b []byte) []byte { return cat(hw(2, 25, uint64(len(b))), b) } },
	} {
		c := *g
		f(&c)
		add(name, c.bytes())
	}
	whole := g.bytes()
	for _, bit := range []int{0, 13, 8 * 20, 8 * (len(whole) - 70), 8 * (len(whole) - 80), 8*len(whole) - 1} {
		b := bytes.Clone(whole)
		b[bit/8] ^= 1 << (bit % 8)
		add(fmt.Sprintf("bit %d flipped", bit), b)
	}
	for _, c := range damaged(whole, 4, 9, 80) {
		add(c.name, c.in)
	}
	slices.SortStableFunc(cs, func(a, b resetCase) int { return strings.Compare(a.name, b.name) }) // maps above
	return cs
}

// padTo returns c's statement padded to n bytes with an unknown payload
// field 8 of text (refused as unknown, or as too large first).
func padTo(c *cose, n int) []byte {
	base := resetPayload(resetDev, 2, 1, 1, "reset:b", 1)
	for pad := 0; pad < n; pad++ {
		p := cat(hd(5, 8), base[1:], u(8), tstr(strings.Repeat("p", pad)))
		c.payload = bstrOf(p)
		if b := c.bytes(); len(b) == n {
			return b
		}
	}
	panic("padTo: no size fits")
}

// resetVectors answers the reset corpus with a real devices/shim holding
// the operator's root, and writes the root for the C runner's port.
func (w *hdr) resetVectors(dir string) error {
	root := findKey("operator")
	rk, err := auth.NewRootKey([]byte(root.kid), &root.priv.PublicKey)
	if err != nil {
		return err
	}
	var rows []string
	for i, c := range resetCorpus() {
		s, err := shim.Open(filepath.Join(dir, fmt.Sprintf("reset-%d.db", i)), &shim.Options{Root: rk})
		if err != nil {
			return err
		}
		prime := mustEnvelope(fence.Envelope{Device: resetDev, Token: 5, Seq: 3, ID: "prime", Kind: "set"})
		if a := s.Handle(resetDev, prime, nopDevice{}); a.Verdict != fence.Accepted {
			s.Close()
			return fmt.Errorf("reset %s: prime: %v", c.name, a.Verdict)
		}
		if c.before != nil {
			if a := s.Handle(resetDev, c.before, nopDevice{}); a.Verdict != fence.Accepted {
				s.Close()
				return fmt.Errorf("reset %s: first reset: %v %s", c.name, a.Verdict, a.Reason)
			}
		}
		dev := c.dev
		if dev == "" {
			dev = resetDev
		}
		a := s.Handle(dev, c.in, nopDevice{})
		if err := s.Close(); err != nil {
			return err
		}
		row, err := w.resetRow(c, prime, dev, a)
		if err != nil {
			return err
		}
		rows = append(rows, row)
	}
	w.table("efs_vreset", "efs_vresets", rows)
	pt, err := root.priv.PublicKey.Bytes()
	if err != nil {
		return err
	}
	w.table("efs_vroot", "efs_vroots", []string{fmt.Sprintf("\t{%s, %s},\n", cstr(root.kid), w.blob(pt))})
	return nil
}

func (w *hdr) resetRow(c resetCase, prime []byte, dev string, a fence.Ack) (string, error) {
	blankReason(&a)
	ack, err := fence.MarshalAck(&a)
	if err != nil {
		return "", fmt.Errorf("%s: %w", c.name, err)
	}
	return fmt.Sprintf("\t{%s, %s, %s, %s, %s, %d, %dull, %dull, %dull, %s},\n", cstr(c.name), w.blob(prime), w.blob(c.before),
		w.blob([]byte(dev)), w.blob(c.in), a.Verdict, a.Epoch, a.MaxToken, a.LastSeq, w.blob(ack)), nil
}
