package agent

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/edgefence/edgefence/fence"
)

// Defaults and limits of the configuration.
const (
	DefaultEtcdPrefix     = "/edgefence/v1"
	DefaultMQTTPrefix     = "edgefence/v1"
	DefaultLeaseTTL       = 10 * time.Second
	MinLeaseTTL           = 2 * time.Second
	DefaultCommandTimeout = 10 * time.Second
	DefaultSocket         = "/run/edgefence/edgefence.sock"
	DefaultStateDir       = "/var/lib/edgefence"
)

// Fence point kinds of a device.
const (
	FenceDevice  = "device"  // the device firmware runs the shim
	FenceGateway = "gateway" // the home gateway's fence table guards the device (legacy serial devices)
)

// Config is the agent's configuration, read from YAML. The zero value of an
// optional field means its default; Validate fills defaults in.
type Config struct {
	Gateway  string         `yaml:"gateway"`   // this gateway's id, unique in the fleet
	StateDir string         `yaml:"state_dir"` // local durable state
	Etcd     EtcdConfig     `yaml:"etcd"`
	MQTT     MQTTConfig     `yaml:"mqtt"`
	API      APIConfig      `yaml:"api"`
	Metrics  MetricsConfig  `yaml:"metrics"`
	Command  CommandConfig  `yaml:"command"`
	Outbox   OutboxConfig   `yaml:"outbox"`
	Twins    TwinsConfig    `yaml:"twins"`
	Log      LogConfig      `yaml:"log"`
	Devices  []DeviceConfig `yaml:"devices"`
}

// EtcdConfig says where the lock service is.
type EtcdConfig struct {
	Endpoints   []string      `yaml:"endpoints"`
	Prefix      string        `yaml:"prefix"`       // key prefix, default /edgefence/v1
	DialTimeout time.Duration `yaml:"dial_timeout"` // default 5s
	LeaseTTL    time.Duration `yaml:"lease_ttl"`    // session TTL, default 10s, minimum 2s, whole seconds
}

// MQTTConfig says where the broker is.
type MQTTConfig struct {
	Brokers       []string      `yaml:"brokers"`
	Prefix        string        `yaml:"prefix"`         // topic prefix, default edgefence/v1
	ClientID      string        `yaml:"client_id"`      // default edgefence-<gateway>
	KeepAlive     time.Duration `yaml:"keep_alive"`     // default 30s
	SessionExpiry time.Duration `yaml:"session_expiry"` // default 5m
}

// APIConfig is the local control API (a unix socket).
type APIConfig struct {
	Socket string `yaml:"socket"` // default /run/edgefence/edgefence.sock
}

// MetricsConfig is the Prometheus endpoint (/metrics, /healthz, /readyz;
// see Agent.MetricsHandler).
type MetricsConfig struct {
	// Listen is the host:port to serve on; empty (the default) means off.
	// Recommended: 127.0.0.1:9464, local to the gateway. An empty host
	// (":9464") listens on every interface.
	Listen string `yaml:"listen"`
}

// CommandConfig tunes the command path.
type CommandConfig struct {
	Timeout time.Duration `yaml:"timeout"` // how long to wait for an ack, default 10s
}

// OutboxConfig bounds the durable outbox (offline.Options). Zero values
// mean the offline package's defaults.
type OutboxConfig struct {
	MaxPerDevice      int           `yaml:"max_per_device"`       // pending commands per device, default 10000
	MaxBytesPerDevice int64         `yaml:"max_bytes_per_device"` // pending envelope bytes per device, default 16 MiB
	MaxTotal          int           `yaml:"max_total"`            // pending commands in all, default 100000
	MaxTotalBytes     int64         `yaml:"max_total_bytes"`      // pending envelope bytes in all, default 256 MiB
	TTL               time.Duration `yaml:"ttl"`                  // a command not delivered by then ends as expired, default 1h
	Retention         time.Duration `yaml:"retention"`            // terminal entries are kept this long, default 24h
}

