package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// A config with several problems: every one is reported, in file order,
// as file:line: key: message.
func TestLoadConfigReportsEveryErrorWithLineAndKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	src := `gateway: gw-a
etcd:
  endpoints: [http://127.0.0.1:2379]
  lease_ttl: 1s
mqtt:
  brokerz: [mqtt://127.0.0.1:1883]
log:
  level: loud
devices:
  - id: dev-1
  - id: dev-2
  - id: dev-3
  - id: dev-4
    fence: magic
`
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := LoadConfig(path)
	if !errors.Is(err, ErrConfig) {
		t.Fatalf("err %v does not wrap ErrConfig", err)
	}
	want := []string{
		// Not in the file: no line. Named with the fix for this file.
		path + ": auth.key_file: not set, but dev-1, dev-2, dev-3 and 1 more must be signed (every device is, unless it says auth: off): " +
			"run `edgefence keys init --config " + path + "` to make this gateway's keys and auth: block, or say auth: off on each device to leave unsigned",
		path + ":4: etcd.lease_ttl: 1s is below the minimum 2s",
		path + ":5: mqtt.brokers: at least one broker URL required",
		path + ":6: mqtt.brokerz: unknown key (did you mean brokers?)",
		path + ":8: log.level: \"loud\": want debug, info, warn or error",
		path + ":14: devices[3].fence: \"magic\": want \"device\" or \"gateway\"",
	}
	got := strings.Split(err.Error(), "\n")
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got\n%s\nwant\n%s", err, strings.Join(want, "\n"))
	}
	if n := len(ConfigErrors(err)); n != len(want) {
		t.Fatalf("ConfigErrors: %d, want %d", n, len(want))
	}
}

// Type errors do not stop the check: the validation problems of the rest
// of the file come in the same pass (a second run found 8 more), and a key
// whose value did not decode gets one error, not a second one about the
// zero value left behind.
func TestTypeAndValidationErrorsInOnePass(t *testing.T) {
	src := `gateway: gw-a
etcd:
  endpoints: [http://127.0.0.1:2379]
  lease_ttl: soon
  dial_timeout: -1s
mqtt:
  brokers: 5
  keep_alive: 500ms
command:
  timeout: -5s
outbox:
  max_total: lots
  ttl: -1h
log:
  level: loud
devices:
  - id: dev-1
  - id: dev-1
  - id: dev-3
    policy: [x]
  - id: dev-4
    fence: magic
  - 7
`
	_, err := ParseConfig([]byte(src))
	want := []string{
		"auth.key_file: not set, but dev-1, dev-1, dev-3 and 1 more must be signed", // no auth: section, no line
		"line 4: etcd.lease_ttl: cannot unmarshal",
		"line 5: etcd.dial_timeout: must be positive",
		"line 7: mqtt.brokers: cannot unmarshal",
		"line 8: mqtt.keep_alive: 500ms: must be at least 1s",
		"line 10: command.timeout: must be positive",
		"line 12: outbox.max_total: cannot unmarshal",
		"line 13: outbox.ttl: must not be negative",
		"line 15: log.level: \"loud\": want debug, info, warn or error",
		"line 18: devices[1].id: \"dev-1\" listed twice",
		"line 20: devices[2].policy: cannot unmarshal",
		"line 22: devices[3].fence: \"magic\": want \"device\" or \"gateway\"",
		"line 23: devices[4]: cannot unmarshal",
	}
	got := ConfigErrors(err)
	if len(got) != len(want) {
		t.Errorf("%d problems, want %d:\n%v", len(got), len(want), err)
	}
	for i, w := range want {
		if i >= len(got) || !strings.HasPrefix(got[i].Error(), w) {
			t.Errorf("problem %d: want %q\ngot:\n%v", i, w, err)
			break
		}
	}
}

// A type error met through an alias is reported at the anchor's line: the
// key that holds the alias is not validated again either.
func TestTypeErrorThroughAnAlias(t *testing.T) {
	_, err := ParseConfig([]byte("x: &e [[a]]\n" + strings.Replace(goodConfig, "endpoints: [http://127.0.0.1:2379]", "endpoints: *e", 1)))
	if strings.Contains(err.Error(), "etcd.endpoints") || len(ConfigErrors(err)) != 2 {
		t.Fatalf("want the unknown key x and one type error, nothing about etcd.endpoints:\n%v", err)
	}
}

