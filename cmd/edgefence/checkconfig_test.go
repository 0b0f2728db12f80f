package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/edgefence/edgefence/agent"
)

const goodConfig = `gateway: gw-1
etcd:
  endpoints: [http://127.0.0.1:2379]
mqtt:
  brokers: [mqtt://127.0.0.1:1883]
api:
  socket: /tmp/edgefence-test.sock
devices:
  - {id: dev-1, auth: off}
  - id: dev-2
    auth: off
`

func TestCheckConfig(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		yaml string // goodConfig with edits
		code int
		want []string // in stderr; $CFG is the file
	}{
		{"good: unsigned devices that say so", goodConfig, 0, nil},
		// Secure by default: a device that does not say auth: off is
		// signed, and needs a key; the problem names the fix for this file.
		{"a signed device without a key", strings.Replace(goodConfig, "{id: dev-1, auth: off}", "{id: dev-1}", 1), 1,
			[]string{"$CFG: auth.key_file: not set, but dev-1 must be signed (every device is, unless it says auth: off): " +
				"run `edgefence keys init --config $CFG` to make this gateway's keys and auth: block, or say auth: off on each device to leave unsigned\n" +
				"edgefence: invalid config: 1 problem\n"}},
		{"auth: required without a key", strings.Replace(goodConfig, "{id: dev-1, auth: off}", "{id: dev-1, auth: required}", 1), 1,
			[]string{"auth.key_file: not set, but dev-1 must be signed"}},
		{"unknown top-level key", goodConfig + "bogus_key: 1\n", 1, []string{":12: bogus_key: unknown key"}},
		{"unknown nested key", strings.Replace(goodConfig, "etcd:\n", "etcd:\n  lease_tll: 10s\n", 1), 1, []string{":3: etcd.lease_tll: unknown key (did you mean lease_ttl?)"}},
		{"lease_ttl below minimum", strings.Replace(goodConfig, "etcd:\n", "etcd:\n  lease_ttl: 1s\n", 1), 1, []string{":3: etcd.lease_ttl: 1s is below the minimum 2s"}},
		{"lease_ttl not whole seconds", strings.Replace(goodConfig, "etcd:\n", "etcd:\n  lease_ttl: 2500ms\n", 1), 1, []string{"etcd.lease_ttl", "whole seconds"}},
		{"bad device id", strings.Replace(goodConfig, "id: dev-2", "id: dev/2", 1), 1, []string{"devices[1].id", "dev/2"}},
		{"device listed twice", strings.Replace(goodConfig, "id: dev-2", "id: dev-1", 1), 1, []string{"devices[1].id", "twice"}},
		{"no gateway", strings.Replace(goodConfig, "gateway: gw-1\n", "", 1), 1, []string{"gateway", "required"}},
		{"bad etcd url", strings.Replace(goodConfig, "http://127.0.0.1:2379", "127.0.0.1:2379", 1), 1, []string{"etcd.endpoints[0]"}},
		{"gateway fence without home", strings.Replace(goodConfig, "id: dev-2", "id: dev-2\n    fence: gateway", 1), 1, []string{"devices[1].home", "home gateway"}},
		{"bad serial parity", strings.Replace(goodConfig, "id: dev-2", "id: dev-2\n    fence: gateway\n    home: gw-1\n    serial: {port: /dev/ttyUSB9, parity: X}", 1), 1, []string{":13: devices[1].serial.parity: Parity \"X\""}},
		{"mqtt password from a missing file", strings.Replace(goodConfig, "mqtt:\n", "mqtt:\n  username: gw\n  tls: {ca_file: /nonexistent/ca.pem}\n", 1), 1, []string{":6: mqtt.tls.ca_file: open /nonexistent/ca.pem"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".yaml")
			if err := os.WriteFile(path, []byte(tc.yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			r := edgefence(t, "config", "check", path)
			if r.code != tc.code {
				t.Fatalf("exit %d, want %d\n%s", r.code, tc.code, r)
			}
			for _, w := range tc.want {
				if w = strings.ReplaceAll(w, "$CFG", path); !strings.Contains(r.stderr, w) {
					t.Errorf("stderr lacks %q\n%s", w, r)
				}
			}
			if tc.code != 0 {
				if !strings.Contains(r.stderr, path) {
					t.Errorf("stderr does not name the file\n%s", r)
				}
				if r.stdout != "" {
					t.Errorf("stdout not empty on error\n%s", r)
				}
			}
		})
	}
}

