package agent

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/edgefence/edgefence/agent/jobs"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/transport/mqtt"
	"github.com/edgefence/edgefence/transport/serial"
)

// Validate checks every key of c (configRules) and reports every problem,
// joined: each a *ConfigError naming the dotted key (no line: see
// LoadConfig), wrapping ErrConfig. It reads c as given and changes
// nothing: a zero value that means a default is valid, so Validate reports
// the same before and after ApplyDefaults.
func (c Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, &ConfigError{Key: key, Msg: fmt.Sprintf(format, args...)})
	}
	for _, r := range configRules {
		r.check(&c, bad)
	}
	return errors.Join(errs...)
}

// badFunc reports one problem: the dotted key and what is wrong with it.
type badFunc = func(key, format string, args ...any)

// configRule checks one key of a Config: the key itself, each item of a
// list, or the keys under a section checked together (a client's
// credentials). Rules read the config as given: a zero value that means a
// default passes, whatever the default (ApplyDefaults).
type configRule struct {
	key   string // the dotted key; its problems are reported under it
	check func(c *Config, bad badFunc)
}

// configRules are Validate's checks, in the order of Config's keys (so of
// the problems it reports): adding a key is adding its rule here, and its
// default to ApplyDefaults. Keys with neither (state_dir, api.socket,
// mqtt.client_id, the switches) take any value.
var configRules = []configRule{
	scalar("gateway", func(c *Config) string { return idProblem(c.Gateway) }),
	{"etcd.endpoints", func(c *Config, bad badFunc) {
		checkURLs(bad, "etcd.endpoints", c.Etcd.Endpoints, "at least one endpoint required", "http", "https")
	}},
	scalar("etcd.prefix", func(c *Config) string {
		if p := c.Etcd.Prefix; p != "" && (!strings.HasPrefix(p, "/") || strings.HasSuffix(p, "/")) {
			return fmt.Sprintf("%q must start with / and not end with /", p)
		}
		return ""
	}),
	notNegative("etcd.dial_timeout", "must be positive", func(c *Config) time.Duration { return c.Etcd.DialTimeout }),
	scalar("etcd.lease_ttl", func(c *Config) string {
		switch ttl := c.Etcd.LeaseTTL; {
		case ttl == 0:
		case ttl < MinLeaseTTL:
			return fmt.Sprintf("%v is below the minimum %v", ttl, MinLeaseTTL)
		case ttl%time.Second != 0:
			return fmt.Sprintf("%v: etcd leases are whole seconds", ttl)
		}
		return ""
	}),
	{"etcd", func(c *Config, bad badFunc) {
		checkCredentials(bad, "etcd", c.Etcd.Username, c.Etcd.Password, c.Etcd.TLS)
	}},
	{"mqtt.brokers", func(c *Config, bad badFunc) {
		checkURLs(bad, "mqtt.brokers", c.MQTT.Brokers, "at least one broker URL required", "mqtt", "tcp", "mqtts", "ssl", "tls", "tcps")
	}},
	scalar("mqtt.prefix", func(c *Config) string {
		if p := c.MQTT.Prefix; strings.ContainsAny(p, "+#") || strings.HasPrefix(p, "/") || strings.HasSuffix(p, "/") {
			return fmt.Sprintf("%q: no wildcards, no leading or trailing /", p)
		}
		return ""
	}),
	scalar("mqtt.keep_alive", func(c *Config) string {
		if k := c.MQTT.KeepAlive; k != 0 && k < time.Second {
			return fmt.Sprintf("%v: must be at least 1s", k)
		}
		return ""
	}),
	notNegative("mqtt.session_expiry", "must not be negative", func(c *Config) time.Duration { return c.MQTT.SessionExpiry }),
	scalar("mqtt.reconnect_backoff_max", func(c *Config) string {
		if rb := c.MQTT.ReconnectBackoffMax; rb != 0 && rb < mqtt.DefaultMinBackoff {
			return fmt.Sprintf("%v is below the first retry's delay %v", rb, mqtt.DefaultMinBackoff)
		}
		return ""
	}),
	scalar("mqtt.max_packet_size", func(c *Config) string {
		if n := c.MQTT.MaxPacketSize; n != 0 && (n < mqtt.LargestPacket || n > MaxMQTTPacketSize) {
			return fmt.Sprintf("%d bytes: want %d (the largest legitimate packet) to %d (16 MiB)", n, mqtt.LargestPacket, MaxMQTTPacketSize)
		}
		return ""
	}),
	{"mqtt", func(c *Config, bad badFunc) {
		checkCredentials(bad, "mqtt", c.MQTT.Username, c.MQTT.Password, c.MQTT.TLS)
	}},
	scalar("metrics.listen", func(c *Config) string {
		if l := c.Metrics.Listen; l != "" {
			if err := checkListen(l); err != nil {
				return fmt.Sprintf("%v (e.g. 127.0.0.1:9464)", err)
			}
		}
		return ""
	}),
	scalar("metrics.pprof", func(c *Config) string {
		if c.Metrics.Pprof && !pprofBuild {
			return "this build has no profiler: build the agent with -tags edgefence_pprof (a profiling build) or set it false"
		}
		return ""
	}),
	notNegative("command.timeout", "must be positive", func(c *Config) time.Duration { return c.Command.Timeout }),
	notNegative("outbox.max_per_device", "must not be negative", func(c *Config) int { return c.Outbox.MaxPerDevice }),
	notNegative("outbox.max_bytes_per_device", "must not be negative", func(c *Config) int64 { return c.Outbox.MaxBytesPerDevice }),
	notNegative("outbox.max_total", "must not be negative", func(c *Config) int { return c.Outbox.MaxTotal }),
	notNegative("outbox.max_total_bytes", "must not be negative", func(c *Config) int64 { return c.Outbox.MaxTotalBytes }),
	notNegative("outbox.ttl", "must not be negative", func(c *Config) time.Duration { return c.Outbox.TTL }),
	notNegative("outbox.retention", "must not be negative", func(c *Config) time.Duration { return c.Outbox.Retention }),
	notNegative("outbox.max_ended", "must not be negative", func(c *Config) int { return c.Outbox.MaxEnded }),
	notNegative("outbox.verdict_delay", "must not be negative (0 is strict)", func(c *Config) time.Duration {
		if c.Outbox.VerdictDelay == nil {
			return 0
		}
		return *c.Outbox.VerdictDelay
	}),
	notNegative("jobs.cache_max_bytes", "must not be negative", func(c *Config) int64 { return c.Jobs.CacheMaxBytes }),
	notNegative("jobs.fetch_timeout", "must not be negative", func(c *Config) time.Duration { return c.Jobs.FetchTimeout }),
	scalar("jobs.window", func(c *Config) string {
		if w := c.Jobs.Window; w < 0 || w > jobs.MaxWindow {
			return fmt.Sprintf("%d: want 1 to %d chunks in flight", w, jobs.MaxWindow)
		}
		return ""
	}),
	scalar("log.level", func(c *Config) string {
		return notOneOf(c.Log.Level, "debug, info, warn or error", "debug", "info", "warn", "error")
	}),
	scalar("log.format", func(c *Config) string {
		return notOneOf(c.Log.Format, "auto, json or text", "auto", "json", "text")
	}),
	scalar("auth.key_file", unsignedDevices),
	scalar("auth.key_id", func(c *Config) string {
		switch a := c.Auth; {
		case (a.KeyFile == "") != (a.KeyID == ""):
			return "auth.key_file and auth.key_id go together"
		case len(a.KeyID) > 64:
			return fmt.Sprintf("%d bytes: at most 64", len(a.KeyID))
		}
		return ""
	}),
	scalar("auth.certificate", func(c *Config) string {
		if a := c.Auth; a.Certificate != "" && a.KeyFile == "" {
			return "a certificate is for the gateway's signing key: set auth.key_file and auth.key_id too"
		}
		return ""
	}),
	scalar("auth.trust_root_kid", func(c *Config) string {
		switch a := c.Auth; {
		case (a.TrustRoot == "") != (a.TrustRootKID == ""):
			return "auth.trust_root and auth.trust_root_kid go together"
		case len(a.TrustRootKID) > 64:
			return fmt.Sprintf("%d bytes: at most 64", len(a.TrustRootKID))
		}
		return ""
	}),
	{"modbus.profiles", checkModbusProfiles},
	{"modbus.buses", checkModbusBuses},
	{"devices", checkDevices},
}

