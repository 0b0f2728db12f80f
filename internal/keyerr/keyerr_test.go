package keyerr

import (
	"errors"
	"fmt"
	"testing"
)

type testErr struct{ s string }

func (e *testErr) Error() string { return e.s }

func TestFormat(t *testing.T) {
	for _, tc := range []struct {
		file string
		line int
		key  string
		want string
	}{
		{"c.yaml", 3, "a.b", "c.yaml:3: a.b: bad"},
		{"c.yaml", 0, "a.b", "c.yaml: a.b: bad"},
		{"", 3, "a.b", "line 3: a.b: bad"},
		{"", 0, "", "bad"},
		{"c.yaml", -1, "", "c.yaml: bad"},
	} {
		if got := Format(tc.file, tc.line, tc.key, "bad"); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc, got, tc.want)
		}
	}
}

func TestAll(t *testing.T) {
	a, b, c := &testErr{"a"}, &testErr{"b"}, &testErr{"c"}
	err := errors.Join(a, fmt.Errorf("wrapped: %w", errors.Join(b, errors.New("other"))), c)
	got := All[*testErr](err)
	if len(got) != 3 || got[0] != a || got[1] != b || got[2] != c {
		t.Fatalf("%v", got)
	}
	if All[*testErr](nil) != nil || All[*testErr](errors.New("x")) != nil {
		t.Fatal("none")
	}
}

func TestLine(t *testing.T) {
	lines := map[string]int{"devices": 10, "devices[1]": 12, "devices[1].serial": 14}
	for key, want := range map[string]int{"devices[1].serial.port": 14, "devices[1].id": 12, "devices[0]": 10, "gateway": 0, "": 0} {
		if got := Line(lines, key); got != want {
			t.Errorf("%q: %d, want %d", key, got, want)
		}
	}
}
