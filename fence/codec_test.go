package fence_test

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/fxamacker/cbor/v2"

	"github.com/edgefence/edgefence/fence"
)

// h decodes hex written with spaces between items, as CBOR is read.
func h(s string) []byte {
	b, err := hex.DecodeString(strings.Join(strings.Fields(s), ""))
	if err != nil {
		panic(err)
	}
	return b
}

// cmap hand-builds a definite-length CBOR map from hex-encoded key/value
// pairs, in the order given (fewer than 24 pairs).
func cmap(pairs ...string) string {
	return fmt.Sprintf("%02x %s", 0xa0+len(pairs), strings.Join(pairs, " "))
}

// tstr is the hex of a definite-length CBOR text string holding s.
func tstr(s string) string { return chead(3, uint64(len(s))) + " " + hex.EncodeToString([]byte(s)) }

// chead is the hex of a CBOR head of major type mt with argument n, in
// shortest form.
func chead(mt byte, n uint64) string {
	ib := mt << 5
	switch {
	case n < 24:
		return fmt.Sprintf("%02x", ib|byte(n))
	case n <= 0xff:
		return fmt.Sprintf("%02x %02x", ib|24, n)
	case n <= 0xffff:
		return fmt.Sprintf("%02x %04x", ib|25, n)
	case n <= 0xffffffff:
		return fmt.Sprintf("%02x %08x", ib|26, n)
	default:
		return fmt.Sprintf("%02x %016x", ib|27, n)
	}
}

// Key/value pairs of the minimal valid envelope
// {1: 1, 2: "d1", 3: 7, 4: 1, 5: "c1", 6: "set"}.
const (
	pV    = "01 01"
	pDev  = "02 62 6431"
	pTok  = "03 07"
	pSeq  = "04 01"
	pID   = "05 62 6331"
	pKind = "06 63 736574"
)

var minimalEnvelope = fence.Envelope{V: 1, Device: "d1", Token: 7, Seq: 1, ID: "c1", Kind: "set"}

// envWith is the minimal envelope with extra pairs appended (keys 7 and up
// keep the map in canonical order).
func envWith(extra ...string) []byte {
	return h(cmap(append([]string{pV, pDev, pTok, pSeq, pID, pKind}, extra...)...))
}

// envDevice is the minimal envelope with device field value hexval.
func envDevice(hexval string) []byte {
	return h(cmap(pV, "02 "+hexval, pTok, pSeq, pID, pKind))
}

// nested returns the hex of a body nested depth levels deep in arrays of
// one element around the integer 1.
func nested(depth int) string {
	return strings.Repeat("81 ", depth) + "01"
}

// fullEnvelope exercises every field.
func fullEnvelope(tb testing.TB) *fence.Envelope {
	tb.Helper()
	body, err := fence.EncodeBody(map[string]any{
		"set":   map[string]any{"relay": true, "level": uint64(42), "offset": int64(-3)},
		"steps": []any{"a", uint64(1), []any{[]byte{0xde, 0xad}, nil}, map[string]any{}},
		"gain":  1.5,
	})
	if err != nil {
		tb.Fatal(err)
	}
	return &fence.Envelope{
		V: fence.Version, Device: "pump-07.site_a", Token: 1<<40 + 3, Seq: 12, ID: "cmd:0190/abc-1",
		Kind: "set", Body: body, IssuedAt: 1700000000123, Holder: "gw-1.example",
	}
}

func equalEnvelope(a, b *fence.Envelope) bool {
	return a.V == b.V && a.Device == b.Device && a.Token == b.Token && a.Seq == b.Seq &&
		a.ID == b.ID && a.Kind == b.Kind && bytes.Equal(a.Body, b.Body) &&
		a.IssuedAt == b.IssuedAt && a.Holder == b.Holder && bytes.Equal(a.Auth, b.Auth)
}

func TestMinimalEnvelopeEncoding(t *testing.T) {
	b, err := fence.MarshalEnvelope(&minimalEnvelope)
	if err != nil {
		t.Fatal(err)
	}
	if want := envWith(); !bytes.Equal(b, want) {
		t.Errorf("MarshalEnvelope(minimal) =\n%x\nwant\n%x", b, want)
	}
}

func TestEnvelopeRoundTrip(t *testing.T) {
	for _, e := range []*fence.Envelope{&minimalEnvelope, fullEnvelope(t)} {
		b, err := fence.MarshalEnvelope(e)
		if err != nil {
			t.Fatalf("MarshalEnvelope: %v", err)
		}
		got, err := fence.UnmarshalEnvelope(b)
		if err != nil {
			t.Fatalf("UnmarshalEnvelope: %v", err)
		}
		if !equalEnvelope(got, e) {
			t.Errorf("round trip:\n got %+v\nwant %+v", got, e)
		}
		b2, err := fence.MarshalEnvelope(got)
		if err != nil || !bytes.Equal(b, b2) {
			t.Errorf("re-encoding differs: %x, %v; want %x", b2, err, b)
		}
	}
}

