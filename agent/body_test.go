package agent

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/edgefence/edgefence/fence"
)

func TestJSONToBodyNumbers(t *testing.T) {
	b, err := JSONToBody([]byte(`{"setpoint": 22, "x": 1.5, "big": 18446744073709551615, "n": [-3]}`))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Setpoint float64 `cbor:"setpoint"`
		X        float64 `cbor:"x"`
		Big      uint64  `cbor:"big"`
		N        []int16 `cbor:"n"`
	}
	if err := fence.DecodeBody(b, &f); err != nil || f.Setpoint != 22 || f.X != 1.5 || f.Big != 1<<64-1 || f.N[0] != -3 {
		t.Fatalf("%+v %v", f, err)
	}
	if _, err := JSONToBody([]byte(`{} {}`)); err == nil {
		t.Fatal("two values accepted")
	}
}

// bodyRefusals are JSON bodies JSONToBody refuses, with what the error
// says; FuzzJSONToBody's seeds with the accepted ones.
var bodyRefusals = []struct{ in, want string }{
	{`{} {}`, "data after its JSON value"},
	{`{"a":1} garbage`, "data after its JSON value"},
	{`{"setpoint": 1e999}`, `"setpoint": 1e999 is beyond a 64-bit float (it would be sent as +Inf)`},
	{`[1, -1E400]`, `"[1]": -1E400 is beyond`},
	{`18446744073709551616`, `the body: integer 18446744073709551616 does not fit in 64 bits`},
	{`{"a": {"b": [-9223372036854775809]}}`, `"a.b[0]": integer -9223372036854775809 does not fit`},
	{`{"x": 0.1e-400}`, `"x": 0.1e-400 is too small`},
}

func TestJSONToBodyRefusesWhatCBORCannotCarry(t *testing.T) {
	for _, tc := range bodyRefusals {
		if _, err := JSONToBody([]byte(tc.in)); !errors.Is(err, ErrBadBody) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("JSONToBody(%s): %v, want ErrBadBody saying %s", tc.in, err, tc.want)
		}
	}
	for _, in := range []string{`0e5`, `{"z": 0.0e-999}`, `-0`, `5e-324`, `1.7976931348623157e308`} {
		if _, err := JSONToBody([]byte(in)); err != nil {
			t.Errorf("JSONToBody(%s): %v", in, err)
		}
	}
}

// FuzzJSONToBody: any input is converted or refused with ErrBadBody (or
// a body limit), and what is converted holds only finite numbers.
func FuzzJSONToBody(f *testing.F) {
	for _, tc := range bodyRefusals {
		f.Add([]byte(tc.in))
	}
	f.Add([]byte(`{"setpoint": 22, "x": 1.5, "big": 18446744073709551615, "n": [-3]}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		b, err := JSONToBody(in)
		if err != nil {
			if !errors.Is(err, ErrBadBody) && !errors.Is(err, fence.ErrTooLarge) && !strings.Contains(err.Error(), "encode body") {
				t.Fatalf("JSONToBody(%q): %v", in, err)
			}
			return
		}
		if len(b) == 0 {
			return
		}
		var v any
		if err := fence.DecodeBody(b, &v); err != nil {
			t.Fatalf("JSONToBody(%q) = %x, which does not decode: %v", in, b, err)
		}
		var check func(any)
		check = func(v any) {
			switch x := v.(type) {
			case float64:
				if math.IsInf(x, 0) || math.IsNaN(x) {
					t.Fatalf("JSONToBody(%q) carries %v", in, x)
				}
			case map[string]any:
				for _, e := range x {
					check(e)
				}
			case []any:
				for _, e := range x {
					check(e)
				}
			}
		}
		check(v)
	})
}
