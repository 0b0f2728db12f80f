package firmware

import (
	"bytes"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/edgefence/edgefence/fence"
)

// decodeCorpus is every input the decode vectors hold: valid envelopes,
// each of the decoder's rules at and past its edge, every truncation of
// two envelopes and seeded random mutations. Go decides each one.
func decodeCorpus() []decodeCase {
	var cs []decodeCase
	add := func(name string, b []byte) { cs = append(cs, decodeCase{name, b}) }
	base := encMap(basePairs("d1"))
	full := mustEnvelope(fence.Envelope{Device: "thermostat-7", Token: 1 << 40, Seq: 70000, ID: "cmd:42/a", Kind: "set.point",
		Body:     cat(hd(5, 2), tstr("m"), hd(4, 2), u(1), neg(1), tstr("sp"), []byte{0xfb, 0x40, 0x35, 0x80, 0, 0, 0, 0, 0}),
		IssuedAt: -1, Holder: "gateway-ß-€-😀"})
	add("base", base)
	add("full", full)
	addShapes(add)
	addFields(add)
	addLimits(add)
	addBodies(add)
	addUTF8(add)
	for _, b := range [][]byte{base, full} {
		for n := 0; n < len(b); n++ {
			add(fmt.Sprintf("truncated to %d of %d", n, len(b)), b[:n])
		}
	}
	addMutations(add, [][]byte{base, full, body(cat(hd(5, 2), u(1), hd(4, 1), tstr("x"), tstr("k"), []byte{0xf9, 0x3c, 0})),
		body(nested(14, []byte{0x81}, []byte{0xa1, 0x01, 0x02}))})
	return cs
}

func addShapes(add func(string, []byte)) {
	ps := basePairs("d1")
	base := encMap(ps)
	add("keys in reverse order", encMap([]pair{ps[5], ps[4], ps[3], ps[2], ps[1], ps[0]}))
	add("key 1 not shortest", encMap(append([]pair{{hw(0, 24, 1), u(1)}}, ps[1:]...)))
	add("key 6 in 8 bytes", encMap(append(append([]pair(nil), ps[:5]...), pair{hw(0, 27, 6), tstr("set")})))
	add("version in 4 bytes", with(1, hw(0, 26, 1)))
	add("token in 8 bytes", with(3, hw(0, 27, 5)))
	add("device length not shortest", with(2, cat(hw(3, 24, 2), []byte("d1"))))
	add("map count not shortest", cat(hw(5, 25, 6), base6(ps)))
	add("key 1 twice", encMap(append(append([]pair(nil), ps...), pair{u(1), u(1)})))
	add("key 1 twice, other width", encMap(append(append([]pair(nil), ps...), pair{hw(0, 24, 1), u(1)})))
	add("key 9 twice, null first", encMap(append(append([]pair(nil), ps...), pair{u(9), []byte{0xf6}}, pair{u(9), tstr("h")})))
	for _, k := range [][]byte{u(0), u(11), u(14), u(16), u(255), neg(0), tstr("1"), tstr("device"), bstr("\x01"),
		hw(0, 27, 1<<32+1), hw(0, 27, math.MaxUint64), []byte{0xf9, 0x3c, 0x00}, []byte{0xf5}, []byte{0xf6}} {
		add(fmt.Sprintf("unknown key %x", k), encMap(append(append([]pair(nil), ps...), pair{k, u(1)})))
	}
	add("empty input", nil)
	add("top-level array", cat(hd(4, 1), base))
	add("top-level null", []byte{0xf6})
	add("top-level undefined", []byte{0xf7})
	add("top-level integer", u(1))
	add("empty map", []byte{0xa0})
	add("trailing byte", append(bytes.Clone(encMap(ps)), 0x00))
	add("two envelopes", append(bytes.Clone(encMap(ps)), encMap(ps)...))
	add("indefinite map", append(append([]byte{0xbf}, base6(ps)...), 0xff))
	add("lone break", []byte{0xff})
	add("reserved additional info", []byte{0xbc})
	add("tagged envelope", cat([]byte{0xd8, 0x18}, encMap(ps)))
	add("map count past input", cat(hd(5, 7), base6(ps)))
	add("map count 2^64-1", cat(hw(5, 27, math.MaxUint64), base6(ps)))
}

// base6 is the base envelope's pairs without the map head.
func base6(ps []pair) []byte { return encMap(ps)[1:] }