func TestEnvelopeBodyRoundTrip(t *testing.T) {
	type step struct {
		Op   string `cbor:"1,keyasint"`
		Arg  []int  `cbor:"2,keyasint,omitempty"`
		Wait uint32 `cbor:"3,keyasint,omitempty"`
	}
	type job struct {
		Name  string            `cbor:"name"`
		Steps []step            `cbor:"steps"`
		Tags  map[string]string `cbor:"tags"`
		Blob  []byte            `cbor:"blob"`
	}
	in := job{
		Name:  "fw-upgrade",
		Steps: []step{{Op: "stage", Arg: []int{1, -2, 3}}, {Op: "reboot", Wait: 30}},
		Tags:  map[string]string{"z": "last", "a": "first", "mm": "middle"},
		Blob:  []byte{0, 1, 2, 0xff},
	}
	body, err := fence.EncodeBody(in)
	if err != nil {
		t.Fatal(err)
	}
	e := minimalEnvelope
	e.Body = body
	b, err := fence.MarshalEnvelope(&e)
	if err != nil {
		t.Fatal(err)
	}
	got, err := fence.UnmarshalEnvelope(b)
	if err != nil {
		t.Fatal(err)
	}
	var out job
	if err := fence.DecodeBody(got.Body, &out); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(in, out) {
		t.Errorf("typed body round trip:\n got %+v\nwant %+v", out, in)
	}

	// The same body, decoded generically.
	var generic any
	if err := fence.DecodeBody(fullEnvelope(t).Body, &generic); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"set":   map[string]any{"relay": true, "level": uint64(42), "offset": int64(-3)},
		"steps": []any{"a", uint64(1), []any{[]byte{0xde, 0xad}, nil}, map[string]any{}},
		"gain":  1.5,
	}
	if !reflect.DeepEqual(generic, want) {
		t.Errorf("generic body round trip:\n got %#v\nwant %#v", generic, want)
	}
}

func TestEnvelopeDeterministic(t *testing.T) {
	e := fullEnvelope(t)
	first, err := fence.MarshalEnvelope(e)
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		// Maps iterate in random order: re-encode the body too.
		e2 := *fullEnvelope(t)
		b, err := fence.MarshalEnvelope(&e2)
		if err != nil || !bytes.Equal(b, first) {
			t.Fatalf("encoding not deterministic:\n%x\n%x", b, first)
		}
	}
	// Canonical key order: a map of 9 pairs, keys 1, 2, 3 ... 9 ascending.
	if want := h("a9 01 01 02 6e"); !bytes.HasPrefix(first, want) {
		t.Errorf("envelope starts %x, want %x", first[:len(want)], want)
	}
	var keys map[uint64]cbor.RawMessage
	if err := cbor.Unmarshal(first, &keys); err != nil {
		t.Fatal(err)
	}
	for k := range uint64(9) {
		if _, ok := keys[k+1]; !ok {
			t.Errorf("key %d missing", k+1)
		}
	}
	// Keys appear in ascending order in the bytes.
	at := 1
	dec := cbor.NewDecoder(bytes.NewReader(first[1:]))
	for want := uint64(1); want <= 9; want++ {
		var k uint64
		var v cbor.RawMessage
		if err := dec.Decode(&k); err != nil || k != want {
			t.Fatalf("key #%d at byte %d = %d, %v; want %d", want, at, k, err, want)
		}
		if err := dec.Decode(&v); err != nil {
			t.Fatal(err)
		}
		at = 1 + dec.NumBytesRead()
	}
}

func TestEncodeBodyCanonicalMapOrder(t *testing.T) {
	m := map[string]any{"b": uint64(2), "aa": uint64(3), "a": uint64(1), "": uint64(0)}
	first, err := fence.EncodeBody(m)
	if err != nil {
		t.Fatal(err)
	}
	// Core deterministic order: shorter encoded keys first, then bytewise.
	want := h("a4 60 00 61 61 01 61 62 02 62 6161 03")
	if !bytes.Equal(first, want) {
		t.Errorf("EncodeBody = %x, want %x", first, want)
	}
	for range 50 {
		b, err := fence.EncodeBody(map[string]any{"a": uint64(1), "b": uint64(2), "aa": uint64(3), "": uint64(0)})
		if err != nil || !bytes.Equal(b, first) {
			t.Fatalf("EncodeBody not deterministic: %x vs %x", b, first)
		}
	}
}

func TestEnvelopeIssued(t *testing.T) {
	e := minimalEnvelope
	if !e.Issued().IsZero() {
		t.Errorf("Issued() = %v for IssuedAt 0, want zero time", e.Issued())
	}
	e.IssuedAt = 1700000000123
	if got, want := e.Issued(), time.UnixMilli(1700000000123); !got.Equal(want) {
		t.Errorf("Issued() = %v, want %v", got, want)
	}
}

// validEnvelopeCases decode without error; canonical is the expected
// re-encoding when it differs from the input.
func validEnvelopeCases() []struct {
	name      string
	in        []byte
	canonical []byte
} {
	min := envWith()
	return []struct {
		name      string
		in        []byte
		canonical []byte
	}{
		{"minimal", min, nil},
		{"body int", envWith("07 01"), nil},
		{"body null", envWith("07 f6"), nil},
		{"body map int keys", envWith("07 a2 01 61 61 02 80"), nil},
		{"body map text keys", envWith("07 a2 61 61 01 61 62 02"), nil},
		{"body bytes", envWith("07 43 010203"), nil},
		{"body float", envWith("07 f9 3e00"), nil},
		{"body max nesting", envWith("07 " + nested(fence.MaxNesting-1)), nil},
		{"body max array", envWith("07 " + chead(4, fence.MaxArrayElems) + strings.Repeat(" 00", fence.MaxArrayElems)), nil},
		{"issued at", envWith("08 1b 0000018bcfe56800"), nil},
		{"issued at negative", envWith("08 20"), nil},
		{"holder", envWith("09 " + tstr("gw-1")), nil},
		{"holder unicode", envWith("09 " + tstr("passerelle-é")), nil},
		{"epoch", envWith("0a 01"), nil},
		{"epoch max", envWith("0a 1b ffffffffffffffff"), nil},
		{"epoch before auth", envWith("09 "+tstr("gw"), "0a 1a 6553f100"), nil},
		{"all optional", envWith("07 80", "08 01", "09 "+tstr("gw")), nil},
		{"device max length", envDevice(tstr(strings.Repeat("d", fence.MaxDeviceIDLen))), nil},
		{"device charset", envDevice(tstr("Az09._-")), nil},
		{"device leading dash", envDevice(tstr("-x")), nil},
		{"max token and seq", h(cmap(pV, pDev, "03 1b ffffffffffffffff", "04 1b ffffffffffffffff", pID, pKind)), nil},
		// Accepted but not canonical; re-encoding normalises.
		{"keys out of order", h(cmap(pKind, pID, pSeq, pTok, pDev, pV)), min},
		{"non-shortest token", h(cmap(pV, pDev, "03 18 07", pSeq, pID, pKind)), min},
		{"non-shortest key", h(cmap("18 01 01", pDev, pTok, pSeq, pID, pKind)), min},
		{"explicit zero issued at", envWith("08 00"), min},
		{"empty holder", envWith("09 60"), min},
		{"empty auth", envWith("0f 40"), min},
		{"explicit zero epoch", envWith("0a 00"), min},
	}
}

