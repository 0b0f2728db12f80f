package sandbox

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// AgentConfig is an edgefence agent configuration for a sandbox world, as
// the YAML file `edgefence run --config` reads. Only the fields the sandbox
// needs are here; an empty field is left out of the file, so the agent's
// default applies. (This package does not import package agent, whose tests
// import it; the cmd tests parse the output with agent.LoadConfig.)
type AgentConfig struct {
	Gateway  string   // required
	Etcd     string   // etcd endpoint URL, required
	MQTT     string   // broker URL, required
	Devices  []string // at least one
	Socket   string   // API socket path, required: the default is a system path
	StateDir string   // required: the default is a system path

	EtcdPrefix string
	MQTTPrefix string
	ClientID   string
	// MQTTUser and MQTTPassword are mqtt.username and mqtt.password, for a
	// broker that requires credentials (empty: none). A config with a
	// password is written mode 0600.
	MQTTUser, MQTTPassword string
	LeaseTTL               time.Duration
	CommandTimeout         time.Duration
	// MQTTReconnectMax is mqtt.reconnect_backoff_max (0: the default).
	MQTTReconnectMax time.Duration
	// MQTTMaxPacketSize is mqtt.max_packet_size, bytes (0: the default).
	MQTTMaxPacketSize int
	LogLevel          string
	LogFormat         string
	// Auth, if set, is the gateway's signing key, certificate and trust
	// root (TrustKit.Gateway): its commands are signed, its devices `auth:
	// required` but those in AuthOff (`auth: off`). Without it every
	// device says `auth: off` (the agent refuses a device without a key
	// otherwise).
	Auth    *GatewayKey
	AuthOff []string
	// Twins turns the twin reconciler on (twins.enabled).
	Twins bool
	// JobsOff turns the firmware job runner off (jobs.enabled: false).
	JobsOff bool
	// Labels are devices' labels (a device's `labels:`, what `edgefence
	// send --selector` selects by), by device id.
	Labels map[string]map[string]string
}

// AgentConfig returns a config for an agent of this world named gateway,
// with its socket and state dir in dir: dir/<gateway>.sock and
// dir/<gateway>-state.
func (w *World) AgentConfig(gateway, dir string, devices []string) AgentConfig {
	return AgentConfig{
		Gateway:  gateway,
		Etcd:     w.Etcd.Endpoint(),
		MQTT:     w.Broker.URL(),
		Devices:  append([]string(nil), devices...),
		Socket:   filepath.Join(dir, gateway+".sock"),
		StateDir: filepath.Join(dir, gateway+"-state"),
	}
}

// YAML renders the config file. Strings are written as JSON strings, which
// YAML reads as double-quoted scalars, so any path or id survives.
func (c AgentConfig) YAML() ([]byte, error) {
	switch {
	case c.Gateway == "" || c.Etcd == "" || c.MQTT == "" || c.Socket == "" || c.StateDir == "":
		return nil, errors.New("sandbox: agent config: Gateway, Etcd, MQTT, Socket and StateDir are required")
	case len(c.Devices) == 0:
		return nil, errors.New("sandbox: agent config: no devices")
	}
	var b bytes.Buffer
	line := func(indent, key, val string) {
		if val != "" {
			fmt.Fprintf(&b, "%s%s: %s\n", indent, key, val)
		}
	}
	dur := func(d time.Duration) string {
		if d == 0 {
			return ""
		}
		return d.String()
	}
	fmt.Fprintf(&b, "# edgefence agent config for the sandbox; check with: edgefence config check FILE\n")
	line("", "gateway", yamlQuote(c.Gateway))
	line("", "state_dir", yamlQuote(c.StateDir))
	b.WriteString("etcd:\n")
	line("  ", "endpoints", "["+yamlQuote(c.Etcd)+"]")
	line("  ", "prefix", yamlQuote(c.EtcdPrefix))
	line("  ", "lease_ttl", dur(c.LeaseTTL))
	b.WriteString("mqtt:\n")
	line("  ", "brokers", "["+yamlQuote(c.MQTT)+"]")
	line("  ", "prefix", yamlQuote(c.MQTTPrefix))
	line("  ", "client_id", yamlQuote(c.ClientID))
	line("  ", "username", yamlQuote(c.MQTTUser))
	line("  ", "password", yamlQuote(c.MQTTPassword))
	line("  ", "reconnect_backoff_max", dur(c.MQTTReconnectMax))
	if c.MQTTMaxPacketSize != 0 {
		line("  ", "max_packet_size", strconv.Itoa(c.MQTTMaxPacketSize))
	}
	b.WriteString("api:\n")
	line("  ", "socket", yamlQuote(c.Socket))
	if c.CommandTimeout != 0 {
		b.WriteString("command:\n")
		line("  ", "timeout", dur(c.CommandTimeout))
	}
	if c.Twins {
		b.WriteString("twins:\n  enabled: true\n")
	}
	if c.JobsOff {
		b.WriteString("jobs:\n  enabled: false\n")
	}
	if c.LogLevel != "" || c.LogFormat != "" {
		b.WriteString("log:\n")
		line("  ", "level", yamlQuote(c.LogLevel))
		line("  ", "format", yamlQuote(c.LogFormat))
	}
	if a := c.Auth; a != nil {
		b.WriteString("auth:\n")
		line("  ", "key_file", yamlQuote(a.KeyFile))
		line("  ", "key_id", yamlQuote(a.KeyID))
		line("  ", "certificate", yamlQuote(a.Certificate))
		line("  ", "revocations", yamlQuote(a.Revocations))
		line("  ", "trust_root", yamlQuote(a.TrustRoot))
		line("  ", "trust_root_kid", yamlQuote(a.TrustRootKID))
	}
	b.WriteString("devices:\n")
	for _, d := range c.Devices {
		line("  - ", "id", yamlQuote(d))
		if c.Auth == nil || slices.Contains(c.AuthOff, d) {
			line("    ", "auth", "off")
		}
		if ls := c.Labels[d]; len(ls) > 0 {
			b.WriteString("    labels:\n")
			for _, k := range slices.Sorted(maps.Keys(ls)) {
				line("      ", yamlQuote(k), yamlQuote(ls[k]))
			}
		}
	}
	return b.Bytes(), nil
}

// Write writes the YAML to path (mode 0644, 0600 with a password).
func (c AgentConfig) Write(path string) error {
	b, err := c.YAML()
	if err != nil {
		return err
	}
	mode := os.FileMode(0o644)
	if c.MQTTPassword != "" {
		mode = 0o600
	}
	if err := os.WriteFile(path, b, mode); err != nil {
		return fmt.Errorf("sandbox: agent config: %w", err)
	}
	return nil
}

// yamlQuote quotes s as a YAML double-quoted scalar (a JSON string is one); ""
// stays "", so that its key is left out.
func yamlQuote(s string) string {
	if s == "" {
		return ""
	}
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	return strings.TrimSuffix(b.String(), "\n")
}