func addFields(add func(string, []byte)) {
	nulls := []struct {
		name string
		b    []byte
	}{{"null", []byte{0xf6}}, {"undefined", []byte{0xf7}}}
	for _, k := range []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 15} {
		for _, n := range nulls {
			add(fmt.Sprintf("key %d %s", k, n.name), with(k, n.b))
		}
	}
	wrong := map[uint64][][]byte{
		1:  {neg(0), {0xf9, 0x3c, 0x00}, {0xf5}, tstr("1"), u(2), u(0), u(255), u(256), hw(0, 27, 1)},
		2:  {bstr("d1"), u(1), hd(4, 0), hd(5, 0)},
		3:  {neg(4), {0xf9, 0x45, 0x00}, tstr("5"), u(0), hw(0, 27, math.MaxUint64)},
		4:  {neg(0), bstr("\x02"), u(0), hw(0, 27, math.MaxUint64)},
		5:  {bstr("c-1"), u(5), tstr("")},
		6:  {hd(4, 1), tstr("")},
		8:  {tstr("now"), {0xf9, 0x3c, 0x00}, u(math.MaxInt64), hw(0, 27, math.MaxInt64+1), neg(math.MaxInt64), neg(math.MaxInt64 + 1), neg(math.MaxUint64)},
		9:  {bstr("gw"), u(9), tstr("")},
		10: {u(0), u(1), hw(0, 27, 1), hw(0, 27, math.MaxUint64), neg(0), tstr("1"), bstr("\x01"), {0xf9, 0x3c, 0x00}, {0xc1, 0x01}, hd(4, 0)},
		15: {tstr(""), bstr(""), bstr("x"), u(0), hd(4, 0), cat(hd(4, 1), u(1)), cat(hd(4, 1), u(0)), cat(hd(4, 1), []byte{0xf6}),
			cat(hd(4, 1), tstr("x")), cat(hd(4, 1), u(256)), cat(hd(4, 1), hd(4, 0)), hd(5, 0), cat(hd(4, 2), u(1), neg(0))},
		7: {hd(4, 0), hd(5, 0), tstr(""), bstr("")},
	}
	for k := uint64(1); k <= 15; k++ {
		for _, v := range wrong[k] {
			add(fmt.Sprintf("key %d = %x", k, v), with(k, v))
		}
	}
}

func addLimits(add func(string, []byte)) {
	for _, n := range []int{fence.MaxDeviceIDLen, fence.MaxDeviceIDLen + 1} {
		add(fmt.Sprintf("device id of %d", n), with(2, tstr(strings.Repeat("d", n))))
	}
	for _, d := range []string{".d", "d.", "a b", "d/1", "d:1", "A-Z_a.z-0_9", "-", "_"} {
		add("device id "+d, with(2, tstr(d)))
	}
	for _, k := range []uint64{5, 6} {
		for _, n := range []int{fence.MaxIDLen, fence.MaxIDLen + 1} {
			add(fmt.Sprintf("key %d of %d", k, n), with(k, tstr(strings.Repeat("x", n))))
		}
		for _, s := range []string{"a:b/c", ".x", "a b", "a%b", "é"} {
			add(fmt.Sprintf("key %d %q", k, s), with(k, tstr(s)))
		}
	}
	for _, n := range []int{fence.MaxHolderLen, fence.MaxHolderLen + 1} {
		add(fmt.Sprintf("holder of %d", n), with(9, tstr(strings.Repeat("h", n))))
	}
	add("holder of 64 two-byte runes", with(9, tstr(strings.Repeat("é", 64))))
	add("holder of 65 two-byte runes", with(9, tstr(strings.Repeat("é", 65))))
	for _, n := range []int{fence.MaxBodySize, fence.MaxBodySize + 1} {
		add(fmt.Sprintf("body of %d bytes", n), body(cat(hw(2, 25, uint64(n-3)), make([]byte, n-3))))
	}
	for _, n := range []int{fence.MaxArrayElems, fence.MaxArrayElems + 1} {
		add(fmt.Sprintf("body array of %d", n), body(cat(hd(4, uint64(n)), make([]byte, n))))
	}
	for _, n := range []int{fence.MaxMapPairs, fence.MaxMapPairs + 1} {
		m := hd(5, uint64(n))
		for i := 0; i < n; i++ {
			m = append(append(m, u(uint64(i))...), 0xf6)
		}
		add(fmt.Sprintf("body map of %d", n), body(m))
	}
	for d := 13; d <= 17; d++ {
		add(fmt.Sprintf("body arrays nested %d", d), body(nested(d, []byte{0x81}, u(0))))
		add(fmt.Sprintf("body empty array at depth %d", d), body(nested(d-1, []byte{0x81}, []byte{0x80})))
		add(fmt.Sprintf("body maps nested %d", d), body(nested(d, []byte{0xa1, 0x00}, u(0))))
		add(fmt.Sprintf("unknown field nested %d", d), with(11, nested(d, []byte{0x81}, u(0))))
		add(fmt.Sprintf("epoch nested %d", d), with(10, nested(d, []byte{0x81}, u(0))))
	}
	add("text length past input", with(2, []byte{0x78, 0x20, 'd'}))
	add("text length 2^64-1", with(2, cat(hw(3, 27, math.MaxUint64), []byte("d1"))))
	add("bytes length 2^63", with(15, hw(2, 27, 1<<63)))
}