// TwinsConfig switches the twin reconciler on (Options.Twins): desired
// states in etcd become fenced twin.set commands, and what the devices
// accept is written to their reported states, fenced by the lock (I5).
type TwinsConfig struct {
	// Enabled turns it on; default off. The agent then watches
	// <etcd.prefix>/devices/ and keeps <state_dir>/twin.db.
	Enabled bool `yaml:"enabled"`
}

// Autonomy policies of a device: what the agent does while etcd is out of
// reach and its session has ended.
const (
	// PolicyStrict stops issuing commands to the device until a lock is
	// held again (invariant I6's early stop). The default.
	PolicyStrict = "strict"
	// PolicyAutonomous keeps issuing commands under the last token held.
	// Safe because the fence point refuses them once a newer holder has
	// reached the device; the agent returns to normal when it holds a
	// lock again.
	PolicyAutonomous = "autonomous"
)

// LogConfig selects the log output.
type LogConfig struct {
	Level  string `yaml:"level"`  // debug, info, warn, error; default info
	Format string `yaml:"format"` // json, text or auto (json unless stderr is a terminal)
}

// DeviceConfig is one device this agent campaigns for.
type DeviceConfig struct {
	ID    string `yaml:"id"`
	Fence string `yaml:"fence"` // "device" (default) or "gateway"
	// Home is the gateway whose fence table guards a `fence: gateway`
	// device: the one it is wired to. Required for `fence: gateway`.
	Home string `yaml:"home,omitempty"`
	// Serial is the device's serial line; only on its home gateway.
	Serial *SerialConfig `yaml:"serial,omitempty"`
	// MQTTTopic is, instead of Serial, the topic of a legacy device that
	// speaks plain MQTT (no shim): admitted commands are published as JSON
	// on <mqtt_topic>/<kind>. Only on its home gateway.
	MQTTTopic string `yaml:"mqtt_topic,omitempty"`
	// Policy is what happens while etcd is unreachable: "strict"
	// (default) or "autonomous"; see PolicyStrict, PolicyAutonomous.
	Policy string `yaml:"policy,omitempty"`
	// ReissueKinds lists the command kinds that may be re-issued under a
	// new token when a queued command of an older token of this agent is
	// refused as stale by the fence point. Only for kinds whose effect is
	// an absolute, idempotent setting that should still win (e.g. a
	// setpoint); never for relative or one-shot actions. Default: none.
	ReissueKinds []string `yaml:"reissue_kinds,omitempty"`
}

// SerialConfig is a device's serial line (see transport/serial.PortConfig).
type SerialConfig struct {
	Port        string        `yaml:"port"`         // e.g. /dev/ttyUSB0 or /dev/serial/by-id/...
	Baud        int           `yaml:"baud"`         // default 115200
	DataBits    int           `yaml:"data_bits"`    // default 8
	Parity      string        `yaml:"parity"`       // N (default), E or O
	StopBits    int           `yaml:"stop_bits"`    // 1 (default) or 2
	ReadTimeout time.Duration `yaml:"read_timeout"` // default 100ms; multiples of 100ms up to 25.5s
}

// Bridged returns the devices this gateway is home for.
func (c *Config) Bridged() []DeviceConfig {
	var out []DeviceConfig
	for _, d := range c.Devices {
		if d.Fence == FenceGateway && d.Home == c.Gateway {
			out = append(out, d)
		}
	}
	return out
}