// An alias bomb is refused (yaml.v3's "excessive aliasing") with the key
// and line where the aliases are, not a bare "document contains excessive
// aliasing".
func TestAliasBombNamesTheKey(t *testing.T) {
	head := "gateway: gw-a\netcd: {endpoints: [http://127.0.0.1:2379]}\nmqtt: {brokers: [mqtt://127.0.0.1:1883]}\n"
	dev := "x: &a {id: d, reissue_kinds: [" + strings.Repeat("k,", 199) + "k]}\n"
	many := "[" + strings.Repeat("*a,", 1999) + "*a]"
	for _, tc := range []struct{ name, yaml, want string }{
		{"spread over a list", head + dev + "devices: " + many + "\n",
			"line 5: devices: its aliases expand to 410001 nodes: excessive aliasing"},
		{"one alias", head + dev + "y: &d " + many + "\nmqtt2: 1\ndevices: *d\n",
			"line 7: devices: alias *d expands to 410001 nodes: excessive aliasing"},
		{"under a device", head + dev + "y: &d " + many + "\ndevices:\n  - id: a\n  - id: b\n    reissue_kinds: *d\n",
			"line 9: devices[1].reissue_kinds: alias *d expands to"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tc.yaml))
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got\n%v\nwant a line %q", err, tc.want)
			}
		})
	}
}

func TestParseConfigSyntaxAndTypeErrorsHaveLines(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"gateway: gw-a\netcd:\n  endpoints: [http://x:1\n", "line 2: yaml syntax:"},
		{"gateway: gw-a\netcd:\n  endpoints: [http://127.0.0.1:2379]\n  lease_ttl: soon\n", "line 4: etcd.lease_ttl: cannot unmarshal"},
		{"- a\n- b\n", "line 1: not a config"},
		{"gateway: gw-a\ndevices:\n  - id: a\n  - id: b\n    policy: [x]\n", "line 5: devices[1].policy: cannot unmarshal"},
	} {
		_, err := ParseConfig([]byte(tc.yaml))
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.yaml, err, tc.want)
		}
	}
	// Bad input never panics, whatever its shape.
	for _, s := range []string{"", "~", "gateway: {a: b}", "devices: 3", "devices: [3]", "etcd: [1]", "mqtt: {tls: 5}", "mqtt: {password: {a: 1}}", "&a [*a]", "a: &x 1\nb: *x"} {
		if _, err := ParseConfig([]byte(s)); err == nil {
			t.Errorf("%q accepted", s)
		}
	}
}

