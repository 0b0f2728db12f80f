package agent

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgefence/edgefence/transport/mqtt"
)

// ruleBase is a valid config as written: nothing beyond the required keys
// (and its one device unsigned, which needs saying), no defaults filled in.
func ruleBase() Config {
	return Config{
		Gateway: "gw-a",
		Etcd:    EtcdConfig{Endpoints: []string{"http://127.0.0.1:2379"}},
		MQTT:    MQTTConfig{Brokers: []string{"mqtt://127.0.0.1:1883"}},
		Devices: []DeviceConfig{{ID: "dev-1", Auth: AuthOff}},
	}
}

// ruleCase edits ruleBase; key and msg are the one problem Validate must
// report, or "" for a valid config.
type ruleCase struct {
	name     string
	edit     func(c *Config)
	key, msg string
}

// homeDevice makes devices[0] a `fence: gateway` device on this gateway.
func homeDevice(c *Config) *DeviceConfig {
	d := &c.Devices[0]
	d.Fence, d.Home = FenceGateway, c.Gateway
	return d
}

// modbusDevice makes devices[0] a Modbus device of this gateway on bus
// rs485, and the bus.
func modbusDevice(c *Config) *DeviceModbusConfig {
	c.Modbus.Buses = []ModbusBusConfig{{Name: "rs485", RTU: &ModbusRTUConfig{Port: "/dev/ttyUSB1"}}}
	homeDevice(c).Modbus = &DeviceModbusConfig{Bus: "rs485", Unit: 7, Profile: "acme-em100"}
	return c.Devices[0].Modbus
}

func intp(n int) *int { return &n }

