package agent

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/edgefence/edgefence/offline"
	"github.com/edgefence/edgefence/transport/mqtt"
	"github.com/edgefence/edgefence/transport/serial"
)

// Defaults and limits of the configuration.
const (
	DefaultEtcdPrefix      = "/edgefence/v1"
	DefaultMQTTPrefix      = "edgefence/v1"
	DefaultEtcdDialTimeout = 5 * time.Second
	DefaultLeaseTTL        = 10 * time.Second
	MinLeaseTTL            = 2 * time.Second
	DefaultCommandTimeout  = 10 * time.Second
	// DefaultMQTTReconnectBackoffMax is mqtt.reconnect_backoff_max's
	// default: well under command.timeout, so that a command sent during a
	// broker outage is still answered in time once the broker is back.
	DefaultMQTTReconnectBackoffMax = 5 * time.Second
	DefaultSocket                  = "/run/edgefence/edgefence.sock"
	DefaultStateDir                = "/var/lib/edgefence"
	DefaultLogLevel                = "info"
	DefaultLogFormat               = "auto"

	// MaxMQTTPacketSize is mqtt.max_packet_size's ceiling: a bound that
	// lets one publish grow the agent by more than 16 MiB is no bound on a
	// gateway. The floor is mqtt.LargestPacket, the default
	// mqtt.DefaultMaxPacketSize.
	MaxMQTTPacketSize = 16 << 20
)

// Fence point kinds of a device.
const (
	FenceDevice  = "device"  // the device firmware runs the shim
	FenceGateway = "gateway" // the home gateway's fence table guards the device (legacy serial devices)
)

// Config is the agent's configuration, read from YAML. The zero value of an
// optional field means its default: ApplyDefaults fills them in (LoadConfig
// does), Validate accepts either.
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
	Jobs     JobsConfig     `yaml:"jobs"`
	Log      LogConfig      `yaml:"log"`
	Auth     AuthConfig     `yaml:"auth"`
	Modbus   ModbusConfig   `yaml:"modbus"`
	Devices  []DeviceConfig `yaml:"devices"`
}

// AuthConfig is the gateway's part of the trust chain (invariant I7,
// fence/auth): its signing key, with which every command to an `auth:
// required` device goes out as a signed envelope (COSE_Sign1, ES256) that
// fence points verify against the operator's certificate for this key
// (`edgefence keys certify`); and the operator's root public key, against
// which it checks what devices and other gateways present (device keys,
// certificates, revocation lists). `edgefence keys init` makes all of them
// for a single site. A config without a key is valid only if every device
// says `auth: off`.
type AuthConfig struct {
	KeyFile string `yaml:"key_file"` // the gateway's private key (PKCS#8 PEM, `edgefence keys new`); keep it off etcd
	KeyID   string `yaml:"key_id"`   // the key id its certificate names
	// Certificate is this gateway's certificate (`edgefence keys certify`),
	// which it hands to the fence points it commands.
	Certificate string `yaml:"certificate"`
	// Revocations is the newest revocation list the operator gave this
	// gateway (`edgefence keys revoke`), optional.
	Revocations string `yaml:"revocations"`
	// TrustRoot is the operator's root public key (PKIX PEM) and
	// TrustRootKID its key id: the anchor of every certificate and list.
	TrustRoot    string `yaml:"trust_root"`
	TrustRootKID string `yaml:"trust_root_kid"`
}

// Device auth policies (DeviceConfig.Auth).
const (
	// AuthRequired: commands are signed, and the device's acks and state
	// reports must be signed by its enrolled key. The default: a device
	// is signed unless its config says otherwise.
	AuthRequired = "required"
	// AuthOff: plain envelopes and unsigned acks, for fleets mid-rollout;
	// only when a device's config says so, warned at start, counted in
	// metrics and status.
	AuthOff = "off"
)

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

	// MaxPacketSize is the MQTT v5 Maximum Packet Size, bytes, sent in
	// CONNECT and held by the client too: a bigger message is dropped
	// unread (mqtt.Config.MaxPacketSize). Default 128 KiB; at least
	// mqtt.LargestPacket (68,608: the largest envelope or state report
	// with a signature), at most MaxMQTTPacketSize.
	MaxPacketSize int `yaml:"max_packet_size"`
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
	// Pprof also serves Go's profiler under /debug/pprof/ on the same
	// listener (CPU profiles of the running agent, e.g. edgefence-bench
	// rss --agent-cpuprofile). Default false: it exposes internals and
	// costs CPU while a profile runs. Only in a build with -tags
	// edgefence_pprof (a config error otherwise): the shipped agent has
	// no profiler.
	Pprof bool `yaml:"pprof"`
}

