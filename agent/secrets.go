package agent

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Secret is a credential in the configuration (a password). It is never
// printed: its String, YAML, JSON and slog forms are "<redacted>", or
// "<from env NAME>" / "<from file PATH>" when an environment override set
// it. Value returns the secret itself.
type Secret struct {
	value  string
	source string // "" (the config file), "env NAME" or "file PATH"
}

// NewSecret returns a Secret holding v.
func NewSecret(v string) Secret { return Secret{value: v} }

// Value returns the secret.
func (s Secret) Value() string { return s.value }

// Source says where the secret came from: "" for the config file, "env
// NAME" or "file PATH" for an environment override.
func (s Secret) Source() string { return s.source }

// String returns the redacted form.
func (s Secret) String() string {
	switch {
	case s.value == "" && s.source == "":
		return ""
	case s.source != "":
		return "<from " + s.source + ">"
	}
	return redacted
}

const redacted = "<redacted>"

// isPlaceholder reports whether v is a redacted form printed by String,
// copied back into a config file by mistake.
func isPlaceholder(v string) bool {
	return v == redacted || strings.HasPrefix(v, "<from ") && strings.HasSuffix(v, ">")
}

// MarshalYAML prints the redacted form.
func (s Secret) MarshalYAML() (any, error) { return s.String(), nil }

// UnmarshalYAML reads a secret from a YAML string.
func (s *Secret) UnmarshalYAML(n *yaml.Node) error {
	var v string
	if err := n.Decode(&v); err != nil {
		return err
	}
	*s = Secret{value: v}
	return nil
}

// MarshalJSON prints the redacted form.
func (s Secret) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // "<redacted>", not "\u003credacted\u003e"
	err := enc.Encode(s.String())
	return bytes.TrimSpace(b.Bytes()), err
}

// LogValue keeps secrets out of logs.
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.String()) }

// TLSConfig names the PEM files of a TLS client. All empty means the
// system's roots and no client certificate.
type TLSConfig struct {
	CAFile   string `yaml:"ca_file"`   // CA bundle to verify the server with; default the system roots
	CertFile string `yaml:"cert_file"` // client certificate (mutual TLS), with key_file
	KeyFile  string `yaml:"key_file"`  // its private key
}

// validate checks the pairing of the files (that they exist is checked
// when they are loaded, by Load).
func (t TLSConfig) validate(key string, bad func(key, format string, args ...any)) {
	if (t.CertFile == "") != (t.KeyFile == "") {
		bad(key+".cert_file", "cert_file and key_file go together")
	}
}

// Load reads the files into a *tls.Config; nil when none is set. Errors
// are ConfigErrors naming key's fields.
func (t TLSConfig) Load(key string) (*tls.Config, error) {
	if t == (TLSConfig{}) {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, &ConfigError{Key: key + ".ca_file", Msg: err.Error()}
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, &ConfigError{Key: key + ".ca_file", Msg: t.CAFile + ": no PEM certificate in it"}
		}
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, &ConfigError{Key: key + ".cert_file", Msg: err.Error()}
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// Environment overrides of the config file's secrets. NAME sets the
// secret; NAME_FILE names a file holding it (trailing newline stripped),
// and may use ${CREDENTIALS_DIRECTORY} (systemd LoadCredential=). Without
// either, a credential named mqtt_password or etcd_password in
// $CREDENTIALS_DIRECTORY is used if present.
const (
	EnvMQTTPassword = "EDGEFENCE_MQTT_PASSWORD"
	EnvEtcdPassword = "EDGEFENCE_ETCD_PASSWORD"
)

// expandKeyFile expands ${CREDENTIALS_DIRECTORY} in auth.key_file, so that
// the gateway's signing key can be a systemd credential
// (LoadCredential=gw.key:/etc/edgefence/gw.key, key_file:
// ${CREDENTIALS_DIRECTORY}/gw.key): it never sits in a file the service
// user can read outside the unit's run.
func (c *Config) expandKeyFile(credDir string) error {
	const ref = "${CREDENTIALS_DIRECTORY}"
	if !strings.Contains(c.Auth.KeyFile, ref) {
		return nil
	}
	if credDir == "" {
		return &ConfigError{Key: "auth.key_file", Msg: ref + " is not set: run under systemd with LoadCredential= (or give a path)"}
	}
	c.Auth.KeyFile = strings.ReplaceAll(c.Auth.KeyFile, ref, credDir)
	return nil
}

// authCredentials replaces each auth file the config names with the
// systemd credential named after its key, when the unit passes a
// non-empty one (LoadCredential=auth.key_file:/etc/edgefence/keys/gateway.key):
// the shipped unit's DynamicUser cannot read the 0700 keys directory
// `edgefence keys init` writes, so systemd hands it copies. The config
// still says whether there is a key and where it lives for the tools run
// as root; a blank credential (the unit's SetCredential= fallback for a
// missing file) is no credential.
func (c *Config) authCredentials(credDir string) {
	if credDir == "" {
		return
	}
	for _, f := range []struct {
		key  string
		path *string
	}{{"auth.key_file", &c.Auth.KeyFile}, {"auth.certificate", &c.Auth.Certificate},
		{"auth.trust_root", &c.Auth.TrustRoot}, {"auth.revocations", &c.Auth.Revocations}} {
		if *f.path == "" {
			continue
		}
		cred := filepath.Join(credDir, f.key)
		if b, err := os.ReadFile(cred); err == nil && len(bytes.TrimSpace(b)) > 0 {
			*f.path = cred
		}
	}
}

// secretEnv lists the overrides: the variable, the systemd credential
// name, and the secret it sets.
func (c *Config) secretEnv() []struct {
	env, cred string
	s         *Secret
} {
	return []struct {
		env, cred string
		s         *Secret
	}{
		{EnvMQTTPassword, "mqtt_password", &c.MQTT.Password},
		{EnvEtcdPassword, "etcd_password", &c.Etcd.Password},
	}
}

// applyEnv applies the environment overrides of secrets (lookup is
// os.LookupEnv in LoadConfig).
func (c *Config) applyEnv(lookup func(string) (string, bool)) []error {
	var errs []error
	credDir, _ := lookup("CREDENTIALS_DIRECTORY")
	if err := c.expandKeyFile(credDir); err != nil {
		errs = append(errs, err)
	}
	c.authCredentials(credDir)
	for _, o := range c.secretEnv() {
		if v, ok := lookup(o.env); ok && v != "" {
			*o.s = Secret{value: v, source: "env " + o.env}
			continue
		}
		path, ok := lookup(o.env + "_FILE")
		if ok && path != "" {
			path = os.Expand(path, func(k string) string {
				if k == "CREDENTIALS_DIRECTORY" {
					return credDir
				}
				v, _ := lookup(k)
				return v
			})
		} else if credDir != "" {
			path = filepath.Join(credDir, o.cred)
			if _, err := os.Stat(path); err != nil {
				continue
			}
		} else {
			continue
		}
		b, err := os.ReadFile(path)
		if err != nil {
			errs = append(errs, &ConfigError{Key: o.env + "_FILE", Msg: err.Error()})
			continue
		}
		v := strings.TrimRight(string(b), "\r\n")
		if v == "" {
			errs = append(errs, &ConfigError{Key: o.env + "_FILE", Msg: fmt.Sprintf("%s is empty", path)})
			continue
		}
		*o.s = Secret{value: v, source: "file " + path}
	}
	return errs
}
