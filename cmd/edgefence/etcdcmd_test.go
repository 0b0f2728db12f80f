package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgefence/edgefence/internal/sandbox"
)

// The highest token in use, from what an operator collects on the
// gateways: status (held, current, the device's mark in the last ack) and
// fence list outputs, several in one file.
func TestHighestIn(t *testing.T) {
	status := `{"gateway":"gw-2","devices":[
	  {"id":"dev-1","state":"lost","token":3,"max_token_held":3,"last_ack":{"verdict":"stale","token":3,"max_token":905}},
	  {"id":"dev-2","state":"holding","token":7,"max_token_held":880}]}`
	fenceList := `[{"device":"plc-1","mark":{"token":990,"seq":4}},{"device":"plc-2","mark":{"token":12,"seq":1}}]`
	for _, c := range []struct {
		name, data string
		want       highestToken
		seen       int
		err        string
	}{
		{"status", status, highestToken{905, "dev-1", "f", "last_ack.max_token"}, 5, ""},
		{"fence list", fenceList, highestToken{990, "plc-1", "f", "mark.token"}, 2, ""},
		{"both, concatenated", status + "\n" + fenceList + "\n", highestToken{990, "plc-1", "f", "mark.token"}, 7, ""},
		{"empty status", `{"devices":[]}`, highestToken{}, 0, ""},
		{"not json", "gateway gw-1", highestToken{}, 0, "invalid character"},
		{"a number", "42", highestToken{}, 0, "want the JSON of"},
		{"bad field", `{"devices":[{"token":"x"}]}`, highestToken{}, 0, "not a status"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var best highestToken
			n, err := highestIn([]byte(c.data), "f", &best)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want %q", err, c.err)
				}
				return
			}
			if err != nil || n != c.seen || best != c.want {
				t.Fatalf("got %+v, %d tokens, %v; want %+v, %d", best, n, err, c.want, c.seen)
			}
		})
	}
}

// bump-revision's usage errors, --from without a token, a target already
// reached, --dry-run and --estimate.
func TestBumpRevisionCLI(t *testing.T) {
	dir := t.TempDir()
	e, err := sandbox.StartEtcd(t.Context(), sandbox.EtcdConfig{Dir: filepath.Join(dir, "etcd"), Fast: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	url := e.Endpoint()
	for _, args := range [][]string{
		{"etcd"},
		{"etcd", "bump"},
		{"etcd", "bump-revision", "--etcd", url},
		{"etcd", "bump-revision", "--etcd", url, "--to", "0"},
		{"etcd", "bump-revision", "--etcd", url, "--to", "10", "--writers", "0"},
		{"etcd", "bump-revision", "--etcd", url, "--to", "10", "--dry-run", "--estimate", "1s"},
		{"etcd", "bump-revision", "--etcd", url, "--to", "10", "extra"},
	} {
		if r := edgefence(t, args...); r.code != 2 {
			t.Errorf("want exit 2\n%s", r)
		}
	}
	if r := edgefence(t, "help", "etcd", "bump-revision"); r.code != 0 || !strings.Contains(r.stdout, "any etcd version") {
		t.Errorf("help: want the usage on stdout\n%s", r)
	}
	empty := filepath.Join(dir, "empty.json")
	if err := os.WriteFile(empty, []byte(`{"gateway":"gw-1","devices":[]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := edgefence(t, "etcd", "bump-revision", "--etcd", url, "--from", empty); r.code != 1 || !strings.Contains(r.stderr, "no device with a token") {
		t.Errorf("--from without tokens: want exit 1 and why\n%s", r)
	}
	if r := edgefence(t, "etcd", "bump-revision", "--etcd", url, "--from", filepath.Join(dir, "missing.json")); r.code != 1 || !strings.Contains(r.stderr, "no such file") {
		t.Errorf("--from a missing file: want exit 1 and why\n%s", r)
	}
	if r := edgefence(t, "etcd", "bump-revision", "--etcd", url, "--to", "1"); r.code != 0 || !strings.Contains(r.stdout, "nothing to do") {
		t.Errorf("target already reached: want exit 0, nothing to do\n%s", r)
	}
	r := edgefence(t, "etcd", "bump-revision", "--etcd", url, "--to", "1000000", "--dry-run", "--json")
	var rep bumpReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); r.code != 0 || err != nil || !rep.DryRun || rep.Writes != 0 || rep.To != 1000000 || rep.Done {
		t.Fatalf("dry run: %+v, %v\n%s", rep, err, r)
	}
	r = edgefence(t, "etcd", "bump-revision", "--etcd", url, "--to", "1000000000", "--estimate", "200ms", "--writers", "4", "--json")
	if err := json.Unmarshal([]byte(r.stdout), &rep); r.code != 0 || err != nil || rep.Writes == 0 || rep.Rate <= 0 || rep.ETASeconds <= 0 || rep.Done {
		t.Fatalf("estimate: %+v, %v\n%s", rep, err, r)
	}
}