// ruleCases holds, for every rule of configRules and deviceRules, valid
// values and each way a value can be invalid.
var ruleCases = []ruleCase{
	{"base", func(c *Config) {}, "", ""},
	{"gateway with every id character", func(c *Config) { c.Gateway = "Gw.1_x-Y" }, "", ""},
	{"no gateway", func(c *Config) { c.Gateway = "" }, "gateway", "required"},
	{"gateway with a space", func(c *Config) { c.Gateway = "gw a" }, "gateway", `"gw a": may contain only`},
	{"https endpoint", func(c *Config) { c.Etcd.Endpoints = []string{"https://e:2379", "http://f:2379"} }, "", ""},
	{"no endpoint", func(c *Config) { c.Etcd.Endpoints = nil }, "etcd.endpoints", "at least one endpoint required"},
	{"endpoint scheme", func(c *Config) { c.Etcd.Endpoints = []string{"http://e:1", "ftp://x"} }, "etcd.endpoints[1]", `"ftp://x": scheme must be one of http, https`},
	{"endpoint without host", func(c *Config) { c.Etcd.Endpoints = []string{"http://"} }, "etcd.endpoints[0]", "has no host"},
	{"endpoint with a password", func(c *Config) { c.Etcd.Endpoints = []string{"http://u:pw@e:1"} }, "etcd.endpoints[0]", "no credentials in URLs"},
	{"etcd prefix", func(c *Config) { c.Etcd.Prefix = "/site/a" }, "", ""},
	{"etcd prefix relative", func(c *Config) { c.Etcd.Prefix = "site" }, "etcd.prefix", `"site" must start with /`},
	{"etcd prefix with a trailing /", func(c *Config) { c.Etcd.Prefix = "/site/" }, "etcd.prefix", "and not end with /"},
	{"dial timeout", func(c *Config) { c.Etcd.DialTimeout = time.Second }, "", ""},
	{"dial timeout negative", func(c *Config) { c.Etcd.DialTimeout = -time.Second }, "etcd.dial_timeout", "must be positive"},
	{"lease ttl minimum", func(c *Config) { c.Etcd.LeaseTTL = MinLeaseTTL }, "", ""},
	{"lease ttl below minimum", func(c *Config) { c.Etcd.LeaseTTL = time.Second }, "etcd.lease_ttl", "1s is below the minimum 2s"},
	{"lease ttl negative", func(c *Config) { c.Etcd.LeaseTTL = -3 * time.Second }, "etcd.lease_ttl", "-3s is below the minimum 2s"},
	{"lease ttl fraction", func(c *Config) { c.Etcd.LeaseTTL = 2500 * time.Millisecond }, "etcd.lease_ttl", "2.5s: etcd leases are whole seconds"},
	{"etcd user and password", func(c *Config) { c.Etcd.Username, c.Etcd.Password = "root", NewSecret("pw") }, "", ""},
	{"etcd password without user", func(c *Config) { c.Etcd.Password = NewSecret("pw") }, "etcd.username", "required with a password"},
	{"etcd placeholder password", func(c *Config) { c.Etcd.Username, c.Etcd.Password = "root", NewSecret("<redacted>") }, "etcd.password", "redacted placeholder"},
	{"etcd mutual tls", func(c *Config) { c.Etcd.TLS = TLSConfig{CertFile: "/c.pem", KeyFile: "/k.pem"} }, "", ""},
	{"etcd cert without key", func(c *Config) { c.Etcd.TLS.CertFile = "/c.pem" }, "etcd.tls.cert_file", "cert_file and key_file go together"},
	{"brokers of every scheme", func(c *Config) {
		c.MQTT.Brokers = []string{"mqtt://a", "tcp://a", "mqtts://a", "ssl://a", "tls://a", "tcps://a"}
	}, "", ""},
	{"no broker", func(c *Config) { c.MQTT.Brokers = nil }, "mqtt.brokers", "at least one broker URL required"},
	{"broker scheme", func(c *Config) { c.MQTT.Brokers = []string{"http://a"} }, "mqtt.brokers[0]", "scheme must be one of mqtt, tcp"},
	{"mqtt prefix", func(c *Config) { c.MQTT.Prefix = "site/a" }, "", ""},
	{"mqtt prefix wildcard", func(c *Config) { c.MQTT.Prefix = "a/#" }, "mqtt.prefix", `"a/#": no wildcards`},
	{"mqtt prefix leading /", func(c *Config) { c.MQTT.Prefix = "/a" }, "mqtt.prefix", "no leading or trailing /"},
	{"keep alive 1s", func(c *Config) { c.MQTT.KeepAlive = time.Second }, "", ""},
	{"keep alive below 1s", func(c *Config) { c.MQTT.KeepAlive = 500 * time.Millisecond }, "mqtt.keep_alive", "500ms: must be at least 1s"},
	{"keep alive negative", func(c *Config) { c.MQTT.KeepAlive = -time.Second }, "mqtt.keep_alive", "-1s: must be at least 1s"},
	{"session expiry", func(c *Config) { c.MQTT.SessionExpiry = time.Hour }, "", ""},
	{"session expiry negative", func(c *Config) { c.MQTT.SessionExpiry = -time.Second }, "mqtt.session_expiry", "must not be negative"},
	{"reconnect backoff at the first delay", func(c *Config) { c.MQTT.ReconnectBackoffMax = 250 * time.Millisecond }, "", ""},
	{"reconnect backoff below the first delay", func(c *Config) { c.MQTT.ReconnectBackoffMax = 100 * time.Millisecond }, "mqtt.reconnect_backoff_max", "100ms is below the first retry's delay 250ms"},
	{"reconnect backoff negative", func(c *Config) { c.MQTT.ReconnectBackoffMax = -time.Second }, "mqtt.reconnect_backoff_max", "-1s is below"},
	{"max packet size at the floor", func(c *Config) { c.MQTT.MaxPacketSize = mqtt.LargestPacket }, "", ""},
	{"max packet size at the ceiling", func(c *Config) { c.MQTT.MaxPacketSize = MaxMQTTPacketSize }, "", ""},
	{"max packet size below the largest packet", func(c *Config) { c.MQTT.MaxPacketSize = 64 << 10 }, "mqtt.max_packet_size", "65536 bytes: want 68608 (the largest legitimate packet) to 16777216 (16 MiB)"},
	{"max packet size above 16 MiB", func(c *Config) { c.MQTT.MaxPacketSize = MaxMQTTPacketSize + 1 }, "mqtt.max_packet_size", "16777217 bytes: want"},
	{"max packet size negative", func(c *Config) { c.MQTT.MaxPacketSize = -1 }, "mqtt.max_packet_size", "-1 bytes: want"},
	{"mqtt password without user", func(c *Config) { c.MQTT.Password = NewSecret("pw") }, "mqtt.username", "required with a password"},
	{"mqtt key without cert", func(c *Config) { c.MQTT.TLS.KeyFile = "/k.pem" }, "mqtt.tls.cert_file", "go together"},
	{"signing key and trust root", func(c *Config) {
		c.Auth = AuthConfig{KeyFile: "/k", KeyID: "gw/1", Certificate: "/c", TrustRoot: "/r.pub", TrustRootKID: "root/1"}
	}, "", ""},
	{"trust root without kid", func(c *Config) { c.Auth.TrustRoot = "/r.pub" }, "auth.trust_root_kid", "go together"},
	{"certificate without key", func(c *Config) { c.Auth.Certificate = "/c" }, "auth.certificate", "set auth.key_file"},
	{"device auth off", func(c *Config) { c.Devices[0].Auth = AuthOff }, "", ""},
	// Secure by default: a device that does not say auth: off is signed,
	// and needs the gateway's key; the problem names the fix.
	{"device auth default without a key", func(c *Config) { c.Devices[0].Auth = "" }, "auth.key_file",
		"not set, but dev-1 must be signed (every device is, unless it says auth: off): run `edgefence keys init --config FILE`"},
	{"device auth required without a key", func(c *Config) { c.Devices[0].Auth = AuthRequired }, "auth.key_file", "say auth: off on each device"},
	{"many devices without a key", func(c *Config) {
		c.Devices = []DeviceConfig{{ID: "a"}, {ID: "b", Auth: AuthOff}, {ID: "c", Auth: AuthRequired}, {ID: "d"}, {ID: "e"}, {ID: "f"}}
	}, "auth.key_file", "but a, c, d and 2 more must be signed"},
	{"device auth default with a key", func(c *Config) {
		c.Devices[0].Auth, c.Auth = "", AuthConfig{KeyFile: "/k", KeyID: "gw/1"}
	}, "", ""},
	{"gateway device required at home without a trust root", func(c *Config) {
		c.Auth = AuthConfig{KeyFile: "/k", KeyID: "gw/1"}
		c.Devices[0] = DeviceConfig{ID: "plc-1", Fence: FenceGateway, Home: c.Gateway, Auth: AuthRequired, MQTTTopic: "plc/1"}
	}, "devices[0].auth", "set auth.trust_root"},
	{"gateway device required at home with a trust root", func(c *Config) {
		c.Auth = AuthConfig{KeyFile: "/k", KeyID: "gw/1", TrustRoot: "/r.pub", TrustRootKID: "root/1"}
		c.Devices[0] = DeviceConfig{ID: "plc-1", Fence: FenceGateway, Home: c.Gateway, Auth: AuthRequired, MQTTTopic: "plc/1"}
	}, "", ""},
	{"device auth unknown", func(c *Config) { c.Devices[0].Auth = "maybe" }, "devices[0].auth", `"maybe": want "required" or "off"`},
	{"metrics on localhost", func(c *Config) { c.Metrics.Listen = "127.0.0.1:9464" }, "", ""},
	{"metrics on every interface", func(c *Config) { c.Metrics.Listen = ":9464" }, "", ""},
	{"metrics without a port", func(c *Config) { c.Metrics.Listen = "9464" }, "metrics.listen", `"9464": want host:port (e.g. 127.0.0.1:9464)`},
	{"metrics port 0", func(c *Config) { c.Metrics.Listen = ":0" }, "metrics.listen", "port must be a number in 1-65535"},
	{"metrics bad host", func(c *Config) { c.Metrics.Listen = "a b:1" }, "metrics.listen", "bad host"},
	{"command timeout", func(c *Config) { c.Command.Timeout = 3 * time.Second }, "", ""},
	{"command timeout negative", func(c *Config) { c.Command.Timeout = -time.Second }, "command.timeout", "must be positive"},
	{"outbox limits", func(c *Config) { c.Outbox = OutboxConfig{1, 2, 3, 4, time.Minute, time.Hour, 5, new(time.Second)} }, "", ""},
	{"outbox verdict_delay strict", func(c *Config) { c.Outbox.VerdictDelay = new(time.Duration(0)) }, "", ""},
	{"outbox verdict_delay negative", func(c *Config) { c.Outbox.VerdictDelay = new(-time.Second) }, "outbox.verdict_delay", "must not be negative (0 is strict)"},
	{"outbox max_per_device negative", func(c *Config) { c.Outbox.MaxPerDevice = -1 }, "outbox.max_per_device", "must not be negative"},
	{"outbox max_bytes_per_device negative", func(c *Config) { c.Outbox.MaxBytesPerDevice = -1 }, "outbox.max_bytes_per_device", "must not be negative"},
	{"outbox max_total negative", func(c *Config) { c.Outbox.MaxTotal = -1 }, "outbox.max_total", "must not be negative"},
	{"outbox max_total_bytes negative", func(c *Config) { c.Outbox.MaxTotalBytes = -1 }, "outbox.max_total_bytes", "must not be negative"},
	{"outbox ttl negative", func(c *Config) { c.Outbox.TTL = -time.Second }, "outbox.ttl", "must not be negative"},
	{"outbox retention negative", func(c *Config) { c.Outbox.Retention = -time.Second }, "outbox.retention", "must not be negative"},
	{"outbox max_ended negative", func(c *Config) { c.Outbox.MaxEnded = -1 }, "outbox.max_ended", "must not be negative"},
	{"jobs window", func(c *Config) { c.Jobs.Window = 32 }, "", ""},
	{"jobs window too big", func(c *Config) { c.Jobs.Window = 33 }, "jobs.window", "33: want 1 to 32 chunks in flight"},
	{"jobs window negative", func(c *Config) { c.Jobs.Window = -1 }, "jobs.window", "-1: want 1 to 32 chunks in flight"},
	{"log level and format", func(c *Config) { c.Log = LogConfig{Level: "debug", Format: "json"} }, "", ""},
	{"log level", func(c *Config) { c.Log.Level = "loud" }, "log.level", `"loud": want debug, info, warn or error`},
	{"log format", func(c *Config) { c.Log.Format = "xml" }, "log.format", `"xml": want auto, json or text`},
	{"no device", func(c *Config) { c.Devices = nil }, "devices", "at least one device required"},
	{"device without id", func(c *Config) { c.Devices[0].ID = "" }, "devices[0].id", "required"},
	{"device id with a /", func(c *Config) { c.Devices[0].ID = "a/b" }, "devices[0].id", `"a/b": may contain only`},
	{"device id too long", func(c *Config) { c.Devices[0].ID = strings.Repeat("d", 129) }, "devices[0].id", "is 129 characters"},
	{"device listed twice", func(c *Config) { c.Devices = append(c.Devices, DeviceConfig{ID: "dev-1", Auth: AuthOff}) }, "devices[1].id", `"dev-1" listed twice`},
	{"device fence", func(c *Config) { c.Devices[0].Fence = FenceDevice }, "", ""},
	{"device fence kind", func(c *Config) { c.Devices[0].Fence = "magic" }, "devices[0].fence", `"magic": want "device" or "gateway"`},
	{"gateway device elsewhere", func(c *Config) { c.Devices[0].Fence, c.Devices[0].Home = FenceGateway, "gw-b" }, "", ""},
	{"home id", func(c *Config) { c.Devices[0].Fence, c.Devices[0].Home = FenceGateway, "gw/b" }, "devices[0].home", `"gw/b": may contain only`},
	{"home of a device fence", func(c *Config) { c.Devices[0].Home = "gw-a" }, "devices[0].home", "are for `fence: gateway` devices"},
	{"topic of a device fence", func(c *Config) { c.Devices[0].MQTTTopic = "site/d" }, "devices[0].home", "are for `fence: gateway` devices"},
	{"gateway fence without home", func(c *Config) { c.Devices[0].Fence = FenceGateway }, "devices[0].home", "needs its home gateway"},
	{"home without a link", func(c *Config) { homeDevice(c) }, "devices[0].serial", `this gateway is "dev-1"'s home`},
	{"home with a serial line", func(c *Config) { homeDevice(c).Serial = &SerialConfig{Port: "/dev/ttyUSB0"} }, "", ""},
	{"home with a topic", func(c *Config) { homeDevice(c).MQTTTopic = "site/meter" }, "", ""},
	{"serial and topic", func(c *Config) {
		d := homeDevice(c)
		d.Serial, d.MQTTTopic = &SerialConfig{Port: "/dev/ttyS0"}, "site/d"
	}, "devices[0].mqtt_topic", "on serial or on mqtt_topic, not both"},
	{"link on another gateway", func(c *Config) {
		d := homeDevice(c)
		d.Home, d.Serial = "gw-b", &SerialConfig{Port: "/dev/ttyS0"}
	}, "devices[0].serial", `only the home gateway "gw-b" reaches "dev-1"'s link`},
	{"topic wildcard", func(c *Config) { homeDevice(c).MQTTTopic = "site/+" }, "devices[0].mqtt_topic", "no wildcards, and not under mqtt.prefix"},
	{"topic under the default prefix", func(c *Config) { homeDevice(c).MQTTTopic = DefaultMQTTPrefix + "/x" }, "devices[0].mqtt_topic", "not under mqtt.prefix"},
	{"topic under the prefix", func(c *Config) { c.MQTT.Prefix = "site"; homeDevice(c).MQTTTopic = "site/x" }, "devices[0].mqtt_topic", "not under mqtt.prefix"},
	{"topic under the default prefix, prefix set", func(c *Config) { c.MQTT.Prefix = "site"; homeDevice(c).MQTTTopic = DefaultMQTTPrefix + "/x" }, "", ""},
	{"serial without port", func(c *Config) { homeDevice(c).Serial = &SerialConfig{Baud: 9600} }, "devices[0].serial.port", "required"},
	{"serial settings", func(c *Config) {
		homeDevice(c).Serial = &SerialConfig{Port: "/dev/ttyS0", Baud: 9600, DataBits: 7, Parity: "E", StopBits: 2, ReadTimeout: 200 * time.Millisecond}
	}, "", ""},
	{"serial parity", func(c *Config) { homeDevice(c).Serial = &SerialConfig{Port: "/dev/ttyS0", Parity: "X"} }, "devices[0].serial.parity", `Parity "X"`},
	{"serial read timeout", func(c *Config) {
		homeDevice(c).Serial = &SerialConfig{Port: "/dev/ttyS0", ReadTimeout: 150 * time.Millisecond}
	}, "devices[0].serial.read_timeout", "ReadTimeout"},
	{"policy", func(c *Config) { c.Devices[0].Policy = PolicyAutonomous }, "", ""},
	{"policy unknown", func(c *Config) { c.Devices[0].Policy = "yolo" }, "devices[0].policy", `"yolo": want "strict" or "autonomous"`},
	{"reissue kinds", func(c *Config) { c.Devices[0].ReissueKinds = []string{"set", "setpoint"} }, "", ""},
	{"modbus profiles", func(c *Config) { c.Modbus.Profiles = []string{"a.yaml", "/etc/b.yaml"} }, "", ""},
	{"modbus profile empty", func(c *Config) { c.Modbus.Profiles = []string{"a.yaml", ""} }, "modbus.profiles[1]", "empty"},
	{"modbus profile twice", func(c *Config) { c.Modbus.Profiles = []string{"a.yaml", "./a.yaml"} }, "modbus.profiles[1]", `"./a.yaml" listed twice`},
	{"modbus buses", func(c *Config) {
		c.Modbus.Buses = []ModbusBusConfig{
			{Name: "rs485", RTU: &ModbusRTUConfig{Port: "/dev/ttyUSB1", Baud: 19200, Parity: "N", StopBits: 2}, Timeout: 300 * time.Millisecond, Retries: intp(0), PollUtilisation: 1},
			{Name: "net", TCP: "plc.local:502", Retries: intp(MaxModbusRetries)},
		}
	}, "", ""},
	{"modbus bus name", func(c *Config) { c.Modbus.Buses = []ModbusBusConfig{{Name: "a b", TCP: "h:502"}} }, "modbus.buses[0].name", `"a b": may contain only`},
	{"modbus bus twice", func(c *Config) {
		c.Modbus.Buses = []ModbusBusConfig{{Name: "a", TCP: "h:502"}, {Name: "a", TCP: "h:503"}}
	}, "modbus.buses[1].name", `"a" listed twice`},
	{"modbus bus neither", func(c *Config) { c.Modbus.Buses = []ModbusBusConfig{{Name: "a"}} }, "modbus.buses[0]", "give rtu (a serial line) or tcp (host:port), one of them"},
	{"modbus bus both", func(c *Config) {
		c.Modbus.Buses = []ModbusBusConfig{{Name: "a", TCP: "h:502", RTU: &ModbusRTUConfig{Port: "/dev/x"}}}
	}, "modbus.buses[0]", "one of them"},
	{"modbus rtu without port", func(c *Config) { c.Modbus.Buses = []ModbusBusConfig{{Name: "a", RTU: &ModbusRTUConfig{}}} }, "modbus.buses[0].rtu.port", "required"},
	{"modbus rtu baud", func(c *Config) {
		c.Modbus.Buses = []ModbusBusConfig{{Name: "a", RTU: &ModbusRTUConfig{Port: "/dev/x", Baud: 12345}}}
	}, "modbus.buses[0].rtu.baud", "Baud 12345"},
	{"modbus rtu parity", func(c *Config) {
		c.Modbus.Buses = []ModbusBusConfig{{Name: "a", RTU: &ModbusRTUConfig{Port: "/dev/x", Parity: "M"}}}
	}, "modbus.buses[0].rtu.parity", `Parity "M"`},
	{"modbus tcp without port", func(c *Config) { c.Modbus.Buses = []ModbusBusConfig{{Name: "a", TCP: "plc"}} }, "modbus.buses[0].tcp", `"plc": want host:port (e.g. 192.0.2.7:502)`},
	{"modbus tcp without host", func(c *Config) { c.Modbus.Buses = []ModbusBusConfig{{Name: "a", TCP: ":502"}} }, "modbus.buses[0].tcp", "want host:port"},
	{"modbus tcp port", func(c *Config) { c.Modbus.Buses = []ModbusBusConfig{{Name: "a", TCP: "h:0"}} }, "modbus.buses[0].tcp", "port must be a number in 1-65535"},
	{"modbus timeout negative", func(c *Config) { c.Modbus.Buses = []ModbusBusConfig{{Name: "a", TCP: "h:1", Timeout: -1}} }, "modbus.buses[0].timeout", "must be positive"},
	{"modbus retries", func(c *Config) { c.Modbus.Buses = []ModbusBusConfig{{Name: "a", TCP: "h:1", Retries: intp(11)}} }, "modbus.buses[0].retries", "11: want 0..10"},
	{"modbus retries negative", func(c *Config) { c.Modbus.Buses = []ModbusBusConfig{{Name: "a", TCP: "h:1", Retries: intp(-1)}} }, "modbus.buses[0].retries", "-1: want 0..10"},
	{"modbus poll utilisation", func(c *Config) { c.Modbus.Buses = []ModbusBusConfig{{Name: "a", TCP: "h:1", PollUtilisation: 1.5}} }, "modbus.buses[0].poll_utilisation", "1.5: want more than 0 and at most 1"},
	{"modbus poll utilisation negative", func(c *Config) { c.Modbus.Buses = []ModbusBusConfig{{Name: "a", TCP: "h:1", PollUtilisation: -0.1}} }, "modbus.buses[0].poll_utilisation", "want more than 0"},
	{"modbus device", func(c *Config) { modbusDevice(c) }, "", ""},
	{"modbus device elsewhere", func(c *Config) { modbusDevice(c); c.Devices[0].Home = "gw-b" }, "devices[0].serial", `only the home gateway "gw-b" reaches "dev-1"'s link (serial, mqtt_topic or modbus)`},
	{"modbus of a device fence", func(c *Config) {
		c.Modbus.Buses = []ModbusBusConfig{{Name: "rs485", TCP: "h:1"}}
		c.Devices[0].Modbus = &DeviceModbusConfig{Bus: "rs485", Unit: 1, Profile: "m"}
	}, "devices[0].home", "home, serial, mqtt_topic and modbus are for `fence: gateway` devices"},
	{"modbus and serial", func(c *Config) { modbusDevice(c); c.Devices[0].Serial = &SerialConfig{Port: "/dev/ttyS0"} }, "devices[0].modbus", "on modbus, serial or mqtt_topic: one of them"},
	{"modbus and topic", func(c *Config) { modbusDevice(c); c.Devices[0].MQTTTopic = "site/x" }, "devices[0].modbus", "one of them"},
	{"modbus unknown bus", func(c *Config) { modbusDevice(c).Bus = "rs232" }, "devices[0].modbus.bus", `"rs232": not a bus of modbus.buses (rs485)`},
	{"modbus no bus at all", func(c *Config) { modbusDevice(c); c.Modbus.Buses = nil }, "devices[0].modbus.bus", `"rs485": not a bus of modbus.buses (none)`},
	{"modbus unit broadcast", func(c *Config) { modbusDevice(c).Unit = 0 }, "devices[0].modbus.unit", "0 is broadcast"},
	{"modbus unit 247", func(c *Config) { modbusDevice(c).Unit = 247 }, "", ""},
	{"modbus unit 248", func(c *Config) { modbusDevice(c).Unit = 248 }, "devices[0].modbus.unit", "248: want 1..247"},
	{"modbus unit twice", func(c *Config) {
		m := *modbusDevice(c)
		c.Devices = append(c.Devices, DeviceConfig{ID: "dev-2", Fence: FenceGateway, Home: c.Gateway, Modbus: &m, Auth: AuthOff})
	}, "devices[1].modbus.unit", `unit 7 of bus "rs485" is also "dev-1"`},
	{"modbus same unit, another bus", func(c *Config) {
		m := *modbusDevice(c)
		c.Modbus.Buses = append(c.Modbus.Buses, ModbusBusConfig{Name: "net", TCP: "h:502"})
		m.Bus = "net"
		c.Devices = append(c.Devices, DeviceConfig{ID: "dev-2", Fence: FenceGateway, Home: c.Gateway, Modbus: &m, Auth: AuthOff})
	}, "", ""},
	{"modbus no profile", func(c *Config) { modbusDevice(c).Profile = "" }, "devices[0].modbus.profile", "required"},
	{"reissue kind empty", func(c *Config) { c.Devices[0].ReissueKinds = []string{"set", ""} }, "devices[0].reissue_kinds[1]", `"" is not a command kind`},
	{"reissue kind too long", func(c *Config) { c.Devices[0].ReissueKinds = []string{strings.Repeat("k", 300)} }, "devices[0].reissue_kinds[0]", "is not a command kind"},
}