// KeysInitCommand is the command that gives a gateway its signing key
// and the config its auth: block: what a config refused for a device
// without one names.
const KeysInitCommand = "edgefence keys init --config FILE"

// unsignedDevices is the rule of secure by default: every device is
// signed (auth: required, the default) unless its config says auth: off,
// and a signed device needs the gateway's signing key. One problem for
// all of them, naming the first few.
func unsignedDevices(c *Config) string {
	if c.Auth.KeyFile != "" {
		return ""
	}
	var ids []string
	for _, d := range c.Devices {
		if d.Auth == "" || d.Auth == AuthRequired {
			ids = append(ids, d.ID)
		}
	}
	if len(ids) == 0 {
		return ""
	}
	names := strings.Join(ids[:min(len(ids), 3)], ", ")
	if len(ids) > 3 {
		names += fmt.Sprintf(" and %d more", len(ids)-3)
	}
	return fmt.Sprintf("not set, but %s must be signed (every device is, unless it says auth: off): "+
		"run `%s` to make this gateway's keys and auth: block, or say auth: off on each device to leave unsigned", names, KeysInitCommand)
}

// scalar is the rule for a key with one value: check returns its problem,
// or "".
func scalar(key string, check func(c *Config) string) configRule {
	return configRule{key, func(c *Config, bad badFunc) {
		if p := check(c); p != "" {
			bad(key, "%s", p)
		}
	}}
}