type invalidCase struct {
	name     string
	in       []byte
	tooLarge bool
}

func invalidEnvelopeCases() []invalidCase {
	oversize := append(envWith(), make([]byte, fence.MaxEnvelopeSize)...)[:fence.MaxEnvelopeSize+1]
	bigBody := envWith("07 5a 00010000 " + strings.Repeat("00", 1<<16))
	cases := []invalidCase{
		// Garbage.
		{"empty", nil, false},
		{"break byte", h("ff"), false},
		{"uint", h("00"), false},
		{"null", h("f6"), false},
		{"empty map", h("a0"), false},
		{"empty array", h("80"), false},
		{"array of fields", h("86 01 62 6431 07 01 62 6331 63 736574"), false},
		{"reserved additional info", h("1c"), false},
		{"reserved simple", h("f8 00"), false},
		{"json", []byte(`{"1":1,"2":"d1","3":7,"4":1,"5":"c1","6":"set"}`), false},
		{"text", []byte("hello, fence"), false},
		{"trailing byte", append(envWith(), 0x00), false},
		{"two envelopes", append(envWith(), envWith()...), false},
		{"map header only", h("a6"), false},
		{"map too short", h(cmap(pV, pDev, pTok, pSeq, pID, pKind))[:12], false},

		// Duplicate keys.
		{"duplicate version", h(cmap(pV, pV, pDev, pTok, pSeq, pID, pKind)), false},
		{"duplicate token", h(cmap(pV, pDev, pTok, "03 09", pSeq, pID, pKind)), false},
		{"duplicate token same value", h(cmap(pV, pDev, pTok, pTok, pSeq, pID, pKind)), false},
		{"duplicate token non-shortest key", h(cmap(pV, pDev, pTok, "18 03 09", pSeq, pID, pKind)), false},
		{"duplicate optional", envWith("07 01", "07 02"), false},
		{"duplicate key in body", envWith("07 a2 61 61 01 61 61 02"), false},
		{"duplicate int key in body", envWith("07 a2 01 01 01 02"), false},
		{"duplicate non-shortest key in body", envWith("07 a2 01 01 18 01 02"), false},
		// Valid CBOR, but no Go map can hold these keys, so no body decoder
		// could read them; refused at the fence point.
		{"array as map key in body", envWith("07 a1 81 01 01"), false},
		{"map as map key in body", envWith("07 a1 a0 01"), false},

		// Indefinite lengths.
		{"indefinite map", h("bf " + strings.Join([]string{pV, pDev, pTok, pSeq, pID, pKind}, " ") + " ff"), false},
		{"indefinite device", envDevice("7f 61 64 61 31 ff"), false},
		{"indefinite array in body", envWith("07 9f 01 ff"), false},
		{"indefinite map in body", envWith("07 bf ff"), false},
		{"indefinite bytes in body", envWith("07 5f 41 00 ff"), false},
		{"indefinite text in body", envWith("07 7f 61 61 ff"), false},

		// Tags.
		{"tagged envelope", append(h("d9 d9f7"), envWith()...), false},
		{"tagged token", h(cmap(pV, pDev, "03 c1 07", pSeq, pID, pKind)), false},
		{"bignum token", h(cmap(pV, pDev, "03 c2 41 07", pSeq, pID, pKind)), false},
		{"tag in body", envWith("07 c1 1a 6553f100"), false},
		{"nested tag in body", envWith("07 81 d8 20 61 61"), false},

		// Unknown fields.
		{"unknown key 11", envWith("0b 01"), false},
		{"epoch negative", envWith("0a 20"), false},
		{"epoch as text", envWith("0a 61 31"), false},
		{"epoch tagged", envWith("0a c1 01"), false},
		{"epoch over 2^64", envWith("0a c2 49 010000000000000000"), false},
		{"unknown key 0", h(cmap("00 01", pV, pDev, pTok, pSeq, pID, pKind)), false},
		{"unknown key 16", envWith("10 01"), false},
		{"negative key", h(cmap("20 01", pV, pDev, pTok, pSeq, pID, pKind)), false},
		{"text key", envWith("61 61 01"), false},
		{"text key for a field", h(cmap(pV, pDev, pTok, pSeq, pID, pKind, "61 37 01")), false},
		{"byte string key", envWith("41 07 01"), false},
		{"float key", envWith("f9 3c00 01"), false},
		{"array key", envWith("81 01 01"), false},

		// Wrong types.
		{"token as text", h(cmap(pV, pDev, "03 61 37", pSeq, pID, pKind)), false},
		{"token negative", h(cmap(pV, pDev, "03 26", pSeq, pID, pKind)), false},
		{"token float", h(cmap(pV, pDev, "03 f9 4700", pSeq, pID, pKind)), false},
		{"token bool", h(cmap(pV, pDev, "03 f5", pSeq, pID, pKind)), false},
		{"token array", h(cmap(pV, pDev, "03 81 07", pSeq, pID, pKind)), false},
		{"seq as bytes", h(cmap(pV, pDev, pTok, "04 41 01", pID, pKind)), false},
		{"seq negative", h(cmap(pV, pDev, pTok, "04 20", pID, pKind)), false},
		{"device as uint", envDevice("01"), false},
		{"device as bytes", envDevice("42 6431"), false},
		{"device as array", envDevice("81 62 6431"), false},
		{"version as text", h(cmap("01 61 31", pDev, pTok, pSeq, pID, pKind)), false},
		{"version overflows uint8", h(cmap("01 19 0101", pDev, pTok, pSeq, pID, pKind)), false},
		{"kind as uint", h(cmap(pV, pDev, pTok, pSeq, pID, "06 01")), false},
		{"issued at as text", envWith("08 61 31"), false},
		{"issued at overflows int64", envWith("08 1b 8000000000000000"), false},
		{"holder as uint", envWith("09 01"), false},
		{"auth as uint", envWith("0f 01"), false},

		// Field values.
		{"version 0", h(cmap("01 00", pDev, pTok, pSeq, pID, pKind)), false},
		{"version 2", h(cmap("01 02", pDev, pTok, pSeq, pID, pKind)), false},
		{"version missing", h(cmap(pDev, pTok, pSeq, pID, pKind)), false},
		{"token 0", h(cmap(pV, pDev, "03 00", pSeq, pID, pKind)), false},
		{"token null", h(cmap(pV, pDev, "03 f6", pSeq, pID, pKind)), false},
		{"token missing", h(cmap(pV, pDev, pSeq, pID, pKind)), false},
		{"seq 0", h(cmap(pV, pDev, pTok, "04 00", pID, pKind)), false},
		{"seq missing", h(cmap(pV, pDev, pTok, pID, pKind)), false},
		{"device missing", h(cmap(pV, pTok, pSeq, pID, pKind)), false},
		{"id missing", h(cmap(pV, pDev, pTok, pSeq, pKind)), false},
		{"id empty", h(cmap(pV, pDev, pTok, pSeq, "05 60", pKind)), false},
		{"id too long", h(cmap(pV, pDev, pTok, pSeq, "05 "+tstr(strings.Repeat("i", fence.MaxIDLen+1)), pKind)), false},
		{"id space", h(cmap(pV, pDev, pTok, pSeq, "05 "+tstr("c 1"), pKind)), false},
		{"kind missing", h(cmap(pV, pDev, pTok, pSeq, pID)), false},
		{"kind too long", h(cmap(pV, pDev, pTok, pSeq, pID, "06 "+tstr(strings.Repeat("k", fence.MaxKindLen+1)))), false},
		{"kind newline", h(cmap(pV, pDev, pTok, pSeq, pID, "06 "+tstr("set\n"))), false},
		{"holder too long", envWith("09 " + tstr(strings.Repeat("g", fence.MaxHolderLen+1))), false},
		{"auth present", envWith("0f 41 00"), false},
		{"auth cose-like", envWith("0f 58 20 " + strings.Repeat("ab", 32)), false},

		// Invalid UTF-8.
		{"device invalid utf-8", envDevice("62 ff 31"), false},
		{"holder invalid utf-8", envWith("09 62 c3 28"), false},
		{"holder surrogate", envWith("09 63 eda080"), false},
		{"kind invalid utf-8", h(cmap(pV, pDev, pTok, pSeq, pID, "06 63 73 65 f4")), false},
		{"body invalid utf-8", envWith("07 62 c3 28"), false},
		{"body map key invalid utf-8", envWith("07 a1 61 ff 01"), false},

		// Huge declared lengths with little data behind them.
		{"device 2^32 bytes", envDevice("7b 0000000100000000 6431"), false},
		{"device 2^64-1 bytes", envDevice("7b ffffffffffffffff 6431"), false},
		{"body bytes 2^32-1", envWith("07 5a ffffffff 00"), false},
		{"body array 2^32", envWith("07 9b 0000000100000000 01"), false},
		{"body array 2^64-1", envWith("07 9b ffffffffffffffff 01"), false},
		{"body map 2^32", envWith("07 bb 0000000100000000 01 01"), false},
		{"body array over limit", envWith("07 " + chead(4, fence.MaxArrayElems+1) + strings.Repeat(" 00", fence.MaxArrayElems+1)), false},
		{"body map over limit", envWith("07 " + chead(5, fence.MaxMapPairs+1) + " 00 00"), false},
		{"envelope array 2^32", h("9b 0000000100000000 00"), false},
		{"envelope map 2^32", h("bb 0000000100000000 01 01"), false},
		{"envelope map 2^64-1", h("bb ffffffffffffffff 01 01"), false},

		// Nesting.
		{"body nesting over limit", envWith("07 " + nested(fence.MaxNesting)), false},
		{"body nesting far over limit", envWith("07 " + nested(10*fence.MaxNesting)), false},
		{"body nested maps over limit", envWith("07 " + strings.Repeat("a1 00 ", fence.MaxNesting) + "00"), false},

		// Size.
		{"oversize padding", oversize, true},
		{"oversize body", bigBody, true},
		{"body over MaxBodySize", envWith("07 59 " + fmt.Sprintf("%04x", fence.MaxBodySize-2) + strings.Repeat(" 00", fence.MaxBodySize-2)), false},
	}
	for _, id := range []string{"", strings.Repeat("d", fence.MaxDeviceIDLen+1), "a/b", "a+b", "a#b", "+", "#", "a b", " a", ".hidden", ".", "..", "dev\x00", "dév", "a:b", "a\tb"} {
		cases = append(cases, invalidCase{fmt.Sprintf("device %q", id), envDevice(tstr(id)), false})
	}
	return cases
}

