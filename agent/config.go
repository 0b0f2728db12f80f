package agent

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/offline"
	"github.com/edgefence/edgefence/transport/mqtt"
	"github.com/edgefence/edgefence/transport/serial"
)

// Defaults and limits of the configuration.
const (
	DefaultEtcdPrefix     = "/edgefence/v1"
	DefaultMQTTPrefix     = "edgefence/v1"
	DefaultLeaseTTL       = 10 * time.Second
	MinLeaseTTL           = 2 * time.Second
	DefaultCommandTimeout = 10 * time.Second
	// DefaultMQTTReconnectBackoffMax is mqtt.reconnect_backoff_max's
	// default: well under command.timeout, so that a command sent during a
	// broker outage is still answered in time once the broker is back.
	DefaultMQTTReconnectBackoffMax = 5 * time.Second
	DefaultSocket                  = "/run/edgefence/edgefence.sock"
	DefaultStateDir                = "/var/lib/edgefence"
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
	Username    string        `yaml:"username"`     // etcd auth user; empty means no auth
	Password    Secret        `yaml:"password"`     // its password; or $EDGEFENCE_ETCD_PASSWORD(_FILE)
	TLS         TLSConfig     `yaml:"tls"`          // for https:// endpoints
}

// MQTTConfig says where the broker is.
type MQTTConfig struct {
	Brokers       []string      `yaml:"brokers"`
	Prefix        string        `yaml:"prefix"`         // topic prefix, default edgefence/v1
	ClientID      string        `yaml:"client_id"`      // default edgefence-<gateway>
	KeepAlive     time.Duration `yaml:"keep_alive"`     // default 30s
	SessionExpiry time.Duration `yaml:"session_expiry"` // default 5m
	// ReconnectBackoffMax is the ceiling of the delay between attempts to
	// reach the broker after the connection is lost (exponential with
	// jitter from 250ms up to it): the longest the agent stays away from
	// a broker that is back. Default 5s, minimum 250ms.
	ReconnectBackoffMax time.Duration `yaml:"reconnect_backoff_max"`
	Username            string        `yaml:"username"` // MQTT CONNECT user name; empty means none
	Password            Secret        `yaml:"password"` // its password; or $EDGEFENCE_MQTT_PASSWORD(_FILE)
	TLS                 TLSConfig     `yaml:"tls"`      // for mqtts:// (ssl, tls, tcps) brokers
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
	// PerDevice adds the series with a device label (state, token,
	// verdicts, outbox depth and age, twin delta: 11 to 14 per device).
	// Default false: fleet-level series only, whatever the fleet's size.
	PerDevice bool `yaml:"per_device"`
}

// CommandConfig tunes the command path.
type CommandConfig struct {
	Timeout time.Duration `yaml:"timeout"` // how long to wait for an ack, default 10s
}

// OutboxConfig bounds the durable outbox (offline.Options). Zero values
// mean the offline package's defaults (offline.Default*); Validate fills
// them in.
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
// Zero values mean transport/serial's defaults; Validate fills them in.
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

// Override changes a decoded config before it is validated: a command-line
// flag. Problems with Key or the keys under it are reported as Flag's.
type Override struct {
	Flag  string // e.g. --etcd
	Key   string // the dotted key it sets, e.g. etcd.endpoints
	Apply func(*Config)
}

// LoadConfig reads a YAML config file, applies the environment overrides
// of secrets (EDGEFENCE_MQTT_PASSWORD, EDGEFENCE_ETCD_PASSWORD and their
// _FILE variants) and then overrides, and validates the result. Every
// problem is reported, joined (errors.Join): each a *ConfigError naming
// the file, line and dotted key (see ConfigErrors), wrapping ErrConfig.
// Unknown keys are errors.
func LoadConfig(path string, overrides ...Override) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, &ConfigError{File: path, Msg: err.Error()}
	}
	return parseConfig(b, path, os.LookupEnv, overrides)
}