// CommandConfig tunes the command path.
type CommandConfig struct {
	Timeout time.Duration `yaml:"timeout"` // how long to wait for an ack, default 10s
}

// OutboxConfig bounds the durable outbox (offline.Options). Zero values
// mean the offline package's defaults (offline.Default*); ApplyDefaults
// fills them in.
type OutboxConfig struct {
	MaxPerDevice      int           `yaml:"max_per_device"`       // pending commands per device, default 10000
	MaxBytesPerDevice int64         `yaml:"max_bytes_per_device"` // pending envelope bytes per device, default 16 MiB
	MaxTotal          int           `yaml:"max_total"`            // pending commands in all, default 100000
	MaxTotalBytes     int64         `yaml:"max_total_bytes"`      // pending envelope bytes in all, default 256 MiB
	TTL               time.Duration `yaml:"ttl"`                  // a command not delivered by then ends as expired, default 1h
	Retention         time.Duration `yaml:"retention"`            // terminal entries are kept this long, default 24h
	MaxEnded          int           `yaml:"max_ended"`            // terminal entries kept at most (the oldest go first), default 100000
	// VerdictDelay is how long the verdict of a command nobody waits
	// for may wait for the outbox's next commit to ride on (default
	// 100ms): such a command costs one commit, not two. A waiter gets its
	// ack only once the verdict is durable, in every mode (its verdict is
	// committed at once). 0 is strict: every verdict is recorded by its
	// device's worker (a commit of its own, up to 8 verdicts of a deep
	// queue in one) before its entry ends.
	VerdictDelay *time.Duration `yaml:"verdict_delay"`
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
	// Auth is AuthRequired or AuthOff; empty means AuthRequired
	// (ApplyDefaults), which needs auth.key_file.
	Auth string `yaml:"auth,omitempty"`
	// Modbus is, instead of Serial or MQTTTopic, where a Modbus device is:
	// a bus of modbus.buses, its unit id there and its device profile.
	// Only on its home gateway.
	Modbus *DeviceModbusConfig `yaml:"modbus,omitempty"`
	// Labels are free key: value pairs a fan-out selects devices by
	// (`edgefence send --selector site=a`; labels.go): keys 1–63 of
	// [a-z0-9._-], values 1–63 of [A-Za-z0-9._-].
	Labels map[string]string `yaml:"labels,omitempty"`
}

// SerialConfig is a device's serial line (see transport/serial.PortConfig).
// Zero values mean transport/serial's defaults; ApplyDefaults fills them in.
type SerialConfig struct {
	Port        string        `yaml:"port"`         // e.g. /dev/ttyUSB0 or /dev/serial/by-id/...
	Baud        int           `yaml:"baud"`         // default 115200
	DataBits    int           `yaml:"data_bits"`    // default 8
	Parity      string        `yaml:"parity"`       // N (default), E or O
	StopBits    int           `yaml:"stop_bits"`    // 1 (default) or 2
	ReadTimeout time.Duration `yaml:"read_timeout"` // default 100ms; multiples of 100ms up to 25.5s
}

