package shadow_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/edgefence/edgefence/shadow"
)

func shadowJSON(v any) ([]byte, error) { return json.Marshal(v) }

func TestMerge(t *testing.T) {
	cases := []struct{ name, dst, patch, want string }{
		{"partial update merges", `{"a":1,"b":2}`, `{"b":3,"c":4}`, `{"a":1,"b":3,"c":4}`},
		{"null deletes", `{"a":1,"b":2}`, `{"a":null}`, `{"b":2}`},
		{"null of missing field", `{"a":1}`, `{"z":null}`, `{"a":1}`},
		{"nested objects merge", `{"cfg":{"mode":"eco","fan":2}}`, `{"cfg":{"fan":3}}`, `{"cfg":{"fan":3,"mode":"eco"}}`},
		{"nested null deletes", `{"cfg":{"mode":"eco","fan":2}}`, `{"cfg":{"fan":null}}`, `{"cfg":{"mode":"eco"}}`},
		{"arrays replace", `{"sched":[1,2,3]}`, `{"sched":[4]}`, `{"sched":[4]}`},
		{"object replaces scalar", `{"a":1}`, `{"a":{"b":2}}`, `{"a":{"b":2}}`},
		{"scalar replaces object", `{"a":{"b":2}}`, `{"a":5}`, `{"a":5}`},
		{"object into missing, nulls dropped", `{}`, `{"a":{"b":null,"c":1}}`, `{"a":{"c":1}}`},
		{"empty patch", `{"a":1}`, `{}`, `{"a":1}`},
		{"null inside array kept", `{}`, `{"a":[null,1]}`, `{"a":[null,1]}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dst, patch := obj(t, c.dst), obj(t, c.patch)
			dstBefore, patchBefore := shadow.Clone(dst), shadow.Clone(patch)
			got := shadow.Merge(dst, patch)
			if !shadow.Equal(got, obj(t, c.want)) {
				t.Fatalf("Merge(%s, %s) = %s, want %s", c.dst, c.patch, js(got), c.want)
			}
			if !shadow.Equal(dst, dstBefore) || !shadow.Equal(patch, patchBefore) {
				t.Fatal("Merge modified its arguments")
			}
		})
	}
}

func TestDelta(t *testing.T) {
	cases := []struct{ name, desired, reported, want string }{
		{"in sync", `{"a":1}`, `{"a":1,"extra":2}`, `{}`},
		{"differs", `{"a":1,"b":2}`, `{"a":1,"b":3}`, `{"b":2}`},
		{"missing", `{"a":1}`, `{}`, `{"a":1}`},
		{"nested field by field", `{"cfg":{"mode":"eco","fan":2}}`, `{"cfg":{"mode":"eco","fan":1}}`, `{"cfg":{"fan":2}}`},
		{"arrays whole", `{"s":[1,2]}`, `{"s":[1,3]}`, `{"s":[1,2]}`},
		{"object vs scalar", `{"a":{"b":1}}`, `{"a":1}`, `{"a":{"b":1}}`},
		{"empty object vs missing", `{"a":{}}`, `{}`, `{"a":{}}`},
		{"empty object vs object", `{"a":{}}`, `{"a":{"x":1}}`, `{}`},
		{"types differ", `{"a":"1"}`, `{"a":1}`, `{"a":"1"}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := shadow.Delta(obj(t, c.desired), obj(t, c.reported))
			if !shadow.Equal(got, obj(t, c.want)) {
				t.Fatalf("Delta(%s, %s) = %s, want %s", c.desired, c.reported, js(got), c.want)
			}
		})
	}
}