// LoadConfig reads and validates a YAML config file. Unknown keys are errors.
func LoadConfig(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	c, err := ParseConfig(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// ParseConfig decodes and validates YAML config bytes.
func ParseConfig(b []byte) (*Config, error) {
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

func fieldErr(field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrConfig, field, fmt.Sprintf(format, args...))
}

// Validate checks every field, fills in defaults, and returns an error
// wrapping ErrConfig that names the first bad field.
func (c *Config) Validate() error {
	if c.Gateway == "" {
		return fieldErr("gateway", "required")
	}
	if err := fence.ValidateDeviceID(c.Gateway); err != nil {
		return fieldErr("gateway", "%q: use [A-Za-z0-9._-]", c.Gateway)
	}
	if c.StateDir == "" {
		c.StateDir = DefaultStateDir
	}
	if len(c.Etcd.Endpoints) == 0 {
		return fieldErr("etcd.endpoints", "at least one endpoint required")
	}
	for i, e := range c.Etcd.Endpoints {
		if err := checkURL(e, "http", "https"); err != nil {
			return fieldErr(fmt.Sprintf("etcd.endpoints[%d]", i), "%v", err)
		}
	}
	if c.Etcd.Prefix == "" {
		c.Etcd.Prefix = DefaultEtcdPrefix
	}
	if !strings.HasPrefix(c.Etcd.Prefix, "/") || strings.HasSuffix(c.Etcd.Prefix, "/") {
		return fieldErr("etcd.prefix", "%q must start with / and not end with /", c.Etcd.Prefix)
	}
	if c.Etcd.DialTimeout == 0 {
		c.Etcd.DialTimeout = 5 * time.Second
	}
	if c.Etcd.DialTimeout < 0 {
		return fieldErr("etcd.dial_timeout", "must be positive")
	}
	switch ttl := c.Etcd.LeaseTTL; {
	case ttl == 0:
		c.Etcd.LeaseTTL = DefaultLeaseTTL
	case ttl < MinLeaseTTL:
		return fieldErr("etcd.lease_ttl", "%v is below the minimum %v", ttl, MinLeaseTTL)
	case ttl%time.Second != 0:
		return fieldErr("etcd.lease_ttl", "%v: etcd leases are whole seconds", ttl)
	}
	if len(c.MQTT.Brokers) == 0 {
		return fieldErr("mqtt.brokers", "at least one broker URL required")
	}
	for i, b := range c.MQTT.Brokers {
		if err := checkURL(b, "mqtt", "tcp", "mqtts", "ssl", "tls", "tcps"); err != nil {
			return fieldErr(fmt.Sprintf("mqtt.brokers[%d]", i), "%v", err)
		}
	}
	if c.MQTT.Prefix == "" {
		c.MQTT.Prefix = DefaultMQTTPrefix
	}
	if strings.ContainsAny(c.MQTT.Prefix, "+#") || strings.HasPrefix(c.MQTT.Prefix, "/") || strings.HasSuffix(c.MQTT.Prefix, "/") {
		return fieldErr("mqtt.prefix", "%q: no wildcards, no leading or trailing /", c.MQTT.Prefix)
	}
	if c.MQTT.ClientID == "" {
		c.MQTT.ClientID = "edgefence-" + c.Gateway
	}
	if c.MQTT.KeepAlive == 0 {
		c.MQTT.KeepAlive = 30 * time.Second
	}
	if c.MQTT.SessionExpiry == 0 {
		c.MQTT.SessionExpiry = 5 * time.Minute
	}
	if c.MQTT.KeepAlive < time.Second || c.MQTT.SessionExpiry < 0 {
		return fieldErr("mqtt.keep_alive", "keep_alive must be at least 1s and session_expiry not negative")
	}
	if c.API.Socket == "" {
		c.API.Socket = DefaultSocket
	}
	if l := c.Metrics.Listen; l != "" {
		if err := checkListen(l); err != nil {
			return fieldErr("metrics.listen", "%v (e.g. 127.0.0.1:9464)", err)
		}
	}
	if c.Command.Timeout == 0 {
		c.Command.Timeout = DefaultCommandTimeout
	}
	if c.Command.Timeout < 0 {
		return fieldErr("command.timeout", "must be positive")
	}
	o := &c.Outbox
	switch {
	case o.MaxPerDevice < 0:
		return fieldErr("outbox.max_per_device", "must not be negative")
	case o.MaxBytesPerDevice < 0:
		return fieldErr("outbox.max_bytes_per_device", "must not be negative")
	case o.MaxTotal < 0:
		return fieldErr("outbox.max_total", "must not be negative")
	case o.MaxTotalBytes < 0:
		return fieldErr("outbox.max_total_bytes", "must not be negative")
	case o.TTL < 0:
		return fieldErr("outbox.ttl", "must not be negative")
	case o.Retention < 0:
		return fieldErr("outbox.retention", "must not be negative")
	}
	switch c.Log.Level {
	case "":
		c.Log.Level = "info"
	case "debug", "info", "warn", "error":
	default:
		return fieldErr("log.level", "%q: want debug, info, warn or error", c.Log.Level)
	}
	switch c.Log.Format {
	case "":
		c.Log.Format = "auto"
	case "auto", "json", "text":
	default:
		return fieldErr("log.format", "%q: want auto, json or text", c.Log.Format)
	}
	if len(c.Devices) == 0 {
		return fieldErr("devices", "at least one device required")
	}
	seen := make(map[string]bool, len(c.Devices))
	for i := range c.Devices {
		d := &c.Devices[i]
		f := fmt.Sprintf("devices[%d]", i)
		if err := fence.ValidateDeviceID(d.ID); err != nil {
			return fieldErr(f+".id", "%v", err)
		}
		if seen[d.ID] {
			return fieldErr(f+".id", "%q listed twice", d.ID)
		}
		seen[d.ID] = true
		switch d.Fence {
		case "":
			d.Fence = FenceDevice
		case FenceDevice, FenceGateway:
		default:
			return fieldErr(f+".fence", "%q: want %q or %q", d.Fence, FenceDevice, FenceGateway)
		}
		link := d.Serial != nil || d.MQTTTopic != ""
		switch {
		case d.Fence == FenceDevice && (d.Home != "" || link):
			return fieldErr(f+".home", "home, serial and mqtt_topic are for `fence: gateway` devices")
		case d.Fence == FenceGateway && d.Home == "":
			return fieldErr(f+".home", "a `fence: gateway` device needs its home gateway")
		case d.Fence == FenceGateway && d.Home == c.Gateway && !link:
			return fieldErr(f+".serial", "this gateway is %q's home: give its serial port or its mqtt_topic", d.ID)
		case d.Serial != nil && d.MQTTTopic != "":
			return fieldErr(f+".mqtt_topic", "a device is on serial or on mqtt_topic, not both")
		case d.Fence == FenceGateway && d.Home != c.Gateway && link:
			return fieldErr(f+".serial", "only the home gateway %q reaches %q's link (serial or mqtt_topic)", d.Home, d.ID)
		case strings.ContainsAny(d.MQTTTopic, "+#") || strings.HasPrefix(d.MQTTTopic, c.MQTT.Prefix+"/"):
			return fieldErr(f+".mqtt_topic", "%q: no wildcards, and not under mqtt.prefix", d.MQTTTopic)
		}
		if d.Serial != nil && d.Serial.Port == "" {
			return fieldErr(f+".serial.port", "required")
		}
		switch d.Policy {
		case "":
			d.Policy = PolicyStrict
		case PolicyStrict, PolicyAutonomous:
		default:
			return fieldErr(f+".policy", "%q: want %q or %q", d.Policy, PolicyStrict, PolicyAutonomous)
		}
		for j, k := range d.ReissueKinds {
			if k == "" || len(k) > fence.MaxKindLen {
				return fieldErr(fmt.Sprintf("%s.reissue_kinds[%d]", f, j), "%q is not a command kind", k)
			}
		}
	}
	return nil
}

// checkListen checks a host:port to listen on: a numeric port in 1-65535
// and a host that is empty, an IP address or a name.
func checkListen(s string) error {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("%q: want host:port", s)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("%q: port must be a number in 1-65535", s)
	}
	if strings.ContainsAny(host, " /") {
		return fmt.Errorf("%q: bad host", s)
	}
	return nil
}

func checkURL(s string, schemes ...string) error {
	u, err := url.Parse(s)
	if err != nil {
		return err
	}
	for _, sc := range schemes {
		if u.Scheme == sc {
			if u.Host == "" {
				return fmt.Errorf("%q has no host", s)
			}
			return nil
		}
	}
	return fmt.Errorf("%q: scheme must be one of %s", s, strings.Join(schemes, ", "))
}
