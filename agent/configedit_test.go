package agent

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var testAuth = AuthConfig{KeyFile: "/etc/edgefence/keys/gateway.key", KeyID: "gw-a/1", Certificate: "/etc/edgefence/keys/gateway.cert",
	TrustRoot: "/etc/edgefence/keys/root.pub", TrustRootKID: "operator"}

// WithAuth changes the auth: section's lines and nothing else, or refuses
// a file it cannot edit that way.
func TestWithAuth(t *testing.T) {
	block := string(AuthBlock(testAuth))
	for _, tc := range []struct {
		name, src, want string // want "" means refused
	}{
		{"replaced, comments and layout kept",
			"gateway: gw-a  # ours\n\n# Signing:\nauth:\n  key_file: \"\"   # e.g. x\n  # a comment inside\n  key_id: \"\"\n\n# Devices:\ndevices:\n  - id: d\n",
			"gateway: gw-a  # ours\n\n# Signing:\n" + block + "\n# Devices:\ndevices:\n  - id: d\n"},
		{"empty section", "auth:\ndevices: [{id: d}]\n", block + "devices: [{id: d}]\n"},
		{"flow section", "auth: {key_file: /k, key_id: k}\nlog: {level: info}\n", block + "log: {level: info}\n"},
		{"last, no final newline", "gateway: g\nauth:\n  key_id: x", "gateway: g\n" + block},
		{"appended", "gateway: g\n", "gateway: g\n\n" + block},
		{"appended after a missing newline", "gateway: g", "gateway: g\n\n" + block},
		{"empty file", "", "\n" + block},
		{"a flow mapping", "{gateway: g, auth: {}}\n", ""},
		{"an anchor in auth", "auth: &a\n  key_id: x\nother: *a\n", ""},
		{"a multi-line value", "auth:\n  key_file: |\n    /k\n", ""},
		{"a continued plain value", "auth:\n  key_file: /a\n    /b\ngateway: g\n", ""},
		{"two documents", "gateway: g\n---\ngateway: h\n", ""},
		{"auth twice", "auth: {}\nauth: {}\n", ""},
		{"not YAML", "gateway: [\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := WithAuth([]byte(tc.src), testAuth)
			switch {
			case tc.want == "" && !errors.Is(err, ErrConfigEdit):
				t.Fatalf("want ErrConfigEdit, got %v\n%s", err, got)
			case tc.want != "" && (err != nil || string(got) != tc.want):
				t.Fatalf("got %v\n%s\nwant\n%s", err, got, tc.want)
			}
		})
	}
}

// The shipped example config: refused as shipped (secure by default: no
// key yet), naming the command that fixes it; with the block keys init
// writes (EditConfigAuth, in place) it is valid, and no line outside its
// auth: section changed.
func TestEditExampleConfigAuth(t *testing.T) {
	src, err := os.ReadFile("../configs/edgefence.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(path, src, 0o640); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"profiles/energy-meter.yaml", "profiles/hvac-controller.yaml"} {
		b, err := os.ReadFile("../configs/" + p)
		if err != nil {
			t.Fatal(err)
		}
		writeFiles(t, dir, map[string]string{p: string(b)})
	}
	_, err = LoadConfig(path)
	if ces := ConfigErrors(err); len(ces) != 1 || ces[0].Key != "auth.key_file" || !strings.Contains(ces[0].Msg, "run `edgefence keys init --config "+path+"`") {
		t.Fatalf("the example as shipped: %v; want one problem, auth.key_file, naming keys init", err)
	}
	if err := EditConfigAuth(path, testAuth); err != nil {
		t.Fatal(err)
	}
	c, err := LoadConfig(path)
	if err != nil {
		t.Fatalf("the example with keys init's auth: block: %v", err)
	}
	if c.Auth != testAuth || c.Devices[0].Auth != AuthRequired || c.Devices[1].Auth != AuthOff {
		t.Fatalf("auth %+v, devices %+v", c.Auth, c.Devices[:2])
	}
	if c.Gateway != "gw-01" || len(c.Devices) != 6 || c.Devices[1].Fence != FenceDevice || len(c.Bridged()) != 3 {
		t.Fatalf("%+v", c)
	}
	profiles, err := c.ModbusProfiles()
	if err != nil || len(profiles) != 2 || profiles[c.Devices[5].Modbus.Profile] == nil {
		t.Fatalf("profiles %v %v", profiles, err)
	}
	out, _ := os.ReadFile(path)
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o640 {
		t.Errorf("mode %v, want the file's 0640", fi.Mode())
	}
	// Only the section's lines changed.
	start, end, err := authLines(src)
	if err != nil || start == 0 {
		t.Fatal(start, err)
	}
	lines := bytes.SplitAfter(src, []byte("\n"))
	want := append(append(bytes.Join(lines[:start-1], nil), AuthBlock(testAuth)...), bytes.Join(lines[end:], nil)...)
	if !bytes.Equal(out, want) {
		t.Fatalf("edited file:\n%s", out)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 2 {
		t.Errorf("%d entries in the directory, want the config and profiles/ (no temporary file left)", len(ents))
	}
}