// config check loads the device profiles the config names (from the config
// file's directory) and names a profile's problem by its own file, line and
// key.
func TestCheckConfigModbusProfile(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "edgefence.yaml")
	prof := filepath.Join(dir, "profiles", "meter.yaml")
	y := goodConfig + `modbus:
  profiles: [profiles/meter.yaml]
  buses: [{name: rs485, tcp: "127.0.0.1:5020"}]
`
	y = strings.Replace(y, "  - id: dev-2\n", "  - id: dev-2\n    fence: gateway\n    home: gw-1\n    modbus: {bus: rs485, unit: 3, profile: em1}\n", 1)
	if err := os.MkdirAll(filepath.Dir(prof), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string]string{cfg: y, prof: "model: em1\nfields:\n  - {name: volts, table: input, address: 0, type: float32, scale: 0}\n"} {
		if err := os.WriteFile(name, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	r := edgefence(t, "config", "check", cfg)
	if want := prof + ":3: fields[0].scale: 0: want a finite number other than 0\nedgefence: invalid config: 1 problem\n"; r.code != 1 || r.stderr != want {
		t.Fatalf("want exit 1 and\n%s\n%s", want, r)
	}
	if err := os.WriteFile(prof, []byte("model: em1\nfields:\n  - {name: volts, table: input, address: 0, type: float32}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := edgefence(t, "config", "check", cfg); r.code != 0 || !strings.Contains(r.stdout, "- "+prof) {
		t.Fatalf("want exit 0 and the profile's path\n%s", r)
	}
}

// The example config (the package's default) is refused as shipped, naming
// the command that fixes it; once `keys init` has written its auth: block
// it is valid, and check-config prints it with the defaults filled in as a
// config file that reads back the same.
func TestCheckConfigExample(t *testing.T) {
	example := exampleCopy(t)
	r := edgefence(t, "config", "check", example)
	if r.code != 1 || !strings.HasPrefix(r.stderr, example+":") || !strings.Contains(r.stderr, "run `edgefence keys init --config "+example+"`") ||
		!strings.HasSuffix(r.stderr, "invalid config: 1 problem\n") {
		t.Fatalf("example config as shipped: want exit 1 and the one problem, naming keys init\n%s", r)
	}
	if r = edgefence(t, "keys", "init", "--config", example, "--dir", filepath.Join(t.TempDir(), "keys")); r.code != 0 {
		t.Fatalf("keys init: %s", r)
	}
	r = edgefence(t, "config", "check", example)
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("example config after keys init rejected\n%s", r)
	}
	want, err := agent.LoadConfig(example)
	if err != nil {
		t.Fatal(err)
	}
	got, err := agent.ParseConfig([]byte(r.stdout))
	if err != nil {
		t.Fatalf("check-config output is not a valid config: %v\n%s", err, r)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("check-config output reads back as\n%+v\nwant\n%+v", got, want)
	}
	for _, s := range []string{"lease_ttl: 10s", "thermostat-1", "client_id: edgefence-gw-01"} {
		if !strings.Contains(r.stdout, s) {
			t.Errorf("output lacks %q:\n%s", s, r.stdout)
		}
	}
}

func TestCheckConfigUsage(t *testing.T) {
	good := filepath.Join(t.TempDir(), "good.yaml")
	if err := os.WriteFile(good, []byte(goodConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		code int
		want string // in stdout or stderr
	}{
		{[]string{"config", "check"}, 2, "usage"},
		{[]string{"config", "check", "a.yaml", "b.yaml"}, 2, "usage"},
		{[]string{"config", "check", "--bogus", "a.yaml"}, 2, "usage"},
		{[]string{"config", "check", "-h"}, 0, "usage"},
		{[]string{"config"}, 2, "usage"},
		{[]string{"config", "lint"}, 2, "unknown command"},
		{[]string{"config", "check", filepath.Join(t.TempDir(), "missing.yaml")}, 1, "missing.yaml: no such file or directory"},
		{[]string{"check-config"}, 2, "usage"}, // the old name, a hidden alias
		{[]string{"check-config", good}, 0, "gateway: gw-1"},
	} {
		r := edgefence(t, tc.args...)
		if r.code != tc.code || !strings.Contains(r.stdout+r.stderr, tc.want) {
			t.Errorf("want exit %d and %q\n%s", tc.code, tc.want, r)
		}
	}
}

// run validates the config like check-config, before it connects to
// anything.
func TestRunBadConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(path, []byte(strings.Replace(goodConfig, "etcd:\n", "etcd:\n  lease_ttl: 1s\n", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"run", "--config", path},
		{"run", "--config", filepath.Join(t.TempDir(), "missing.yaml")},
		{"run", "--config", filepath.Join("..", "..", "configs", "edgefence.example.yaml"), "--etcd", "127.0.0.1:2379"},
	} {
		r := edgefence(t, args...)
		if r.code != 1 || !strings.Contains(r.stderr, "invalid config") {
			t.Errorf("want exit 1 and invalid config\n%s", r)
		}
	}
	// A flag's problem names the flag, not a line of the file.
	example := exampleCopy(t)
	r := edgefence(t, "run", "--config", example, "--mqtt", "mqtt://ok:1883,ftp://x")
	if r.code != 1 || !strings.HasPrefix(r.stderr, "--mqtt: \"ftp://x\": scheme must be one of") {
		t.Errorf("want exit 1 and the --mqtt flag named\n%s", r)
	}
	// Secure by default: the package's config, its devices signed and no
	// key yet, does not start; the error names the command that fixes it.
	r = edgefence(t, "run", "--config", example)
	if r.code != 1 || !strings.Contains(r.stderr, example+":") || !strings.Contains(r.stderr, "auth.key_file: not set") ||
		!strings.Contains(r.stderr, "run `edgefence keys init --config "+example+"`") {
		t.Errorf("run without a key: want exit 1 naming keys init\n%s", r)
	}
}

// exampleCopy copies the example config and its profiles into a temporary
// directory and returns the config's path.
func exampleCopy(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{"edgefence.example.yaml", "profiles/energy-meter.yaml", "profiles/hvac-controller.yaml"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "configs", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, "edgefence.example.yaml")
}

// Every problem of a config is reported, one a line, FILE:LINE: KEY: MESSAGE;
// --json prints the effective config with the file's keys; secrets never.
func TestConfigCheck(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	src := `gateway: gw-1
etcd:
  endpoints: [http://127.0.0.1:2379]
  lease_ttl: 1s
mqtt:
  brokerz: [mqtt://127.0.0.1:1883]
devices:
  - id: dev-1
  - id: dev-2
  - id: dev-3
  - id: dev-4
    fence: gatway
`
	if err := os.WriteFile(bad, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	r := edgefence(t, "config", "check", bad)
	want := bad + `: auth.key_file: not set, but dev-1, dev-2, dev-3 and 1 more must be signed (every device is, unless it says auth: off): ` +
		"run `edgefence keys init --config " + bad + "` to make this gateway's keys and auth: block, or say auth: off on each device to leave unsigned\n" +
		bad + `:4: etcd.lease_ttl: 1s is below the minimum 2s
` + bad + `:5: mqtt.brokers: at least one broker URL required
` + bad + `:6: mqtt.brokerz: unknown key (did you mean brokers?)
` + bad + `:12: devices[3].fence: "gatway": want "device" or "gateway"
edgefence: invalid config: 5 problems
`
	if r.code != 1 || r.stderr != want || r.stdout != "" {
		t.Fatalf("want exit 1 and\n%s\n%s", want, r)
	}

	good := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(good, []byte(strings.Replace(goodConfig, "mqtt:\n", "mqtt:\n  username: gw-1\n  password: in-the-file\n", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	r = edgefence(t, "config", "check", "--json", good)
	var js map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &js); r.code != 0 || err != nil {
		t.Fatalf("config check --json: %v\n%s", err, r)
	}
	etcd, _ := js["etcd"].(map[string]any)
	mqtt, _ := js["mqtt"].(map[string]any)
	outbox, _ := js["outbox"].(map[string]any)
	if etcd["lease_ttl"] != "10s" || mqtt["client_id"] != "edgefence-gw-1" || mqtt["password"] != "<redacted>" ||
		outbox["ttl"] != "1h0m0s" || outbox["retention"] != "24h0m0s" || outbox["max_per_device"] != 10000.0 {
		t.Fatalf("config check --json:\n%s", r.stdout)
	}
	if strings.Contains(r.stdout, "in-the-file") {
		t.Fatalf("the password is printed:\n%s", r.stdout)
	}
}