func TestUnmarshalEnvelopeValid(t *testing.T) {
	for _, tt := range validEnvelopeCases() {
		t.Run(tt.name, func(t *testing.T) {
			e, err := fence.UnmarshalEnvelope(tt.in)
			if err != nil {
				t.Fatalf("UnmarshalEnvelope(%x) = %v", tt.in, err)
			}
			b, err := fence.MarshalEnvelope(e)
			if err != nil {
				t.Fatalf("MarshalEnvelope(decoded %+v) = %v", e, err)
			}
			want := tt.canonical
			if want == nil {
				want = tt.in
			}
			if !bytes.Equal(b, want) {
				t.Errorf("re-encoded as\n%x\nwant\n%x", b, want)
			}
		})
	}
}

func TestUnmarshalEnvelopeRejects(t *testing.T) {
	for _, tt := range invalidEnvelopeCases() {
		t.Run(tt.name, func(t *testing.T) {
			e, err := fence.UnmarshalEnvelope(tt.in)
			if err == nil {
				t.Fatalf("UnmarshalEnvelope(%.64x) = %+v, want error", tt.in, e)
			}
			if e != nil {
				t.Errorf("UnmarshalEnvelope returned %+v along with error %v", e, err)
			}
			if !errors.Is(err, fence.ErrInvalid) {
				t.Errorf("error %v does not wrap ErrInvalid", err)
			}
			if got := errors.Is(err, fence.ErrTooLarge); got != tt.tooLarge {
				t.Errorf("errors.Is(%v, ErrTooLarge) = %v, want %v", err, got, tt.tooLarge)
			}
		})
	}
}