func TestApplyPatchMeta(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	m1 := shadow.FieldMeta{At: t0, By: "gw-a", Token: 7}
	m2 := shadow.FieldMeta{At: t0.Add(time.Second), By: "gw-b", Token: 9}
	st, err := shadow.ApplyPatch(shadow.State{}, obj(t, `{"temp":21,"cfg":{"mode":"eco","fan":2},"a/b":1,"e":{}}`), m1, shadow.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]shadow.FieldMeta{"/temp": m1, "/cfg/mode": m1, "/cfg/fan": m1, "/a~1b": m1, "/e": m1}
	if !metaEqual(st.Meta, want) {
		t.Fatalf("meta %v, want %v", st.Meta, want)
	}
	st, err = shadow.ApplyPatch(st, obj(t, `{"cfg":{"fan":null,"mode":"boost"},"temp":{"c":21},"e":{"x":1}}`), m2, shadow.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	want = map[string]shadow.FieldMeta{"/temp/c": m2, "/cfg/mode": m2, "/a~1b": m1, "/e/x": m2}
	if !metaEqual(st.Meta, want) {
		t.Fatalf("meta %v, want %v", st.Meta, want)
	}
}

func metaEqual(a, b map[string]shadow.FieldMeta) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w, ok := b[k]
		if !ok || !v.At.Equal(w.At) || v.By != w.By || v.Token != w.Token {
			return false
		}
	}
	return true
}

func deep(n int) string {
	return strings.Repeat(`{"a":`, n) + "1" + strings.Repeat("}", n)
}

func TestDecodeJSONErrors(t *testing.T) {
	cases := []struct {
		name, in string
		want     error
	}{
		{"invalid", `{"a":`, shadow.ErrInvalid},
		{"not an object", `[1,2]`, shadow.ErrInvalid},
		{"null", `null`, shadow.ErrInvalid},
		{"number", `3`, shadow.ErrInvalid},
		{"trailing data", `{"a":1} {"b":2}`, shadow.ErrInvalid},
		{"empty", ``, shadow.ErrInvalid},
		{"too deep", deep(9), shadow.ErrTooDeep},
		{"too deep with arrays", `{"a":[[[[[[[[1]]]]]]]]}`, shadow.ErrTooDeep},
		{"too large", `{"a":"` + strings.Repeat("x", shadow.DefaultMaxSize) + `"}`, shadow.ErrTooLarge},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := shadow.DecodeJSON([]byte(c.in), shadow.Limits{})
			if !errors.Is(err, c.want) || !errors.Is(err, shadow.ErrInvalid) {
				t.Fatalf("err = %v, want %v (and ErrInvalid)", err, c.want)
			}
		})
	}
	if _, err := shadow.DecodeJSON([]byte(deep(8)), shadow.Limits{}); err != nil {
		t.Fatalf("depth 8 refused: %v", err)
	}
	if _, err := shadow.DecodeJSON([]byte(deep(3)), shadow.Limits{MaxDepth: 2}); !errors.Is(err, shadow.ErrTooDeep) {
		t.Fatalf("custom depth: %v", err)
	}
}