func TestLoadConfigFlagOverridesNameTheFlag(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte(goodConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := LoadConfig(path, Override{Flag: "--etcd", Key: "etcd.endpoints", Apply: func(c *Config) { c.Etcd.Endpoints = []string{"127.0.0.1:2379"} }})
	if err == nil || !strings.HasPrefix(err.Error(), "--etcd: ") || strings.Contains(err.Error(), path) {
		t.Fatalf("err %v, want it to name --etcd and not the file", err)
	}
	c, err := LoadConfig(path, Override{Flag: "--etcd", Key: "etcd.endpoints", Apply: func(c *Config) { c.Etcd.Endpoints = []string{"http://e:2379"} }})
	if err != nil || c.Etcd.Endpoints[0] != "http://e:2379" {
		t.Fatalf("%v %+v", err, c)
	}
}

func TestSecretsFromEnvironmentAreRedacted(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "c.yaml")
	src := strings.Replace(goodConfig, "mqtt:\n", "mqtt:\n  username: gw\n  password: in-file\n", 1)
	src = strings.Replace(src, "etcd:\n", "etcd:\n  username: root\n", 1)
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	creds := filepath.Join(dir, "creds")
	if err := os.Mkdir(creds, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(creds, "etcd_password"), []byte("etcd-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	// The file's password, redacted.
	c, err := LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	if c.MQTT.Password.Value() != "in-file" || c.MQTT.Password.String() != "<redacted>" {
		t.Fatalf("mqtt password %q / %s", c.MQTT.Password.Value(), c.MQTT.Password)
	}

	// The environment wins; systemd's credentials directory is used.
	t.Setenv(EnvMQTTPassword, "from-env")
	t.Setenv("CREDENTIALS_DIRECTORY", creds)
	c, err = LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	if c.MQTT.Password.Value() != "from-env" || c.Etcd.Password.Value() != "etcd-secret" {
		t.Fatalf("passwords %q %q", c.MQTT.Password.Value(), c.Etcd.Password.Value())
	}
	y, _ := yaml.Marshal(c)
	var j strings.Builder
	enc := json.NewEncoder(&j)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(c)
	for _, out := range []string{string(y), j.String(), fmt.Sprint(c.MQTT.Password, c.Etcd.Password)} {
		if strings.Contains(out, "from-env") || strings.Contains(out, "etcd-secret") || strings.Contains(out, "in-file") {
			t.Fatalf("a secret is printed:\n%s", out)
		}
		if !strings.Contains(out, "<from env EDGEFENCE_MQTT_PASSWORD>") || !strings.Contains(out, "<from file "+filepath.Join(creds, "etcd_password")+">") {
			t.Fatalf("output does not say where secrets come from:\n%s", out)
		}
	}

	// auth.key_file may be a systemd credential too.
	kc := filepath.Join(dir, "key-cred.yaml")
	if err := os.WriteFile(kc, append([]byte(src), []byte("auth:\n  key_file: ${CREDENTIALS_DIRECTORY}/gw.key\n  key_id: gw/1\n")...), 0o600); err != nil {
		t.Fatal(err)
	}
	if c, err = LoadConfig(kc); err != nil || c.Auth.KeyFile != filepath.Join(creds, "gw.key") {
		t.Fatalf("key_file from the credentials directory: %v %+v", err, c)
	}
	t.Setenv("CREDENTIALS_DIRECTORY", "")
	if _, err = LoadConfig(kc); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "auth.key_file") {
		t.Fatalf("key_file from an unset credentials directory: %v", err)
	}
	t.Setenv("CREDENTIALS_DIRECTORY", creds)

	// _FILE, with ${CREDENTIALS_DIRECTORY}; a missing file names the variable.
	t.Setenv(EnvMQTTPassword, "")
	t.Setenv(EnvMQTTPassword+"_FILE", "${CREDENTIALS_DIRECTORY}/etcd_password")
	if c, err = LoadConfig(path); err != nil || c.MQTT.Password.Value() != "etcd-secret" {
		t.Fatalf("%v %+v", err, c)
	}
	t.Setenv(EnvMQTTPassword+"_FILE", filepath.Join(dir, "missing"))
	if _, err = LoadConfig(path); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "EDGEFENCE_MQTT_PASSWORD_FILE") {
		t.Fatalf("err %v", err)
	}

	// A placeholder copied back from `config check` is refused.
	_, err = ParseConfig([]byte(strings.Replace(src, "in-file", "<redacted>", 1)))
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "mqtt.password") {
		t.Fatalf("err %v", err)
	}
	// Credentials in a URL are refused, and not echoed.
	_, err = ParseConfig([]byte(strings.Replace(goodConfig, "mqtt://127.0.0.1:1883", "mqtt://gw:hunter2@127.0.0.1:1883", 1)))
	if !strings.Contains(err.Error(), "mqtt.brokers[0]: \"mqtt://gw:xxxxx@127.0.0.1:1883\": no credentials in URLs") || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("err %v", err)
	}
	_, err = ParseConfig([]byte(strings.Replace(goodConfig, "http://127.0.0.1:2379", "http://root:hunter2@127.0.0.1:x", 1)))
	if !strings.Contains(err.Error(), "etcd.endpoints[0]: not a URL") || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("err %v", err)
	}
	// A password needs a user; cert and key go together.
	_, err = ParseConfig([]byte(strings.Replace(goodConfig, "mqtt:\n", "mqtt:\n  password: x\n  tls: {cert_file: /a.pem}\n", 1)))
	if !strings.Contains(err.Error(), "line 5: mqtt.username: required") || !strings.Contains(err.Error(), "line 7: mqtt.tls.cert_file") {
		t.Fatalf("err %v", err)
	}
}

