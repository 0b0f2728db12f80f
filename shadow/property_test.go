package shadow_test

import (
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/edgefence/edgefence/shadow"
)

// Few keys, so that documents and patches overlap often.
var keys = []string{"a", "b", "c", "d/e"}

// scalar draws a JSON scalar or array (a value that replaces whole).
func scalar(t *rapid.T, label string) any {
	switch rapid.IntRange(0, 5).Draw(t, label+".kind") {
	case 0:
		return float64(rapid.IntRange(-3, 3).Draw(t, label+".int"))
	case 1:
		return rapid.Float64Range(-10, 10).Draw(t, label+".float")
	case 2:
		return rapid.SampledFrom([]string{"", "x", "eco"}).Draw(t, label+".str")
	case 3:
		return rapid.Bool().Draw(t, label+".bool")
	case 4:
		n := rapid.IntRange(0, 2).Draw(t, label+".len")
		a := make([]any, n)
		for i := range a {
			a[i] = float64(rapid.IntRange(0, 2).Draw(t, label+".elem"))
		}
		return a
	default:
		return []any{map[string]any{"k": "v"}, nil}
	}
}

// object draws a JSON object up to depth levels; with nulls it may hold
// JSON nulls (a patch's deletions).
func object(t *rapid.T, label string, depth int, nulls bool) map[string]any {
	m := make(map[string]any)
	for _, k := range keys {
		kind := rapid.IntRange(0, 3).Draw(t, label+"."+k)
		switch {
		case kind == 0:
		case kind == 1 && nulls:
			m[k] = nil
		case kind == 2 && depth > 1:
			m[k] = object(t, label+"."+k, depth-1, nulls)
		default:
			m[k] = scalar(t, label+"."+k)
		}
	}
	return m
}

func patchGen(t *rapid.T, label string) map[string]any { return object(t, label, 3, true) }

// docGen draws a stored document: no nulls outside arrays.
func docGen(t *rapid.T, label string) map[string]any { return object(t, label, 3, false) }

// covers reports whether every field want sets has the same value in got
// (objects field by field).
func covers(got, want map[string]any) bool {
	for k, wv := range want {
		gv, ok := got[k]
		if !ok {
			return false
		}
		if wm, isObj := wv.(map[string]any); isObj {
			gm, ok := gv.(map[string]any)
			if !ok || !covers(gm, wm) {
				return false
			}
			continue
		}
		if !shadow.Equal(gv, wv) {
			return false
		}
	}
	return true
}

func TestPropMergeIdempotent(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		d, p := docGen(t, "d"), patchGen(t, "p")
		once := shadow.Merge(d, p)
		if twice := shadow.Merge(once, p); !shadow.Equal(once, twice) {
			t.Fatalf("merge twice %s != once %s", js(twice), js(once))
		}
	})
}

func TestPropMergeNullDeletes(t *testing.T) {
	var check func(t *rapid.T, got, p map[string]any)
	check = func(t *rapid.T, got, p map[string]any) {
		for k, v := range p {
			switch pv := v.(type) {
			case nil:
				if _, ok := got[k]; ok {
					t.Fatalf("field %q set to null survives: %s", k, js(got))
				}
			case map[string]any:
				gm, ok := got[k].(map[string]any)
				if !ok {
					t.Fatalf("field %q: patch object did not give an object", k)
				}
				check(t, gm, pv)
			default:
				if !shadow.Equal(got[k], v) {
					t.Fatalf("field %q = %v, patch set %v", k, got[k], v)
				}
			}
		}
	}
	rapid.Check(t, func(t *rapid.T) {
		d, p := docGen(t, "d"), patchGen(t, "p")
		check(t, shadow.Merge(d, p), p)
	})
}

func TestPropMergeKeepsUntouched(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		d, p := docGen(t, "d"), patchGen(t, "p")
		got := shadow.Merge(d, p)
		for k, v := range d {
			if _, touched := p[k]; !touched && !shadow.Equal(got[k], v) {
				t.Fatalf("untouched field %q changed", k)
			}
		}
	})
}

func TestPropMergeNoAliasing(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		d, p := docGen(t, "d"), patchGen(t, "p")
		d0, p0 := shadow.Clone(d), shadow.Clone(p)
		got := shadow.Merge(d, p)
		if !shadow.Equal(d, d0) || !shadow.Equal(p, p0) {
			t.Fatal("Merge modified an argument")
		}
		// Mutating the result leaves the arguments alone.
		scribble(got)
		if !shadow.Equal(d, d0) || !shadow.Equal(p, p0) {
			t.Fatal("result shares memory with an argument")
		}
	})
}

func scribble(m map[string]any) {
	for k, v := range m {
		switch x := v.(type) {
		case map[string]any:
			scribble(x)
		case []any:
			for i := range x {
				x[i] = "scribbled"
			}
		default:
			m[k] = "scribbled"
		}
	}
}