// ApplyDefaults sets every optional field left at its zero value to its
// default: this is the one list of them. Fields whose zero value is a
// setting of its own (credentials, TLS files, metrics.listen, the
// switches, a device's home and link) are left alone. It is idempotent,
// and changes no value that is set, valid or not, so Validate reports the
// same problems before and after it. LoadConfig and New call it; `config
// check` prints its result.
//
// A method on *Config rather than a WithDefaults() Config: the devices and
// their serial lines are a slice and pointers, which a returned copy would
// share with c (and change behind its back) unless it copied them deeply.
func (c *Config) ApplyDefaults() {
	orDefault(&c.StateDir, DefaultStateDir)
	orDefault(&c.Etcd.Prefix, DefaultEtcdPrefix)
	orDefault(&c.Etcd.DialTimeout, DefaultEtcdDialTimeout)
	orDefault(&c.Etcd.LeaseTTL, DefaultLeaseTTL)
	orDefault(&c.MQTT.Prefix, DefaultMQTTPrefix)
	if c.Gateway != "" {
		orDefault(&c.MQTT.ClientID, "edgefence-"+c.Gateway)
	}
	orDefault(&c.MQTT.KeepAlive, mqtt.DefaultKeepAlive)
	orDefault(&c.MQTT.SessionExpiry, mqtt.DefaultSessionExpiry)
	orDefault(&c.MQTT.ReconnectBackoffMax, DefaultMQTTReconnectBackoffMax)
	orDefault(&c.MQTT.MaxPacketSize, mqtt.DefaultMaxPacketSize)
	orDefault(&c.API.Socket, DefaultSocket)
	orDefault(&c.Command.Timeout, DefaultCommandTimeout)
	// The effective values, as the outbox applies them (offline.Options),
	// so that `config check` shows what runs.
	o := &c.Outbox
	orDefault(&o.MaxPerDevice, offline.DefaultMaxPerDevice)
	orDefault(&o.MaxBytesPerDevice, offline.DefaultMaxBytesPerDevice)
	orDefault(&o.MaxTotal, offline.DefaultMaxTotal)
	orDefault(&o.MaxTotalBytes, offline.DefaultMaxTotalBytes)
	orDefault(&o.TTL, offline.DefaultTTL)
	orDefault(&o.Retention, offline.DefaultRetention)
	orDefault(&o.MaxEnded, offline.DefaultMaxEnded)
	if o.VerdictDelay == nil {
		o.VerdictDelay = new(offline.DefaultVerdictDelay)
	}
	orDefault(&c.Log.Level, DefaultLogLevel)
	orDefault(&c.Log.Format, DefaultLogFormat)
	c.Jobs.applyDefaults(c.StateDir)
	for i := range c.Modbus.Buses {
		c.Modbus.Buses[i].applyDefaults()
	}
	for i := range c.Devices {
		d := &c.Devices[i]
		orDefault(&d.Fence, FenceDevice)
		orDefault(&d.Policy, PolicyStrict)
		orDefault(&d.Auth, AuthRequired) // secure by default: off only when said
		if d.Serial != nil {
			d.Serial.applyDefaults()
		}
	}
}

// applyDefaults fills in the effective values, as transport/serial applies
// them.
func (s *SerialConfig) applyDefaults() {
	orDefault(&s.Baud, serial.DefaultBaud)
	orDefault(&s.DataBits, serial.DefaultDataBits)
	orDefault(&s.Parity, serial.DefaultParity)
	orDefault(&s.StopBits, serial.DefaultStopBits)
	orDefault(&s.ReadTimeout, serial.DefaultReadTimeout)
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
// _FILE variants) and of auth files (systemd credentials named after their
// keys, e.g. auth.key_file) and then overrides, fills in the defaults
// (ApplyDefaults) and validates the result (Validate). Every
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

// ParseConfig decodes YAML config bytes, fills in the defaults and
// validates them (no environment overrides); errors are as LoadConfig's,
// without a file name.
func ParseConfig(b []byte) (*Config, error) {
	return parseConfig(b, "", nil, nil)
}

func parseConfig(b []byte, file string, lookup func(string) (string, bool), overrides []Override) (*Config, error) {
	var c Config
	d, fatal := decodeConfig(b, &c)
	if fatal != nil {
		return nil, withFile(file, fatal)
	}
	errs := d.errs
	if lookup != nil {
		errs = append(errs, c.applyEnv(lookup)...)
	}
	for _, o := range overrides {
		o.Apply(&c)
	}
	c.ApplyDefaults()
	if d.trusted {
		errs = append(errs, d.validate(c, overrides)...)
	}
	if lookup != nil && d.trusted && !related("modbus.profiles", d.typeKeys) {
		// Read from a file on the gateway: the device profiles must load,
		// from the config file's directory; a profile's problems name its
		// own file, line and key.
		c.Modbus.resolveProfiles(filepath.Dir(file))
		_, err := c.ModbusProfiles()
		errs = append(errs, d.lined(err)...)
	}
	if lookup != nil && len(errs) == 0 {
		// Read from a file on the gateway: the TLS files must load.
		errs = append(errs, d.loadTLS(c)...)
	}
	if len(errs) > 0 {
		return nil, withFile(file, errs)
	}
	return &c, nil
}

// parsed is what decoding a config file leaves to validate with: the lines
// of its keys and the problems found so far.
type parsed struct {
	lines    keyLines
	errs     []error
	trusted  bool     // false: the decoded config cannot be trusted; it is not validated
	typeKeys []string // keys whose values did not decode: not validated again
}

// decodeConfig decodes b into c, strictly: unknown keys and type errors
// are problems in d.errs. A document that is not a mapping of keys is
// fatal.
func decodeConfig(b []byte, c *Config) (d parsed, fatal []error) {
	d = parsed{lines: keyLines{}, trusted: true}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return d, yamlErrors(err, nil, true)
	}
	if len(doc.Content) == 0 {
		return d, nil
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return d, []error{&ConfigError{Line: root.Line, Msg: "not a config: want a mapping of keys (gateway:, etcd:, …)"}}
	}
	aliased := walkNode(root, reflect.TypeFor[Config](), "", d.lines, &d.errs)
	err := root.Decode(c)
	if err == nil {
		return d, nil
	}
	ye := yamlErrors(err, d.lines, false)
	if _, ok := errors.AsType[*yaml.TypeError](err); ok && !strings.Contains(err.Error(), "already defined at line") {
		// yaml/v3 has decoded everything else, so the rest is validated
		// too: every problem in one pass. A type error met through an
		// alias is reported at the anchor's line, so keys holding aliases
		// are left out too.
		for _, ce := range ConfigErrors(errors.Join(ye...)) {
			d.typeKeys = append(d.typeKeys, ce.Key)
		}
		d.typeKeys = append(d.typeKeys, aliased...)
	} else {
		// Any other error — a key given twice, which makes yaml/v3 skip
		// its whole mapping, too — leaves nothing to trust.
		d.trusted = false
		if ce := aliasBomb(root, d.lines); ce != nil && strings.Contains(err.Error(), "excessive aliasing") {
			ye = []error{ce} // the same problem, with its key and line
		}
	}
	d.errs = append(d.errs, ye...)
	return d, nil
}

