package sandbox

import (
	"net"
	"strconv"
	"testing"
)

func itoa(n int) string { return strconv.Itoa(n) }

func TestFreePort(t *testing.T) {
	p, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", itoa(p)))
	if err != nil {
		t.Fatalf("port %d not free: %v", p, err)
	}
	l.Close()
}

func TestResolveAddr(t *testing.T) {
	for _, tc := range []struct {
		in       string
		wantHost string
		wantPort string // "" = any picked port
		err      bool
	}{
		{in: "", wantHost: "127.0.0.1"},
		{in: "127.0.0.1:0", wantHost: "127.0.0.1"},
		{in: ":0", wantHost: "127.0.0.1"},
		{in: ":2379", wantHost: "127.0.0.1", wantPort: "2379"},
		{in: "127.0.0.2:4000", wantHost: "127.0.0.2", wantPort: "4000"},
		{in: "nocolon", err: true},
		{in: "127.0.0.1:x", err: true},
		{in: "127.0.0.1:70000", err: true},
	} {
		got, picked, err := resolveAddr(tc.in)
		if tc.err {
			if err == nil {
				t.Errorf("resolveAddr(%q) = %q, want error", tc.in, got)
			}
			continue
		}
		if err != nil {
			t.Errorf("resolveAddr(%q): %v", tc.in, err)
			continue
		}
		h, p, _ := net.SplitHostPort(got)
		if h != tc.wantHost || (tc.wantPort != "" && p != tc.wantPort) || (tc.wantPort == "" && (p == "0" || !picked)) {
			t.Errorf("resolveAddr(%q) = %q picked=%v", tc.in, got, picked)
		}
	}
}