// Under systemd the unit hands the agent the auth files as credentials
// named after their keys (its DynamicUser cannot read the 0700 keys
// directory): each replaces the file the config names; a blank one (the
// unit's fallback for a missing file) or one for a key the config leaves
// empty changes nothing.
func TestAuthFilesFromCredentials(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "c.yaml")
	if err := os.WriteFile(path, append([]byte(goodConfig), AuthBlock(testAuth)...), 0o644); err != nil {
		t.Fatal(err)
	}
	creds := filepath.Join(dir, "creds")
	writeFiles(t, creds, map[string]string{"auth.key_file": "KEY", "auth.certificate": "\n", "auth.trust_root": "PUB", "auth.revocations": "LIST"})
	t.Setenv("CREDENTIALS_DIRECTORY", creds)
	c, err := LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	want := testAuth
	want.KeyFile, want.TrustRoot = filepath.Join(creds, "auth.key_file"), filepath.Join(creds, "auth.trust_root")
	if c.Auth != want {
		t.Fatalf("auth %+v\nwant %+v", c.Auth, want)
	}
	t.Setenv("CREDENTIALS_DIRECTORY", "")
	if c, err = LoadConfig(path); err != nil || c.Auth != testAuth {
		t.Fatalf("outside systemd: %v %+v", err, c.Auth)
	}
}

// Every key of Config is documented in the example config (set there,
// with its comment), and the example parses and validates.
func TestExampleConfigDocumentsEveryKey(t *testing.T) {
	b, err := os.ReadFile("../configs/edgefence.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	keyed, err := WithAuth(b, testAuth) // as keys init leaves it: TestEditExampleConfigAuth
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParseConfig(keyed); err != nil {
		t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	var walk func(n *yaml.Node, prefix string)
	walk = func(n *yaml.Node, prefix string) {
		switch n.Kind {
		case yaml.DocumentNode:
			for _, c := range n.Content {
				walk(c, prefix)
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				k := n.Content[i].Value
				if prefix != "" {
					k = prefix + "." + k
				}
				have[k] = true
				if k != "devices[].labels" { // its keys are the operator's own
					walk(n.Content[i+1], k)
				}
			}
		case yaml.SequenceNode:
			for _, c := range n.Content {
				walk(c, prefix+"[]")
			}
		}
	}
	walk(&doc, "")
	keys := ConfigKeys()
	if len(keys) < 40 || !slices.Contains(keys, "devices[].serial.read_timeout") || !slices.Contains(keys, "mqtt.tls.key_file") {
		t.Fatalf("ConfigKeys: %v", keys)
	}
	for _, k := range keys {
		if !have[k] {
			t.Errorf("configs/edgefence.example.yaml does not document %s", k)
		}
	}
	for k := range have {
		if !slices.Contains(keys, k) {
			t.Errorf("configs/edgefence.example.yaml has %s, which is not a key of Config", k)
		}
	}
}

// FuzzParseConfig: any input is a config or ConfigErrors, never a panic;
// every error wraps ErrConfig and a valid config validates again.
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(goodConfig))
	f.Add([]byte(override(goodConfig, "devices:\n  - id: d\n    fence: gateway\n    home: gw-a\n    serial: {port: /dev/ttyS0, parity: X}")))
	f.Add([]byte("mqtt: {brokerz: 1, tls: {ca_file: x}, password: '<redacted>'}\n"))
	f.Add([]byte("a: &x [*x]\n"))
	f.Add([]byte("x: &a {id: d, reissue_kinds: [k, k, k]}\ny: &d [*a, *a, *a]\ndevices: *d\n"))
	if b, err := os.ReadFile("../configs/edgefence.example.yaml"); err == nil {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseConfig(b)
		if err != nil {
			if !errors.Is(err, ErrConfig) || len(ConfigErrors(err)) == 0 {
				t.Fatalf("error %v: not ConfigErrors", err)
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("valid config does not validate again: %v", err)
		}
	})
}

// A key given twice makes yaml.v3 skip its whole mapping: that one error,
// not "required" for every key of the skipped mapping.
func TestDuplicateKeyIsOneProblem(t *testing.T) {
	_, err := ParseConfig([]byte(goodConfig + "mqtt:\n  brokers: [mqtt://127.0.0.1:1884]\n"))
	if ces := ConfigErrors(err); len(ces) != 1 || !strings.Contains(err.Error(), `mapping key "mqtt" already defined`) {
		t.Fatalf("want one problem, the duplicate key:\n%v", err)
	}
}