func TestNormalize(t *testing.T) {
	got, err := shadow.Normalize(map[string]any{"i": 21, "u": uint8(3), "f": float32(0.5), "n": json.Number("2"), "l": []any{int64(1)}}, shadow.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if want := obj(t, `{"i":21,"u":3,"f":0.5,"n":2,"l":[1]}`); !shadow.Equal(got, want) {
		t.Fatalf("got %s", js(got))
	}
	for name, bad := range map[string]map[string]any{
		"chan":   {"c": make(chan int)},
		"struct": {"s": struct{}{}},
		"nan":    {"x": []any{map[string]any{"y": nan()}}},
		"bytes":  {"b": []byte("x")},
	} {
		if _, err := shadow.Normalize(bad, shadow.Limits{}); !errors.Is(err, shadow.ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
}

func nan() float64 {
	zero := 0.0
	return zero / zero
}

func TestCBOR(t *testing.T) {
	doc := obj(t, `{"temp":21,"half":21.5,"neg":-3,"big":1e300,"name":"t1","on":true,"off":null,"cfg":{"sched":[1,"x",{"y":[]}]}}`)
	b, err := shadow.EncodeCBOR(doc, shadow.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := shadow.DecodeCBOR(b, shadow.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if !shadow.Equal(got, doc) {
		t.Fatalf("round trip: %s != %s", js(got), js(doc))
	}
	// Deterministic: the same document always encodes to the same bytes,
	// and a whole number is a CBOR integer (0x15 is 21).
	b2, _ := shadow.EncodeCBOR(shadow.Clone(doc), shadow.Limits{})
	if string(b) != string(b2) {
		t.Fatal("encoding not deterministic")
	}
	small, _ := shadow.EncodeCBOR(map[string]any{"t": 21.0}, shadow.Limits{})
	if want := []byte{0xa1, 0x61, 't', 0x15}; string(small) != string(want) {
		t.Fatalf("{t:21} = % x, want % x", small, want)
	}
	for name, in := range map[string][]byte{
		"not a map":       {0x83, 1, 2, 3},
		"int key":         {0xa1, 0x01, 0x02},
		"truncated":       {0xa1, 0x61},
		"trailing":        {0xa0, 0xa0},
		"tag":             {0xa1, 0x61, 'a', 0xc1, 0x01},
		"byte string":     {0xa1, 0x61, 'a', 0x41, 0x00},
		"duplicate keys":  {0xa2, 0x61, 'a', 0x01, 0x61, 'a', 0x02},
		"indefinite map":  {0xbf, 0xff},
		"empty input":     {},
		"invalid utf8 in": {0xa1, 0x61, 0xff, 0x01},
	} {
		if _, err := shadow.DecodeCBOR(in, shadow.Limits{}); !errors.Is(err, shadow.ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
	deepCBOR := append([]byte{}, []byte{}...)
	for range 9 {
		deepCBOR = append(deepCBOR, 0xa1, 0x61, 'a')
	}
	deepCBOR = append(deepCBOR, 0x01)
	if _, err := shadow.DecodeCBOR(deepCBOR, shadow.Limits{}); !errors.Is(err, shadow.ErrTooDeep) {
		t.Errorf("deep CBOR: %v", err)
	}
}

func FuzzDecodeJSON(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":1}`, `{"a":{"b":[1,null,"x"]}}`, `[1]`, `{"a":`, deep(9)} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := shadow.DecodeJSON(b, shadow.Limits{MaxSize: 4096})
		if err != nil {
			if !errors.Is(err, shadow.ErrInvalid) {
				t.Fatalf("error not ErrInvalid: %v", err)
			}
			return
		}
		// What decodes re-encodes and decodes to the same value, also as CBOR.
		enc, err := shadow.EncodeJSON(m)
		if err != nil {
			t.Fatal(err)
		}
		m2, err := shadow.DecodeJSON(enc, shadow.Limits{MaxSize: 1 << 20})
		if err != nil || !shadow.Equal(m, m2) {
			t.Fatalf("JSON round trip: %v", err)
		}
		c, err := shadow.EncodeCBOR(m, shadow.Limits{MaxSize: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		m3, err := shadow.DecodeCBOR(c, shadow.Limits{MaxSize: 1 << 20})
		if err != nil || !shadow.Equal(m, m3) {
			t.Fatalf("CBOR round trip: %v", err)
		}
	})
}

func FuzzDecodeCBOR(f *testing.F) {
	for _, b := range [][]byte{{0xa0}, {0xa1, 0x61, 't', 0x15}, {0x83, 1, 2, 3}, {0xa1, 0x61, 'a', 0xc1, 0x01}} {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := shadow.DecodeCBOR(b, shadow.Limits{MaxSize: 4096})
		if err != nil {
			if !errors.Is(err, shadow.ErrInvalid) {
				t.Fatalf("error not ErrInvalid: %v", err)
			}
			return
		}
		c, err := shadow.EncodeCBOR(m, shadow.Limits{MaxSize: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		m2, err := shadow.DecodeCBOR(c, shadow.Limits{MaxSize: 1 << 20})
		if err != nil || !shadow.Equal(m, m2) {
			t.Fatalf("CBOR round trip: %v", err)
		}
	})
}