func addBodies(add func(string, []byte)) {
	f := func(b ...byte) []byte { return b }
	m := map[string][]byte{
		"null":                        f(0xf6),
		"undefined":                   f(0xf7),
		"empty bytes":                 bstr(""),
		"simple 0":                    f(0xe0),
		"simple 19":                   f(0xf3),
		"simple 24 (bad)":             f(0xf8, 0x18),
		"simple 31 (bad)":             f(0xf8, 0x1f),
		"simple 32":                   f(0xf8, 0x20),
		"simple 255":                  f(0xf8, 0xff),
		"break":                       f(0xff),
		"reserved ai 28":              f(0x1c),
		"reserved ai 30 major 7":      f(0xfe),
		"indefinite array":            f(0x9f, 0x01, 0xff),
		"indefinite text":             f(0x7f, 0x61, 'a', 0xff),
		"indefinite bytes":            f(0x5f, 0x41, 'a', 0xff),
		"indefinite uint (bad)":       f(0x1f),
		"tag 1":                       f(0xc1, 0x00),
		"tag in array":                f(0x81, 0xc2, 0x41, 0x01),
		"float16 NaN":                 f(0xf9, 0x7e, 0x00),
		"float64":                     f(0xfb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0),
		"-2^64":                       neg(math.MaxUint64),
		"array holding -2^64":         cat(hd(4, 1), neg(math.MaxUint64)),
		"key -2^64":                   cat(hd(5, 1), neg(math.MaxUint64), u(1)),
		"key -2^63":                   cat(hd(5, 1), neg(math.MaxInt64), u(1)),
		"key -2^63-1":                 cat(hd(5, 1), neg(math.MaxInt64+1), u(1)),
		"key array":                   cat(hd(5, 1), hd(4, 0), u(1)),
		"key map":                     cat(hd(5, 1), hd(5, 0), u(1)),
		"keys 1, 1 not shortest":      cat(hd(5, 2), u(1), u(1), hw(0, 24, 1), u(2)),
		"keys 1, 1 in 8 bytes":        cat(hd(5, 2), u(1), u(1), hw(0, 27, 1), u(2)),
		"keys 1, -2":                  cat(hd(5, 2), u(1), u(1), neg(1), u(2)),
		"keys 1, 1.0":                 cat(hd(5, 2), u(1), u(1), f(0xf9, 0x3c, 0x00), u(2)),
		"keys 1.0 half, single":       cat(hd(5, 2), f(0xf9, 0x3c, 0x00), u(1), f(0xfa, 0x3f, 0x80, 0, 0), u(2)),
		"keys 1.0 half, double":       cat(hd(5, 2), f(0xf9, 0x3c, 0x00), u(1), f(0xfb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0), u(2)),
		"keys 1.5 single, 1.25":       cat(hd(5, 2), f(0xfa, 0x3f, 0xc0, 0, 0), u(1), f(0xfa, 0x3f, 0xa0, 0, 0), u(2)),
		"keys 2^-24 half, single":     cat(hd(5, 2), f(0xf9, 0x00, 0x01), u(1), f(0xfa, 0x33, 0x80, 0, 0), u(2)),
		"keys 2^-149 single, double":  cat(hd(5, 2), f(0xfa, 0x00, 0x00, 0x00, 0x01), u(1), f(0xfb, 0x36, 0xa0, 0, 0, 0, 0, 0, 0), u(2)),
		"keys half subnormals differ": cat(hd(5, 2), f(0xf9, 0x00, 0x01), u(1), f(0xf9, 0x00, 0x02), u(2)),
		"keys inf half, double":       cat(hd(5, 2), f(0xf9, 0x7c, 0x00), u(1), f(0xfb, 0x7f, 0xf0, 0, 0, 0, 0, 0, 0), u(2)),
		"keys -inf, inf":              cat(hd(5, 2), f(0xf9, 0xfc, 0x00), u(1), f(0xf9, 0x7c, 0x00), u(2)),
		"keys 0.0, -0.0":              cat(hd(5, 2), f(0xf9, 0x00, 0x00), u(1), f(0xfb, 0x80, 0, 0, 0, 0, 0, 0, 0), u(2)),
		"keys NaN, NaN":               cat(hd(5, 2), f(0xf9, 0x7e, 0x00), u(1), f(0xf9, 0x7e, 0x00), u(2)),
		"keys null, undefined":        cat(hd(5, 2), f(0xf6), u(1), f(0xf7), u(2)),
		"keys false, true":            cat(hd(5, 2), f(0xf4), u(1), f(0xf5), u(2)),
		"keys true, true":             cat(hd(5, 2), f(0xf5), u(1), f(0xf5), u(2)),
		"keys simple 0, 0":            cat(hd(5, 2), f(0xe0), u(1), f(0xe0), u(2)),
		"keys simple 0, false":        cat(hd(5, 2), f(0xe0), u(1), f(0xf4), u(2)),
		"keys simple 32, 32":          cat(hd(5, 2), f(0xf8, 0x20), u(1), f(0xf8, 0x20), u(2)),
		"keys text, bytes":            cat(hd(5, 2), tstr("a"), u(1), bstr("a"), u(2)),
		"keys text, text long form":   cat(hd(5, 2), tstr("a"), u(1), hw(3, 24, 1), []byte("a"), u(2)),
		"keys bytes, bytes":           cat(hd(5, 2), bstr("ab"), u(1), bstr("ab"), u(2)),
		"keys \"\", \"\"":             cat(hd(5, 2), tstr(""), u(1), tstr(""), u(2)),
		"keys a, b, a":                cat(hd(5, 3), tstr("a"), u(1), tstr("b"), u(2), tstr("a"), u(3)),
		"dup keys in nested map":      cat(hd(4, 2), u(0), hd(5, 2), u(1), u(1), u(1), u(2)),
		"dup keys in map value":       cat(hd(5, 1), u(1), hd(5, 2), tstr("x"), u(1), tstr("x"), u(2)),
		"keys distinct, values equal": cat(hd(5, 2), u(1), u(1), u(2), u(1)),
		"map value nested keys ok":    cat(hd(5, 2), u(1), hd(5, 1), u(1), u(1), u(2), hd(5, 1), u(1), u(1)),
		"two items":                   cat(u(1), u(2)),
	}
	for _, name := range slices.Sorted(maps.Keys(m)) {
		add("body "+name, body(m[name]))
	}
}