// notNegative is the rule for a number whose zero means its default: a
// negative one is reported with msg.
func notNegative[T int | int64 | time.Duration](key, msg string, get func(c *Config) T) configRule {
	return scalar(key, func(c *Config) string {
		if get(c) < 0 {
			return msg
		}
		return ""
	})
}

// notOneOf says what is wrong with v, a value whose empty value means its
// default, unless it is one of valid (as listed in want), or returns "".
func notOneOf(v, want string, valid ...string) string {
	for _, ok := range valid {
		if v == ok {
			return ""
		}
	}
	if v == "" {
		return ""
	}
	return fmt.Sprintf("%q: want %s", v, want)
}

// deviceRule checks one key of every device: devices[i].<key>, or for the
// link rule (key "") the keys that say how the device is reached.
type deviceRule struct {
	key   string
	check func(v deviceCheck, bad badFunc)
}

// deviceCheck is a device rule's input: the device, its index and key
// (devices[3]), whether an earlier device has its id, and the config it
// is in.
type deviceCheck struct {
	c   *Config
	d   *DeviceConfig
	i   int
	key string
	dup bool
}

// deviceRules are checked for each device in turn, in this order.
var deviceRules = []deviceRule{
	{"id", func(v deviceCheck, bad badFunc) {
		if p := idProblem(v.d.ID); p != "" {
			bad(v.key+".id", "%s", p)
		} else if v.dup {
			bad(v.key+".id", "%q listed twice", v.d.ID)
		}
	}},
	{"fence", func(v deviceCheck, bad badFunc) {
		if p := notOneOf(v.d.Fence, fmt.Sprintf("%q or %q", FenceDevice, FenceGateway), FenceDevice, FenceGateway); p != "" {
			bad(v.key+".fence", "%s", p)
		}
	}},
	{"home", func(v deviceCheck, bad badFunc) {
		if p := idProblem(v.d.Home); v.d.Home != "" && p != "" {
			bad(v.key+".home", "%s", p)
		}
	}},
	{"", checkLink},
	{"modbus", checkDeviceModbus},
	{"policy", func(v deviceCheck, bad badFunc) {
		if p := notOneOf(v.d.Policy, fmt.Sprintf("%q or %q", PolicyStrict, PolicyAutonomous), PolicyStrict, PolicyAutonomous); p != "" {
			bad(v.key+".policy", "%s", p)
		}
	}},
	{"auth", func(v deviceCheck, bad badFunc) {
		if p := notOneOf(v.d.Auth, fmt.Sprintf("%q or %q", AuthRequired, AuthOff), AuthRequired, AuthOff); p != "" {
			bad(v.key+".auth", "%s", p)
		} else if cmp.Or(v.d.Auth, AuthRequired) == AuthRequired && v.d.Fence == FenceGateway && v.d.Home == v.c.Gateway &&
			v.c.Auth.KeyFile != "" && v.c.Auth.TrustRoot == "" { // without a key, unsignedDevices names the fix
			bad(v.key+".auth", "required at its home gateway: the fence table verifies against the operator's root: set auth.trust_root and auth.trust_root_kid, or say auth: off")
		}
	}},
	{"labels", checkLabels},
	{"reissue_kinds", func(v deviceCheck, bad badFunc) {
		for j, k := range v.d.ReissueKinds {
			if k == "" || len(k) > fence.MaxKindLen {
				bad(fmt.Sprintf("%s.reissue_kinds[%d]", v.key, j), "%q is not a command kind", k)
			}
		}
	}},
}

// checkDevices is the rule of the devices key: at least one, each checked
// by deviceRules in turn.
func checkDevices(c *Config, bad badFunc) {
	if len(c.Devices) == 0 {
		bad("devices", "at least one device required")
	}
	seen := make(map[string]bool, len(c.Devices))
	for i := range c.Devices {
		d := &c.Devices[i]
		v := deviceCheck{c: c, d: d, i: i, key: fmt.Sprintf("devices[%d]", i), dup: seen[d.ID]}
		seen[d.ID] = true
		for _, r := range deviceRules {
			r.check(v, bad)
		}
	}
}