// validate returns c's Validate problems with their lines, or with the
// flag that set their key; those about a key whose value did not decode
// are left out.
func (d parsed) validate(c Config, overrides []Override) []error {
	var errs []error
	for _, ce := range ConfigErrors(c.Validate()) {
		if related(ce.Key, d.typeKeys) {
			continue // the zero value the type error left behind
		}
		for _, o := range overrides {
			if ce.Key == o.Key || strings.HasPrefix(ce.Key, o.Key+".") || strings.HasPrefix(ce.Key, o.Key+"[") {
				ce.Key, ce.Line = o.Flag, -1
			}
		}
		if ce.Line == 0 {
			ce.Line = d.lines.line(ce.Key)
		}
		errs = append(errs, ce)
	}
	return errs
}

// lined returns the ConfigErrors of err, those of the config (no file of
// their own) with their lines.
func (d parsed) lined(err error) []error {
	var errs []error
	for _, ce := range ConfigErrors(err) {
		if ce.File == "" {
			ce.Line = d.lines.line(ce.Key)
		}
		errs = append(errs, ce)
	}
	return errs
}

// loadTLS loads c's TLS files and returns their problems, with lines.
func (d parsed) loadTLS(c Config) []error {
	var errs []error
	for _, t := range []struct {
		key string
		cfg TLSConfig
	}{{"etcd.tls", c.Etcd.TLS}, {"mqtt.tls", c.MQTT.TLS}} {
		if _, err := t.cfg.Load(t.key); err != nil {
			for _, ce := range ConfigErrors(err) {
				ce.Line = d.lines.line(ce.Key)
				errs = append(errs, ce)
			}
		}
	}
	return errs
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

// withFile sets the file of errs (not of flag errors, Line -1, nor of
// those in another file, a device profile's), orders them by line, those
// of other files last, and joins them.
func withFile(file string, errs []error) error {
	sort.SliceStable(errs, func(i, j int) bool {
		fi, li := lineOf(errs[i])
		fj, lj := lineOf(errs[j])
		return fi < fj || fi == 0 && fj == 0 && li < lj // another file's keep their order
	})
	for _, e := range errs {
		if ce, ok := e.(*ConfigError); ok {
			if ce.Line < 0 {
				ce.Line = 0
				continue
			}
			if ce.File == "" {
				ce.File = file
			}
			if file != "" && ce.Key == "auth.key_file" {
				// The fix for this very file, ready to paste.
				ce.Msg = strings.ReplaceAll(ce.Msg, KeysInitCommand, strings.TrimSuffix(KeysInitCommand, "FILE")+file)
			}
		}
	}
	return errors.Join(errs...)
}

// lineOf returns where err is: its line, and whether it is in a file of
// its own (1) or in the config (0).
func lineOf(err error) (otherFile, line int) {
	if ce, ok := err.(*ConfigError); ok {
		if ce.File != "" {
			otherFile = 1
		}
		return otherFile, ce.Line
	}
	return 0, 0
}

// orDefault sets *v to def if it is the zero value.
func orDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}