// ParseConfig decodes and validates YAML config bytes (no environment
// overrides); errors are as LoadConfig's, without a file name.
func ParseConfig(b []byte) (*Config, error) {
	return parseConfig(b, "", nil, nil)
}

func parseConfig(b []byte, file string, lookup func(string) (string, bool), overrides []Override) (*Config, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, withFile(file, yamlErrors(err, nil, true))
	}
	var c Config
	lines := keyLines{}
	var errs []error
	decoded := true
	var typeKeys []string // keys whose values did not decode: not validated again
	if len(doc.Content) > 0 {
		root := doc.Content[0]
		if root.Kind != yaml.MappingNode {
			return nil, withFile(file, []error{&ConfigError{Line: root.Line, Msg: "not a config: want a mapping of keys (gateway:, etcd:, …)"}})
		}
		aliased := walkNode(root, reflect.TypeFor[Config](), "", lines, &errs)
		if err := root.Decode(&c); err != nil {
			ye := yamlErrors(err, lines, false)
			if _, ok := errors.AsType[*yaml.TypeError](err); ok && !strings.Contains(err.Error(), "already defined at line") {
				// yaml/v3 has decoded everything else, so the rest is
				// validated too: every problem in one pass. A type error
				// met through an alias is reported at the anchor's line,
				// so keys holding aliases are left out too.
				for _, ce := range ConfigErrors(errors.Join(ye...)) {
					typeKeys = append(typeKeys, ce.Key)
				}
				typeKeys = append(typeKeys, aliased...)
			} else {
				// Any other error — a key given twice, which makes yaml/v3
				// skip its whole mapping, too — leaves nothing to trust.
				decoded = false
				if ce := aliasBomb(root, lines); ce != nil && strings.Contains(err.Error(), "excessive aliasing") {
					ye = []error{ce} // the same problem, with its key and line
				}
			}
			errs = append(errs, ye...)
		}
	}
	if lookup != nil {
		errs = append(errs, c.applyEnv(lookup)...)
	}
	for _, o := range overrides {
		o.Apply(&c)
	}
	if decoded {
		verr := c.Validate()
		for _, ce := range ConfigErrors(verr) {
			if related(ce.Key, typeKeys) {
				continue // the zero value the type error left behind
			}
			for _, o := range overrides {
				if ce.Key == o.Key || strings.HasPrefix(ce.Key, o.Key+".") || strings.HasPrefix(ce.Key, o.Key+"[") {
					ce.Key, ce.Line = o.Flag, -1
				}
			}
			if ce.Line == 0 {
				ce.Line = lines.line(ce.Key)
			}
			errs = append(errs, ce)
		}
	}
	if lookup != nil && len(errs) == 0 {
		// Read from a file on the gateway: the TLS files must load.
		for _, t := range []struct {
			key string
			cfg TLSConfig
		}{{"etcd.tls", c.Etcd.TLS}, {"mqtt.tls", c.MQTT.TLS}} {
			if _, err := t.cfg.Load(t.key); err != nil {
				for _, ce := range ConfigErrors(err) {
					ce.Line = lines.line(ce.Key)
					errs = append(errs, ce)
				}
			}
		}
	}
	if len(errs) > 0 {
		return nil, withFile(file, errs)
	}
	return &c, nil
}

// related reports whether key is one of keys, under one of them, or above
// one of them (devices is above devices[1].policy). An empty key in keys
// (a type error on a line with no key) relates to nothing.
func related(key string, keys []string) bool {
	under := func(k, parent string) bool {
		return strings.HasPrefix(k, parent+".") || strings.HasPrefix(k, parent+"[")
	}
	for _, k := range keys {
		if k != "" && (k == key || under(key, k) || under(k, key)) {
			return true
		}
	}
	return false
}

// withFile sets the file of errs (not of flag errors, Line -1), orders
// them by line, and joins them.
func withFile(file string, errs []error) error {
	sort.SliceStable(errs, func(i, j int) bool { return lineOf(errs[i]) < lineOf(errs[j]) })
	for _, e := range errs {
		if ce, ok := e.(*ConfigError); ok {
			if ce.Line < 0 {
				ce.Line = 0
				continue
			}
			ce.File = file
		}
	}
	return errors.Join(errs...)
}