// cloneConfig copies c deeply: its lists and serial lines too.
func cloneConfig(c Config) Config {
	c.Etcd.Endpoints = slices.Clone(c.Etcd.Endpoints)
	c.MQTT.Brokers = slices.Clone(c.MQTT.Brokers)
	c.Devices = slices.Clone(c.Devices)
	for i := range c.Devices {
		d := &c.Devices[i]
		d.ReissueKinds = slices.Clone(d.ReissueKinds)
		if d.Serial != nil {
			s := *d.Serial
			d.Serial = &s
		}
		if d.Modbus != nil {
			m := *d.Modbus
			d.Modbus = &m
		}
	}
	c.Modbus.Profiles = slices.Clone(c.Modbus.Profiles)
	c.Modbus.Buses = slices.Clone(c.Modbus.Buses)
	for i := range c.Modbus.Buses {
		b := &c.Modbus.Buses[i]
		if b.RTU != nil {
			r := *b.RTU
			b.RTU = &r
		}
		if b.Retries != nil {
			n := *b.Retries
			b.Retries = &n
		}
	}
	return c
}

// Each rule, valid and invalid values: exactly the one problem, under its
// key; and the same verdict once the defaults are filled in (a rule reads a
// zero value as its default).
func TestConfigRules(t *testing.T) {
	for _, tc := range ruleCases {
		t.Run(tc.name, func(t *testing.T) {
			c := ruleBase()
			tc.edit(&c)
			err := c.Validate()
			ces := ConfigErrors(err)
			switch {
			case tc.key == "" && err != nil:
				t.Fatalf("valid config refused: %v", err)
			case tc.key != "" && (len(ces) != 1 || ces[0].Key != tc.key || !strings.Contains(ces[0].Msg, tc.msg)):
				t.Fatalf("got\n%v\nwant one problem: %s: …%s…", err, tc.key, tc.msg)
			}
			d := cloneConfig(c)
			d.ApplyDefaults()
			if got, want := errString(d.Validate()), errString(err); got != want {
				t.Fatalf("after ApplyDefaults:\n%s\nbefore:\n%s", got, want)
			}
		})
	}
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// Validate only reads: the config is the same after it, with or without
// the defaults filled in, valid or not.
func TestValidateDoesNotChangeTheConfig(t *testing.T) {
	for _, tc := range ruleCases {
		c := ruleBase()
		tc.edit(&c)
		for _, filled := range []bool{false, true} {
			if filled {
				c.ApplyDefaults()
			}
			before := cloneConfig(c)
			_ = c.Validate()
			if !reflect.DeepEqual(before, c) {
				t.Errorf("%s (defaults filled: %v): Validate changed the config\nbefore %+v\nafter  %+v", tc.name, filled, before, c)
			}
		}
	}
}

// ApplyDefaults fills in what is unset and nothing else: applied twice it
// changes nothing more, and a value that is set, valid or not, stays.
func TestApplyDefaultsIsIdempotent(t *testing.T) {
	for _, tc := range ruleCases {
		c := ruleBase()
		tc.edit(&c)
		c.ApplyDefaults()
		once := cloneConfig(c)
		c.ApplyDefaults()
		if !reflect.DeepEqual(once, c) {
			t.Errorf("%s: a second ApplyDefaults changed the config", tc.name)
		}
	}
	c := ruleBase()
	c.Log.Level, c.Etcd.LeaseTTL, c.Outbox.TTL = "loud", time.Second, -time.Second
	c.ApplyDefaults()
	if c.Log.Level != "loud" || c.Etcd.LeaseTTL != time.Second || c.Outbox.TTL != -time.Second {
		t.Fatalf("ApplyDefaults changed set values: %+v", c)
	}
}

// The keys of the rules are keys of Config (or sections of them), so a
// rule cannot check a key that was renamed.
func TestConfigRuleKeys(t *testing.T) {
	keys := ConfigKeys()
	for _, r := range configRules {
		if !slices.Contains(keys, r.key) {
			t.Errorf("configRules: %q is not a key of Config", r.key)
		}
	}
	for _, r := range deviceRules {
		if r.key != "" && !slices.Contains(keys, "devices[]."+r.key) {
			t.Errorf("deviceRules: devices[].%s is not a key of Config", r.key)
		}
	}
}