// checkLink checks how a device is reached: a `fence: device` device
// through its shim, over MQTT; a `fence: gateway` device through its home
// gateway, which alone has its link (a serial line, a plain MQTT topic or
// a Modbus bus). One problem at most: the first of these that applies.
func checkLink(v deviceCheck, bad badFunc) {
	d, f, gw := v.d, v.key, v.c.Gateway
	kind := cmp.Or(d.Fence, FenceDevice)
	link := d.Serial != nil || d.MQTTTopic != "" || d.Modbus != nil
	switch {
	case kind == FenceDevice && (d.Home != "" || link):
		bad(f+".home", "home, serial, mqtt_topic and modbus are for `fence: gateway` devices")
	case kind == FenceGateway && d.Home == "":
		bad(f+".home", "a `fence: gateway` device needs its home gateway")
	case kind == FenceGateway && d.Home == gw && !link:
		bad(f+".serial", "this gateway is %q's home: give its serial port, its mqtt_topic or its modbus bus", d.ID)
	case d.Serial != nil && d.MQTTTopic != "":
		bad(f+".mqtt_topic", "a device is on serial or on mqtt_topic, not both")
	case d.Modbus != nil && (d.Serial != nil || d.MQTTTopic != ""):
		bad(f+".modbus", "a device is on modbus, serial or mqtt_topic: one of them")
	case kind == FenceGateway && d.Home != gw && link:
		bad(f+".serial", "only the home gateway %q reaches %q's link (serial, mqtt_topic or modbus)", d.Home, d.ID)
	case strings.ContainsAny(d.MQTTTopic, "+#") || strings.HasPrefix(d.MQTTTopic, cmp.Or(v.c.MQTT.Prefix, DefaultMQTTPrefix)+"/"):
		bad(f+".mqtt_topic", "%q: no wildcards, and not under mqtt.prefix", d.MQTTTopic)
	case d.Serial != nil && d.Serial.Port == "":
		bad(f+".serial.port", "required")
	case d.Serial != nil:
		checkSerial(*d.Serial, f+".serial", bad)
	}
}

// serialFields maps transport/serial.PortConfig's field names to keys.
var serialFields = map[string]string{"Path": "port", "Baud": "baud", "DataBits": "data_bits", "Parity": "parity", "StopBits": "stop_bits", "ReadTimeout": "read_timeout"}

// checkSerial checks a serial line's settings, with their defaults, as
// transport/serial does, and reports a problem under the key it is about.
func checkSerial(s SerialConfig, key string, bad badFunc) {
	s.applyDefaults() // a copy: the config is not changed
	checkPort(serial.PortConfig{Path: s.Port, Baud: s.Baud, DataBits: s.DataBits, Parity: s.Parity, StopBits: s.StopBits, ReadTimeout: s.ReadTimeout}, key, bad)
}

// checkPort checks a serial line as transport/serial opens it, and
// reports a problem under the key (below key) it is about.
func checkPort(pc serial.PortConfig, key string, bad badFunc) {
	if err := pc.Validate(); err != nil {
		msg := strings.TrimPrefix(strings.TrimPrefix(err.Error(), serial.ErrInvalidConfig.Error()), ": ")
		if name, _, _ := strings.Cut(msg, " "); serialFields[name] != "" {
			key += "." + serialFields[name]
		}
		bad(key, "%s", msg)
	}
}

// checkURLs checks a list of URLs: at least one (else the problem none),
// each with one of schemes.
func checkURLs(bad badFunc, key string, urls []string, none string, schemes ...string) {
	if len(urls) == 0 {
		bad(key, "%s", none)
	}
	for i, u := range urls {
		if err := checkURL(u, schemes...); err != nil {
			bad(fmt.Sprintf("%s[%d]", key, i), "%v", err)
		}
	}
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

// checkCredentials checks a client's user, password and TLS files.
func checkCredentials(bad badFunc, key, user string, pass Secret, t TLSConfig) {
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
func checkListen(s string) error { return checkHostPort(s, false) }

// checkHostPort checks a host:port: a numeric port in 1-65535 and a host
// that is an IP address or a name, or empty unless needHost (to connect to).
func checkHostPort(s string, needHost bool) error {
	host, port, err := net.SplitHostPort(s)
	if err != nil || needHost && host == "" {
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