func lineOf(err error) int {
	if ce, ok := err.(*ConfigError); ok {
		return ce.Line
	}
	return 0
}

// serialFields maps transport/serial.PortConfig's field names to keys.
var serialFields = map[string]string{"Path": "port", "Baud": "baud", "DataBits": "data_bits", "Parity": "parity", "StopBits": "stop_bits", "ReadTimeout": "read_timeout"}

// Validate checks every field and fills in defaults. It reports every
// problem, joined: each a *ConfigError naming the dotted key (no line: see
// LoadConfig), wrapping ErrConfig.
func (c *Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, &ConfigError{Key: key, Msg: fmt.Sprintf(format, args...)})
	}
	if p := idProblem(c.Gateway); p != "" {
		bad("gateway", "%s", p)
	}
	if c.StateDir == "" {
		c.StateDir = DefaultStateDir
	}
	if len(c.Etcd.Endpoints) == 0 {
		bad("etcd.endpoints", "at least one endpoint required")
	}
	for i, e := range c.Etcd.Endpoints {
		if err := checkURL(e, "http", "https"); err != nil {
			bad(fmt.Sprintf("etcd.endpoints[%d]", i), "%v", err)
		}
	}
	if c.Etcd.Prefix == "" {
		c.Etcd.Prefix = DefaultEtcdPrefix
	}
	if !strings.HasPrefix(c.Etcd.Prefix, "/") || strings.HasSuffix(c.Etcd.Prefix, "/") {
		bad("etcd.prefix", "%q must start with / and not end with /", c.Etcd.Prefix)
	}
	if c.Etcd.DialTimeout == 0 {
		c.Etcd.DialTimeout = 5 * time.Second
	}
	if c.Etcd.DialTimeout < 0 {
		bad("etcd.dial_timeout", "must be positive")
	}
	switch ttl := c.Etcd.LeaseTTL; {
	case ttl == 0:
		c.Etcd.LeaseTTL = DefaultLeaseTTL
	case ttl < MinLeaseTTL:
		bad("etcd.lease_ttl", "%v is below the minimum %v", ttl, MinLeaseTTL)
	case ttl%time.Second != 0:
		bad("etcd.lease_ttl", "%v: etcd leases are whole seconds", ttl)
	}
	c.credentials("etcd", c.Etcd.Username, c.Etcd.Password, c.Etcd.TLS, bad)
	if len(c.MQTT.Brokers) == 0 {
		bad("mqtt.brokers", "at least one broker URL required")
	}
	for i, b := range c.MQTT.Brokers {
		if err := checkURL(b, "mqtt", "tcp", "mqtts", "ssl", "tls", "tcps"); err != nil {
			bad(fmt.Sprintf("mqtt.brokers[%d]", i), "%v", err)
		}
	}
	if c.MQTT.Prefix == "" {
		c.MQTT.Prefix = DefaultMQTTPrefix
	}
	if strings.ContainsAny(c.MQTT.Prefix, "+#") || strings.HasPrefix(c.MQTT.Prefix, "/") || strings.HasSuffix(c.MQTT.Prefix, "/") {
		bad("mqtt.prefix", "%q: no wildcards, no leading or trailing /", c.MQTT.Prefix)
	}
	if c.MQTT.ClientID == "" && c.Gateway != "" {
		c.MQTT.ClientID = "edgefence-" + c.Gateway
	}
	if c.MQTT.KeepAlive == 0 {
		c.MQTT.KeepAlive = 30 * time.Second
	}
	if c.MQTT.SessionExpiry == 0 {
		c.MQTT.SessionExpiry = 5 * time.Minute
	}
	if c.MQTT.KeepAlive < time.Second {
		bad("mqtt.keep_alive", "%v: must be at least 1s", c.MQTT.KeepAlive)
	}
	if c.MQTT.SessionExpiry < 0 {
		bad("mqtt.session_expiry", "must not be negative")
	}
	switch rb := c.MQTT.ReconnectBackoffMax; {
	case rb == 0:
		c.MQTT.ReconnectBackoffMax = DefaultMQTTReconnectBackoffMax
	case rb < mqtt.DefaultMinBackoff:
		bad("mqtt.reconnect_backoff_max", "%v is below the first retry's delay %v", rb, mqtt.DefaultMinBackoff)
	}
	c.credentials("mqtt", c.MQTT.Username, c.MQTT.Password, c.MQTT.TLS, bad)
	if c.API.Socket == "" {
		c.API.Socket = DefaultSocket
	}
	if l := c.Metrics.Listen; l != "" {
		if err := checkListen(l); err != nil {
			bad("metrics.listen", "%v (e.g. 127.0.0.1:9464)", err)
		}
	}
	if c.Command.Timeout == 0 {
		c.Command.Timeout = DefaultCommandTimeout
	}
	if c.Command.Timeout < 0 {
		bad("command.timeout", "must be positive")
	}
	o := &c.Outbox
	for _, n := range []struct {
		key string
		neg bool
	}{
		{"outbox.max_per_device", o.MaxPerDevice < 0}, {"outbox.max_bytes_per_device", o.MaxBytesPerDevice < 0},
		{"outbox.max_total", o.MaxTotal < 0}, {"outbox.max_total_bytes", o.MaxTotalBytes < 0},
		{"outbox.ttl", o.TTL < 0}, {"outbox.retention", o.Retention < 0},
	} {
		if n.neg {
			bad(n.key, "must not be negative")
		}
	}
	// The effective values, as the outbox applies them (offline.Options),
	// so that `config check` shows what runs.
	orDefault(&o.MaxPerDevice, offline.DefaultMaxPerDevice)
	orDefault(&o.MaxBytesPerDevice, offline.DefaultMaxBytesPerDevice)
	orDefault(&o.MaxTotal, offline.DefaultMaxTotal)
	orDefault(&o.MaxTotalBytes, offline.DefaultMaxTotalBytes)
	orDefault(&o.TTL, offline.DefaultTTL)
	orDefault(&o.Retention, offline.DefaultRetention)
	switch c.Log.Level {
	case "":
		c.Log.Level = "info"
	case "debug", "info", "warn", "error":
	default:
		bad("log.level", "%q: want debug, info, warn or error", c.Log.Level)
	}
	switch c.Log.Format {
	case "":
		c.Log.Format = "auto"
	case "auto", "json", "text":
	default:
		bad("log.format", "%q: want auto, json or text", c.Log.Format)
	}
	if len(c.Devices) == 0 {
		bad("devices", "at least one device required")
	}
	seen := make(map[string]bool, len(c.Devices))
	for i := range c.Devices {
		d := &c.Devices[i]
		f := fmt.Sprintf("devices[%d]", i)
		if p := idProblem(d.ID); p != "" {
			bad(f+".id", "%s", p)
		} else if seen[d.ID] {
			bad(f+".id", "%q listed twice", d.ID)
		}
		seen[d.ID] = true
		switch d.Fence {
		case "":
			d.Fence = FenceDevice
		case FenceDevice, FenceGateway:
		default:
			bad(f+".fence", "%q: want %q or %q", d.Fence, FenceDevice, FenceGateway)
		}
		if p := idProblem(d.Home); d.Home != "" && p != "" {
			bad(f+".home", "%s", p)
		}
		link := d.Serial != nil || d.MQTTTopic != ""
		switch {
		case d.Fence == FenceDevice && (d.Home != "" || link):
			bad(f+".home", "home, serial and mqtt_topic are for `fence: gateway` devices")
		case d.Fence == FenceGateway && d.Home == "":
			bad(f+".home", "a `fence: gateway` device needs its home gateway")
		case d.Fence == FenceGateway && d.Home == c.Gateway && !link:
			bad(f+".serial", "this gateway is %q's home: give its serial port or its mqtt_topic", d.ID)
		case d.Serial != nil && d.MQTTTopic != "":
			bad(f+".mqtt_topic", "a device is on serial or on mqtt_topic, not both")
		case d.Fence == FenceGateway && d.Home != c.Gateway && link:
			bad(f+".serial", "only the home gateway %q reaches %q's link (serial or mqtt_topic)", d.Home, d.ID)
		case strings.ContainsAny(d.MQTTTopic, "+#") || strings.HasPrefix(d.MQTTTopic, c.MQTT.Prefix+"/"):
			bad(f+".mqtt_topic", "%q: no wildcards, and not under mqtt.prefix", d.MQTTTopic)
		case d.Serial != nil && d.Serial.Port == "":
			bad(f+".serial.port", "required")
		case d.Serial != nil:
			s := d.Serial
			// The effective values, as transport/serial applies them.
			orDefault(&s.Baud, serial.DefaultBaud)
			orDefault(&s.DataBits, serial.DefaultDataBits)
			orDefault(&s.Parity, serial.DefaultParity)
			orDefault(&s.StopBits, serial.DefaultStopBits)
			orDefault(&s.ReadTimeout, serial.DefaultReadTimeout)
			pc := serial.PortConfig{Path: s.Port, Baud: s.Baud, DataBits: s.DataBits, Parity: s.Parity, StopBits: s.StopBits, ReadTimeout: s.ReadTimeout}
			if err := pc.Validate(); err != nil {
				msg := strings.TrimPrefix(strings.TrimPrefix(err.Error(), serial.ErrInvalidConfig.Error()), ": ")
				key := f + ".serial"
				if name, _, _ := strings.Cut(msg, " "); serialFields[name] != "" {
					key += "." + serialFields[name]
				}
				bad(key, "%s", msg)
			}
		}
		switch d.Policy {
		case "":
			d.Policy = PolicyStrict
		case PolicyStrict, PolicyAutonomous:
		default:
			bad(f+".policy", "%q: want %q or %q", d.Policy, PolicyStrict, PolicyAutonomous)
		}
		for j, k := range d.ReissueKinds {
			if k == "" || len(k) > fence.MaxKindLen {
				bad(fmt.Sprintf("%s.reissue_kinds[%d]", f, j), "%q is not a command kind", k)
			}
		}
	}
	return errors.Join(errs...)
}