func TestUnmarshalEnvelopeBodyAtMaxBodySize(t *testing.T) {
	// A byte string body of exactly MaxBodySize encoded bytes is accepted.
	n := fence.MaxBodySize - 3
	b := envWith("07 59 " + fmt.Sprintf("%04x", n) + strings.Repeat(" 00", n))
	e, err := fence.UnmarshalEnvelope(b)
	if err != nil {
		t.Fatalf("body of %d bytes: %v", fence.MaxBodySize, err)
	}
	if len(e.Body) != fence.MaxBodySize {
		t.Fatalf("body is %d bytes, want %d", len(e.Body), fence.MaxBodySize)
	}
}

func TestUnmarshalEnvelopeEveryPrefixFails(t *testing.T) {
	full, err := fence.MarshalEnvelope(fullEnvelope(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, valid := range [][]byte{envWith(), full} {
		for i := range len(valid) {
			e, err := fence.UnmarshalEnvelope(valid[:i])
			if err == nil || e != nil {
				t.Fatalf("prefix of %d/%d bytes decoded: %+v, %v", i, len(valid), e, err)
			}
			if !errors.Is(err, fence.ErrInvalid) {
				t.Fatalf("prefix of %d bytes: %v does not wrap ErrInvalid", i, err)
			}
		}
	}
}

func TestUnmarshalEnvelopeCorruptBytes(t *testing.T) {
	// Every single-byte corruption either decodes to a valid envelope or
	// fails with ErrInvalid; nothing panics.
	valid, err := fence.MarshalEnvelope(fullEnvelope(t))
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, len(valid))
	for i := range valid {
		for _, x := range []byte{0x00, 0x01, 0x17, 0x18, 0x1f, 0x3f, 0x5f, 0x7f, 0x9f, 0xbf, 0xc0, 0xdf, 0xf6, 0xff, valid[i] ^ 0x80, valid[i] + 1} {
			copy(b, valid)
			b[i] = x
			e, err := fence.UnmarshalEnvelope(b)
			if err != nil {
				if !errors.Is(err, fence.ErrInvalid) {
					t.Fatalf("byte %d = %#x: %v does not wrap ErrInvalid", i, x, err)
				}
				continue
			}
			if err := e.Validate(); err != nil {
				t.Fatalf("byte %d = %#x: decoded envelope fails Validate: %v", i, x, err)
			}
		}
	}
}

func TestUnmarshalHugeLengthsFailFast(t *testing.T) {
	inputs := [][]byte{
		envDevice("7b 0000000100000000 6431"),
		envWith("07 5b 7fffffffffffffff 00"),
		envWith("07 9b 0000000100000000 01"),
		envWith("07 bb 0000000100000000 01 01"),
		envWith("07 " + strings.Repeat("9a ffffffff ", 10) + "01"),
		h("9b 0000000100000000 00"),
		h("bb ffffffffffffffff 01 01"),
		h("a1 07 5a ffffffff"),
	}
	const rounds = 50
	for _, in := range inputs {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		start := time.Now()
		for range rounds {
			if _, err := fence.UnmarshalEnvelope(in); !errors.Is(err, fence.ErrInvalid) {
				t.Fatalf("UnmarshalEnvelope(%x) = %v, want ErrInvalid", in, err)
			}
			if _, err := fence.UnmarshalAck(in); !errors.Is(err, fence.ErrInvalid) {
				t.Fatalf("UnmarshalAck(%x) = %v, want ErrInvalid", in, err)
			}
		}
		elapsed := time.Since(start)
		runtime.ReadMemStats(&after)
		perOp := (after.TotalAlloc - before.TotalAlloc) / (2 * rounds)
		if perOp > 16<<10 {
			t.Errorf("%x: %d bytes allocated per decode, want a small constant", in, perOp)
		}
		if elapsed > 30*time.Second { // only a pathological decoder: figures are in BENCHMARKS
			t.Errorf("%x: %d decodes took %v", in, 2*rounds, elapsed)
		}
	}
}

func TestMarshalEnvelopeRejects(t *testing.T) {
	deep, err := fence.EncodeBody(nestedSlice(fence.MaxNesting))
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name   string
		modify func(*fence.Envelope)
	}{
		{"version 0", func(e *fence.Envelope) { e.V = 0 }},
		{"version 2", func(e *fence.Envelope) { e.V = 2 }},
		{"token 0", func(e *fence.Envelope) { e.Token = 0 }},
		{"seq 0", func(e *fence.Envelope) { e.Seq = 0 }},
		{"device empty", func(e *fence.Envelope) { e.Device = "" }},
		{"device slash", func(e *fence.Envelope) { e.Device = "a/b" }},
		{"device plus", func(e *fence.Envelope) { e.Device = "a+" }},
		{"device hash", func(e *fence.Envelope) { e.Device = "#" }},
		{"device space", func(e *fence.Envelope) { e.Device = "a b" }},
		{"device leading dot", func(e *fence.Envelope) { e.Device = ".a" }},
		{"device too long", func(e *fence.Envelope) { e.Device = strings.Repeat("d", fence.MaxDeviceIDLen+1) }},
		{"id empty", func(e *fence.Envelope) { e.ID = "" }},
		{"id too long", func(e *fence.Envelope) { e.ID = strings.Repeat("i", fence.MaxIDLen+1) }},
		{"kind empty", func(e *fence.Envelope) { e.Kind = "" }},
		{"kind bad char", func(e *fence.Envelope) { e.Kind = "set!" }},
		{"holder too long", func(e *fence.Envelope) { e.Holder = strings.Repeat("g", fence.MaxHolderLen+1) }},
		{"holder invalid utf-8", func(e *fence.Envelope) { e.Holder = "\xff" }},
		{"auth present", func(e *fence.Envelope) { e.Auth = []byte{1} }},
		{"body too large", func(e *fence.Envelope) { e.Body = make([]byte, fence.MaxBodySize+1) }},
		{"body not cbor", func(e *fence.Envelope) { e.Body = h("ff") }},
		{"body truncated", func(e *fence.Envelope) { e.Body = h("82 01") }},
		{"body two items", func(e *fence.Envelope) { e.Body = h("01 02") }},
		{"body indefinite", func(e *fence.Envelope) { e.Body = h("9f ff") }},
		{"body tag", func(e *fence.Envelope) { e.Body = h("c1 01") }},
		{"body duplicate key", func(e *fence.Envelope) { e.Body = h("a2 01 01 01 02") }},
		{"body invalid utf-8", func(e *fence.Envelope) { e.Body = h("61 ff") }},
		{"body too deep for an envelope", func(e *fence.Envelope) { e.Body = deep }},
		{"body array over limit", func(e *fence.Envelope) {
			e.Body = h(chead(4, fence.MaxArrayElems+1) + strings.Repeat(" 00", fence.MaxArrayElems+1))
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := *fullEnvelope(t)
			tt.modify(&e)
			if err := e.Validate(); !errors.Is(err, fence.ErrInvalid) {
				t.Errorf("Validate() = %v, want ErrInvalid", err)
			}
			b, err := fence.MarshalEnvelope(&e)
			if err == nil {
				t.Fatalf("MarshalEnvelope = %x, want error", b)
			}
			if !errors.Is(err, fence.ErrInvalid) {
				t.Errorf("MarshalEnvelope error %v does not wrap ErrInvalid", err)
			}
		})
	}
}