func addUTF8(add func(string, []byte)) {
	m := map[string]string{
		"overlong":          "\xc0\x80",
		"overlong 3":        "\xe0\x80\xaf",
		"surrogate":         "\xed\xa0\x80",
		"past U+10FFFF":     "\xf4\x90\x80\x80",
		"truncated":         "\xe2\x82",
		"lone continuation": "\x80",
		"f5":                "\xf5\x80\x80\x80",
		"4-byte":            "\xf0\x9f\x98\x80",
		"U+FFFF":            "\xef\xbf\xbf",
		"U+10FFFF":          "\xf4\x8f\xbf\xbf",
		"U+D7FF":            "\xed\x9f\xbf",
		"NUL":               "a\x00b",
	}
	for _, name := range slices.Sorted(maps.Keys(m)) {
		s := m[name]
		add("holder "+name, with(9, tstr(s)))
		add("body text "+name, body(tstr(s)))
		add("body key "+name, body(cat(hd(5, 1), tstr(s), u(1))))
		add("unknown field text "+name, with(11, tstr(s)))
	}
}

// addMutations adds seeded random mutations of each input: a bit flipped,
// a byte replaced, inserted or removed.
func addMutations(add func(string, []byte), ins [][]byte) {
	r := rand.New(rand.NewPCG(16, 2026))
	for i, in := range ins {
		for j := 0; j < 150; j++ {
			b := bytes.Clone(in)
			p := r.IntN(len(b))
			var what string
			switch r.IntN(4) {
			case 0:
				bit := r.IntN(8)
				b[p] ^= 1 << bit
				what = fmt.Sprintf("bit %d of byte %d flipped", bit, p)
			case 1:
				c := byte(r.IntN(256))
				b[p] = c
				what = fmt.Sprintf("byte %d set to %02x", p, c)
			case 2:
				c := byte(r.IntN(256))
				b = append(b[:p], append([]byte{c}, b[p:]...)...)
				what = fmt.Sprintf("%02x inserted at %d", c, p)
			default:
				b = append(b[:p], b[p+1:]...)
				what = fmt.Sprintf("byte %d removed", p)
			}
			add(fmt.Sprintf("input %d: %s", i, what), b)
		}
	}
}