// idRule is fence.ValidateDeviceID's rule for device and gateway ids, in
// a config's words.
var idRule = fmt.Sprintf("may contain only letters A-Z a-z, digits 0-9, '.', '_' and '-', not start with '.', and be at most %d characters", fence.MaxDeviceIDLen)

// idProblem says what is wrong with a device or gateway id — the value
// and the rule, not the envelope codec's message — or "" if nothing is.
func idProblem(id string) string {
	switch {
	case id == "":
		return "required"
	case len(id) > fence.MaxDeviceIDLen:
		return fmt.Sprintf("%q… is %d characters: %s", id[:32], len(id), idRule)
	case fence.ValidateDeviceID(id) != nil:
		return fmt.Sprintf("%q: %s", id, idRule)
	}
	return ""
}

// orDefault sets *v to def if it is the zero value.
func orDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// credentials checks a client's user, password and TLS files.
func (c *Config) credentials(key, user string, pass Secret, t TLSConfig, bad func(key, format string, args ...any)) {
	if isPlaceholder(pass.Value()) {
		bad(key+".password", "%q is a redacted placeholder printed by `edgefence config check`, not a password", pass.Value())
	}
	if pass.Value() != "" && user == "" {
		bad(key+".username", "required with a password")
	}
	t.validate(key+".tls", bad)
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
		if ue, ok := errors.AsType[*url.Error](err); ok {
			err = ue.Err // without the URL: it may hold a password
		}
		return fmt.Errorf("not a URL: %w", err)
	}
	if u.User != nil {
		// Not used by the clients, and printed wherever the URL is.
		return fmt.Errorf("%q: no credentials in URLs; use username, and password or its environment override", u.Redacted())
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