// nestedSlice returns 1 wrapped in depth single-element arrays.
func nestedSlice(depth int) any {
	var v any = uint64(1)
	for range depth {
		v = []any{v}
	}
	return v
}

func TestBodyNestingLimits(t *testing.T) {
	// The envelope map is the first level, so a body may nest MaxNesting-1
	// levels; on its own, DecodeBody allows MaxNesting.
	for depth := fence.MaxNesting - 2; depth <= fence.MaxNesting+1; depth++ {
		body, err := fence.EncodeBody(nestedSlice(depth))
		if err != nil {
			t.Fatalf("EncodeBody(depth %d): %v", depth, err)
		}
		e := minimalEnvelope
		e.Body = body
		b, merr := fence.MarshalEnvelope(&e)
		_, uerr := fence.UnmarshalEnvelope(envWith("07 " + nested(depth)))
		var v any
		derr := fence.DecodeBody(body, &v)
		inEnvelope := depth <= fence.MaxNesting-1
		if (merr == nil) != inEnvelope || (uerr == nil) != inEnvelope {
			t.Errorf("depth %d: MarshalEnvelope err %v, UnmarshalEnvelope err %v; want ok=%v for both", depth, merr, uerr, inEnvelope)
		}
		if merr == nil {
			if _, err := fence.UnmarshalEnvelope(b); err != nil {
				t.Errorf("depth %d: MarshalEnvelope output rejected by UnmarshalEnvelope: %v", depth, err)
			}
		}
		if (derr == nil) != (depth <= fence.MaxNesting) {
			t.Errorf("depth %d: DecodeBody err %v", depth, derr)
		}
		for _, err := range []error{merr, uerr, derr} {
			if err != nil && !errors.Is(err, fence.ErrInvalid) {
				t.Errorf("depth %d: %v does not wrap ErrInvalid", depth, err)
			}
		}
	}
}

func TestEncodeDecodeBodyLimits(t *testing.T) {
	if _, err := fence.EncodeBody(make([]byte, fence.MaxBodySize)); !errors.Is(err, fence.ErrTooLarge) {
		t.Errorf("EncodeBody(%d bytes) = %v, want ErrTooLarge", fence.MaxBodySize, err)
	}
	if _, err := fence.EncodeBody(make(chan int)); err == nil {
		t.Error("EncodeBody(chan) succeeded")
	}
	var v any
	if err := fence.DecodeBody(make([]byte, fence.MaxBodySize+1), &v); !errors.Is(err, fence.ErrInvalid) || !errors.Is(err, fence.ErrTooLarge) {
		t.Errorf("DecodeBody(oversize) = %v, want ErrInvalid and ErrTooLarge", err)
	}
	for _, in := range []string{"", "ff", "9f ff", "c1 01", "a2 61 61 01 61 61 02", "61 ff", "82 01", "01 02", "9b ffffffffffffffff"} {
		if err := fence.DecodeBody(h(in), &v); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("DecodeBody(%s) = %v, want ErrInvalid", in, err)
		}
	}
}

// Acks.

const (
	aV    = "01 01"
	aDev  = "02 62 6431"
	aID   = "03 62 6331"
	aVerd = "04 03"
)

func fullAck() *fence.Ack {
	return &fence.Ack{V: fence.Version, Device: "pump-07", ID: "cmd:0190/abc-1", Verdict: fence.Stale,
		Token: 7, Seq: 2, MaxToken: 1<<40 + 3, LastSeq: 12, Reason: "superseded by token 1099511627779"}
}

