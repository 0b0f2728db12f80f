package main

import (
	"encoding/json"
	"runtime"
	"strings"
	"testing"
)

func TestVersion(t *testing.T) {
	r := edgefence(t, "version")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "edgefence ") || !strings.Contains(r.stdout, "(commit ") ||
		!strings.Contains(r.stdout, runtime.Version()) {
		t.Fatalf("version output:\n%s", r)
	}
}

func TestVersionJSON(t *testing.T) {
	r := edgefence(t, "version", "--json")
	var v map[string]string
	if err := json.Unmarshal([]byte(r.stdout), &v); r.code != 0 || err != nil {
		t.Fatalf("version --json: %v\n%s", err, r)
	}
	if v["version"] == "" || v["commit"] == "" || v["go"] != runtime.Version() || v["os"] != runtime.GOOS || v["arch"] != runtime.GOARCH {
		t.Fatalf("version --json: %v", v)
	}
}

// Every command has help, as `help CMD` (stdout) and `CMD -h`, exit 0; the
// usage lists the tree and the exit codes.
func TestHelp(t *testing.T) {
	r := edgefence(t, "help")
	for _, s := range []string{"run ", "status ", "devices ", "send ", "fence ", "outbox ", "twin ", "config check", "version ", "exit status:", "6  the agent is not running"} {
		if r.code != 0 || !strings.Contains(r.stdout, s) {
			t.Errorf("usage lacks %q\n%s", s, r)
		}
	}
	if r := edgefence(t); r.code != 2 || !strings.Contains(r.stderr, "usage:") {
		t.Errorf("no command: want exit 2 and usage\n%s", r)
	}
	if r := edgefence(t, "frobnicate"); r.code != 2 || !strings.Contains(r.stderr, "unknown command") {
		t.Errorf("unknown command: want exit 2\n%s", r)
	}
	for _, cmd := range [][]string{{"run"}, {"status"}, {"devices"}, {"send"}, {"fence"}, {"fence", "list"}, {"outbox"}, {"outbox", "show"},
		{"twin"}, {"twin", "set"}, {"config"}, {"config", "check"}, {"version"}} {
		r := edgefence(t, append([]string{"help"}, cmd...)...)
		if r.code != 0 || !strings.Contains(r.stdout, "usage: edgefence "+cmd[0]) {
			t.Errorf("help %v: want exit 0 and usage on stdout\n%s", cmd, r)
		}
		r = edgefence(t, append(cmd, "-h")...)
		if r.code != 0 || !strings.Contains(r.stdout+r.stderr, "usage: edgefence "+cmd[0]) {
			t.Errorf("%v -h: want exit 0 and usage\n%s", cmd, r)
		}
	}
}