// Merge patches compose by merging when that means the same thing: when
// neither patch deletes (no nulls) and a field has the same kind (object
// or not) wherever it occurs. Fields "o…" are always objects here, "s…"
// never.
func TestPropMergeAssociative(t *testing.T) {
	var typed func(t *rapid.T, label string, depth int) map[string]any
	typed = func(t *rapid.T, label string, depth int) map[string]any {
		m := make(map[string]any)
		for _, k := range []string{"o1", "o2", "s1", "s2", "s3"} {
			if !rapid.Bool().Draw(t, label+"."+k+".set") {
				continue
			}
			if k[0] == 'o' && depth > 1 {
				m[k] = typed(t, label+"."+k, depth-1)
			} else if k[0] == 's' {
				m[k] = scalar(t, label+"."+k)
			}
		}
		return m
	}
	rapid.Check(t, func(t *rapid.T) {
		d, p1, p2 := typed(t, "d", 3), typed(t, "p1", 3), typed(t, "p2", 3)
		left := shadow.Merge(shadow.Merge(d, p1), p2)
		right := shadow.Merge(d, shadow.Merge(p1, p2))
		if !shadow.Equal(left, right) {
			t.Fatalf("(d+p1)+p2 = %s, d+(p1+p2) = %s", js(left), js(right))
		}
	})
}

func TestPropDeltaConverges(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		des, rep := docGen(t, "desired"), docGen(t, "reported")
		delta := shadow.Delta(des, rep)
		after := shadow.Merge(rep, delta)
		if !covers(after, des) {
			t.Fatalf("reported+delta = %s does not cover desired %s", js(after), js(des))
		}
		if d2 := shadow.Delta(des, after); len(d2) != 0 {
			t.Fatalf("delta after applying the delta: %s", js(d2))
		}
		if (len(delta) == 0) != covers(rep, des) {
			t.Fatalf("empty delta %v but covers %v", len(delta) == 0, covers(rep, des))
		}
		// Fields only reported has are left alone.
		for k, v := range rep {
			if _, ok := des[k]; !ok && !shadow.Equal(after[k], v) {
				t.Fatalf("reported-only field %q changed", k)
			}
		}
	})
}

func TestPropApplyPatchMeta(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		t0 := time.Unix(1700000000, 0).UTC()
		st := shadow.State{}
		var err error
		for i := range rapid.IntRange(1, 4).Draw(t, "n") {
			m := shadow.FieldMeta{At: t0.Add(time.Duration(i) * time.Second), By: "w", Token: int64(i + 1)}
			p := patchGen(t, "p")
			prev := st
			st, err = shadow.ApplyPatch(st, p, m, shadow.Limits{})
			if err != nil {
				t.Fatal(err)
			}
			if !shadow.Equal(st.Fields, shadow.Merge(prev.Fields, p)) {
				t.Fatal("ApplyPatch fields differ from Merge")
			}
			leaves := map[string]bool{}
			leafPaths(st.Fields, "", leaves)
			for path := range st.Meta {
				if !leaves[path] {
					t.Fatalf("meta for %q, not a leaf of %s", path, js(st.Fields))
				}
			}
			set := map[string]bool{}
			leafPaths(shadow.Merge(nil, p), "", set) // the leaves p sets (nulls dropped)
			for path := range set {
				if !leaves[path] {
					continue // an empty object merged into a non-empty one sets nothing
				}
				if got := st.Meta[path]; got.Token != m.Token {
					t.Fatalf("leaf %q set by patch %d has meta %+v", path, i, got)
				}
			}
		}
	})
}

func leafPaths(m map[string]any, base string, out map[string]bool) {
	for k, v := range m {
		p := base + "/" + escape(k)
		if sub, ok := v.(map[string]any); ok && len(sub) > 0 {
			leafPaths(sub, p, out)
		} else {
			out[p] = true
		}
	}
}

func escape(s string) string {
	out := ""
	for _, c := range s {
		switch c {
		case '~':
			out += "~0"
		case '/':
			out += "~1"
		default:
			out += string(c)
		}
	}
	return out
}

func TestPropCodecRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		d := docGen(t, "d")
		j, err := shadow.EncodeJSON(d)
		if err != nil {
			t.Fatal(err)
		}
		dj, err := shadow.DecodeJSON(j, shadow.Limits{})
		if err != nil || !shadow.Equal(dj, d) {
			t.Fatalf("JSON: %s -> %s (%v)", js(d), js(dj), err)
		}
		c, err := shadow.EncodeCBOR(d, shadow.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		dc, err := shadow.DecodeCBOR(c, shadow.Limits{})
		if err != nil || !shadow.Equal(dc, d) {
			t.Fatalf("CBOR: %s -> %s (%v)", js(d), js(dc), err)
		}
	})
}