func ackWith(extra ...string) []byte {
	return h(cmap(append([]string{aV, aDev, aID, aVerd}, extra...)...))
}

func TestAckRoundTrip(t *testing.T) {
	for _, a := range []*fence.Ack{
		fullAck(),
		{V: fence.Version, Verdict: fence.Invalid, Reason: "unreadable envelope"},
		{V: fence.Version, Device: "d1", ID: "c1", Verdict: fence.Accepted, Token: 7, Seq: 1, MaxToken: 7, LastSeq: 1},
		{V: fence.Version, Device: "d1", Verdict: fence.Expired},
		{V: fence.Version, Device: "d1", ID: "c1", Verdict: fence.Stale, Token: 7, Seq: 1, MaxToken: 2, LastSeq: 1, Reason: "epoch 3 closed: the fence point is at epoch 5", Epoch: 5},
	} {
		b, err := fence.MarshalAck(a)
		if err != nil {
			t.Fatalf("MarshalAck(%+v): %v", a, err)
		}
		got, err := fence.UnmarshalAck(b)
		if err != nil {
			t.Fatalf("UnmarshalAck(%x): %v", b, err)
		}
		if *got != *a {
			t.Errorf("round trip:\n got %+v\nwant %+v", got, a)
		}
		b2, err := fence.MarshalAck(got)
		if err != nil || !bytes.Equal(b, b2) {
			t.Errorf("re-encoding differs: %x, %v; want %x", b2, err, b)
		}
		if len(b) > fence.MaxAckSize {
			t.Errorf("ack is %d bytes, over MaxAckSize", len(b))
		}
	}
}

func TestAckEncoding(t *testing.T) {
	a := fence.Ack{V: 1, Device: "d1", ID: "c1", Verdict: fence.Stale, Token: 7, Seq: 1, MaxToken: 9, LastSeq: 3, Reason: "r"}
	b, err := fence.MarshalAck(&a)
	if err != nil {
		t.Fatal(err)
	}
	// The verdict travels as a small integer, keys ascending.
	want := ackWith("05 07", "06 01", "07 09", "08 03", "09 61 72")
	if !bytes.Equal(b, want) {
		t.Errorf("MarshalAck =\n%x\nwant\n%x", b, want)
	}
	for range 10 {
		b2, _ := fence.MarshalAck(&a)
		if !bytes.Equal(b, b2) {
			t.Fatal("MarshalAck not deterministic")
		}
	}
	// The epoch is key 10, after the reason; absent when 0.
	a.Epoch = 1767225600123
	if b, err := fence.MarshalAck(&a); err != nil || !bytes.Equal(b, ackWith("05 07", "06 01", "07 09", "08 03", "09 61 72", "0a 1b 0000019b76daa87b")) {
		t.Errorf("MarshalAck with an epoch = %x, %v", b, err)
	}
}

// An envelope's epoch is key 10, after the holder; absent when 0, so an
// envelope of epoch 0 keeps the bytes it had before epochs existed.
func TestEnvelopeEpochEncoding(t *testing.T) {
	e := fence.Envelope{V: 1, Device: "d1", Token: 7, Seq: 1, ID: "c1", Kind: "set", Holder: "gw"}
	b, err := fence.MarshalEnvelope(&e)
	if err != nil || !bytes.Equal(b, envWith("09 "+tstr("gw"))) {
		t.Fatalf("epoch 0: %x %v", b, err)
	}
	e.Epoch = 5
	if b, err = fence.MarshalEnvelope(&e); err != nil || !bytes.Equal(b, envWith("09 "+tstr("gw"), "0a 05")) {
		t.Fatalf("epoch 5: %x %v", b, err)
	}
	if got, err := fence.UnmarshalEnvelope(b); err != nil || got.Epoch != 5 {
		t.Fatalf("decoded %+v %v", got, err)
	}
}

func TestAckLargestFitsLimit(t *testing.T) {
	a := fence.Ack{V: 1, Device: strings.Repeat("d", fence.MaxDeviceIDLen), ID: strings.Repeat("i", fence.MaxIDLen),
		Verdict: fence.Invalid, Token: ^fence.Token(0), Seq: ^uint64(0), MaxToken: ^fence.Token(0), LastSeq: ^uint64(0),
		Reason: strings.Repeat("r", fence.MaxReasonLen)}
	b, err := fence.MarshalAck(&a)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fence.UnmarshalAck(b); err != nil {
		t.Fatalf("largest valid ack (%d bytes) rejected: %v", len(b), err)
	}
}

func validAckCases() [][]byte {
	return [][]byte{
		ackWith(),
		h(cmap(aV, "02 60", "04 04")), // unreadable envelope: empty device, no id
		ackWith("05 07", "06 01", "07 09", "08 03", "09 61 72"),
		h(cmap(aV, aDev, aID, "04 01")),
		h(cmap(aV, aDev, aID, "04 05")),
		ackWith("05 07", "06 01", "07 09", "08 03", "09 61 72", "0a 1b 0000018bcfe56800"),
	}
}

func invalidAckCases() []invalidCase {
	cases := []invalidCase{
		{"empty", nil, false},
		{"garbage", h("ff ff"), false},
		{"null", h("f6"), false},
		{"empty map", h("a0"), false},
		{"trailing", append(ackWith(), 0), false},
		{"envelope", envWith(), false},
		{"version 0", h(cmap("01 00", aDev, aID, aVerd)), false},
		{"version 2", h(cmap("01 02", aDev, aID, aVerd)), false},
		{"verdict 0", h(cmap(aV, aDev, aID, "04 00")), false},
		{"verdict 7", h(cmap(aV, aDev, aID, "04 07")), false},
		{"verdict missing", h(cmap(aV, aDev, aID)), false},
		{"verdict as text", h(cmap(aV, aDev, aID, "04 65 7374616c65")), false},
		{"verdict overflows uint8", h(cmap(aV, aDev, aID, "04 19 0103")), false},
		{"bad device", h(cmap(aV, "02 "+tstr("a/b"), aID, aVerd)), false},
		{"bad id", h(cmap(aV, aDev, "03 "+tstr("a b"), aVerd)), false},
		{"reason too long", ackWith("09 " + tstr(strings.Repeat("r", fence.MaxReasonLen+1))), false},
		{"reason invalid utf-8", ackWith("09 62 c3 28"), false},
		{"duplicate key", h(cmap(aV, aDev, aID, aVerd, aVerd)), false},
		{"unknown key", ackWith("0b 00"), false},
		{"negative epoch", ackWith("0a 20"), false},
		{"text key", ackWith("61 61 00"), false},
		{"indefinite map", h("bf " + strings.Join([]string{aV, aDev, aID, aVerd}, " ") + " ff"), false},
		{"indefinite reason", ackWith("09 7f 61 72 ff"), false},
		{"tag", append(h("d9 d9f7"), ackWith()...), false},
		{"tagged token", ackWith("05 c1 07"), false},
		{"negative token", ackWith("05 26"), false},
		{"huge reason length", ackWith("09 7b 0000000100000000 72"), false},
		{"oversize", append(ackWith(), make([]byte, fence.MaxAckSize)...), true},
	}
	return cases
}

func TestUnmarshalAckValid(t *testing.T) {
	for _, in := range validAckCases() {
		a, err := fence.UnmarshalAck(in)
		if err != nil {
			t.Errorf("UnmarshalAck(%x) = %v", in, err)
			continue
		}
		b, err := fence.MarshalAck(a)
		if err != nil || !bytes.Equal(b, in) {
			t.Errorf("UnmarshalAck(%x) re-encodes as %x, %v", in, b, err)
		}
	}
}

func TestUnmarshalAckRejects(t *testing.T) {
	for _, tt := range invalidAckCases() {
		t.Run(tt.name, func(t *testing.T) {
			a, err := fence.UnmarshalAck(tt.in)
			if err == nil || a != nil {
				t.Fatalf("UnmarshalAck(%.64x) = %+v, %v; want error", tt.in, a, err)
			}
			if !errors.Is(err, fence.ErrInvalid) {
				t.Errorf("%v does not wrap ErrInvalid", err)
			}
			if got := errors.Is(err, fence.ErrTooLarge); got != tt.tooLarge {
				t.Errorf("errors.Is(%v, ErrTooLarge) = %v, want %v", err, got, tt.tooLarge)
			}
		})
	}
	valid, err := fence.MarshalAck(fullAck())
	if err != nil {
		t.Fatal(err)
	}
	for i := range len(valid) {
		if a, err := fence.UnmarshalAck(valid[:i]); !errors.Is(err, fence.ErrInvalid) {
			t.Fatalf("prefix of %d bytes: %+v, %v", i, a, err)
		}
	}
}

func TestMarshalAckRejects(t *testing.T) {
	for _, tt := range []struct {
		name   string
		modify func(*fence.Ack)
	}{
		{"version 0", func(a *fence.Ack) { a.V = 0 }},
		{"verdict 0", func(a *fence.Ack) { a.Verdict = 0 }},
		{"verdict 7", func(a *fence.Ack) { a.Verdict = 7 }},
		{"bad device", func(a *fence.Ack) { a.Device = ".x" }},
		{"bad id", func(a *fence.Ack) { a.ID = "a b" }},
		{"reason too long", func(a *fence.Ack) { a.Reason = strings.Repeat("r", fence.MaxReasonLen+1) }},
		{"reason invalid utf-8", func(a *fence.Ack) { a.Reason = "\xc3\x28" }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a := fullAck()
			tt.modify(a)
			if b, err := fence.MarshalAck(a); !errors.Is(err, fence.ErrInvalid) {
				t.Errorf("MarshalAck = %x, %v; want ErrInvalid", b, err)
			}
		})
	}
}

// strictBody is a typed body for the unknown-field tests: a nested struct
// too, so that a key unknown inside it is named with its place.
type strictBody struct {
	Setpoint *float64 `cbor:"setpoint"`
	Mode     string   `cbor:"mode"`
	In       struct {
		Level int `cbor:"level"`
		Deep  struct {
			Y int `cbor:"y"`
		} `cbor:"deep"`
	} `cbor:"in"`
}

// unknownFieldCases are bodies with a key strictBody does not have, and
// what DecodeBody's error must say; FuzzDecodeBody's seeds.
func unknownFieldCases() []struct {
	name string
	in   any
	want string
} {
	return []struct {
		name string
		in   any
		want string
	}{
		{"first", map[string]any{"foo": 1}, `unknown field "foo"`},
		{"after known ones", map[string]any{"mode": "heat", "setpoint": 21.5, "zzz": true}, `unknown field "zzz"`},
		{"integer key", map[any]any{"mode": "heat", 7: 1}, `unknown field "7"`},
		{"nested", map[string]any{"mode": "heat", "in": map[string]any{"level": 1, "lvl": 2}}, `unknown field "lvl" in "in"`},
		{"two levels down", map[string]any{"in": map[string]any{"level": 1, "deep": map[string]any{"y": 2, "x": 1}}}, `unknown field in "in" (map element index 0)`},
	}
}

// An unknown key in a body is refused naming the key, not only its index in
// the map, at the top level and in a nested map.
func TestDecodeBodyNamesUnknownField(t *testing.T) {
	for _, tc := range unknownFieldCases() {
		t.Run(tc.name, func(t *testing.T) {
			b, err := fence.EncodeBody(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			var v strictBody
			err = fence.DecodeBody(b, &v)
			uf, ok := errors.AsType[*fence.UnknownFieldError](err)
			if !errors.Is(err, fence.ErrInvalid) || !ok || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("DecodeBody: %v (%#v); want ErrInvalid and an UnknownFieldError saying %s", err, uf, tc.want)
			}
		})
	}
}
