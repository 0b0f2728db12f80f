package agent

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/edgefence/edgefence/offline"
	"github.com/edgefence/edgefence/transport/serial"
)

const goodConfig = `
gateway: gw-a
etcd:
  endpoints: [http://127.0.0.1:2379]
mqtt:
  brokers: [mqtt://127.0.0.1:1883]
devices:
  - id: dev-1
    auth: off
  - id: dev-2
    fence: device
    auth: off
`

func TestParseConfigDefaults(t *testing.T) {
	c, err := ParseConfig([]byte(goodConfig))
	if err != nil {
		t.Fatal(err)
	}
	if c.Etcd.LeaseTTL != DefaultLeaseTTL || c.Etcd.Prefix != DefaultEtcdPrefix || c.MQTT.Prefix != DefaultMQTTPrefix ||
		c.MQTT.ClientID != "edgefence-gw-a" || c.API.Socket != DefaultSocket || c.Command.Timeout != DefaultCommandTimeout ||
		c.Devices[0].Fence != FenceDevice || c.MQTT.SessionExpiry != 5*time.Minute || c.Log.Format != "auto" ||
		c.MQTT.ReconnectBackoffMax != 5*time.Second || c.MQTT.MaxPacketSize != 128<<10 {
		t.Fatalf("defaults not filled in: %+v", c)
	}
}

func TestParseConfigErrorsNameTheField(t *testing.T) {
	for _, tc := range []struct {
		name, edit, field string
	}{
		{"unknown key", "gateway: gw-a\nbogus: 1", "bogus"},
		{"unknown nested key", "etcd:\n  endpoints: [http://127.0.0.1:2379]\n  ttl: 3s", "ttl"},
		{"no gateway", "gateway: ''", "gateway"},
		{"bad gateway", "gateway: 'gw a'", "gateway"},
		{"ttl too short", "etcd:\n  endpoints: [http://127.0.0.1:2379]\n  lease_ttl: 1s", "etcd.lease_ttl"},
		{"ttl fraction", "etcd:\n  endpoints: [http://127.0.0.1:2379]\n  lease_ttl: 2500ms", "etcd.lease_ttl"},
		{"bad ttl type", "etcd:\n  endpoints: [http://127.0.0.1:2379]\n  lease_ttl: soon", "line 4"}, // type errors name the line
		{"etcd scheme", "etcd:\n  endpoints: [ftp://x]", "etcd.endpoints[0]"},
		{"no brokers", "mqtt:\n  brokers: []", "mqtt.brokers"},
		{"mqtt prefix", "mqtt:\n  brokers: [mqtt://127.0.0.1:1883]\n  prefix: 'a/#'", "mqtt.prefix"},
		{"no devices", "devices: []", "devices"},
		{"device id", "devices:\n  - id: 'dev/1'", "devices[0].id"},
		{"duplicate device", "devices:\n  - id: d\n  - id: d", "devices[1].id"},
		{"fence kind", "devices:\n  - id: d\n    fence: magic", "devices[0].fence"},
		{"gateway fence without home", "devices:\n  - id: d\n    fence: gateway", "devices[0].home"},
		{"home without serial", "devices:\n  - id: d\n    fence: gateway\n    home: gw-a", "devices[0].serial"},
		{"serial on a non-home gateway", "devices:\n  - id: d\n    fence: gateway\n    home: gw-b\n    serial: {port: /dev/ttyUSB0}", "devices[0].serial"},
		{"serial without port", "devices:\n  - id: d\n    fence: gateway\n    home: gw-a\n    serial: {baud: 9600}", "devices[0].serial.port"},
		{"home on a device fence", "devices:\n  - id: d\n    home: gw-a", "devices[0].home"},
		{"serial and mqtt_topic", "devices:\n  - id: d\n    fence: gateway\n    home: gw-a\n    serial: {port: /dev/ttyS0}\n    mqtt_topic: site/d", "devices[0].mqtt_topic"},
		{"mqtt_topic wildcard", "devices:\n  - id: d\n    fence: gateway\n    home: gw-a\n    mqtt_topic: site/+", "devices[0].mqtt_topic"},
		{"mqtt_topic under the prefix", "devices:\n  - id: d\n    fence: gateway\n    home: gw-a\n    mqtt_topic: edgefence/v1/x", "devices[0].mqtt_topic"},
		{"log level", "log:\n  level: loud", "log.level"},
		{"not yaml", "gateway: [", "yaml"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(override(goodConfig, tc.edit)))
			if err == nil {
				t.Fatal("accepted")
			}
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("error %q does not name %q or wrap ErrConfig", err, tc.field)
			}
		})
	}
}

// override replaces top-level sections of base with those in edit.
func override(base, edit string) string {
	sections := map[string]string{}
	var order []string
	parse := func(s string, keepOrder bool) {
		var cur string
		for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
			if line != "" && line[0] != ' ' {
				cur = strings.SplitN(line, ":", 2)[0]
				if keepOrder {
					order = append(order, cur)
				} else if _, ok := sections[cur]; !ok {
					order = append(order, cur)
				}
				sections[cur] = ""
			}
			sections[cur] += line + "\n"
		}
	}
	parse(base, true)
	parse(edit, false)
	var b strings.Builder
	for _, k := range order {
		b.WriteString(sections[k])
	}
	return b.String()
}

func TestBridgedDevices(t *testing.T) {
	c, err := ParseConfig([]byte(override(goodConfig, `devices:
  - id: thermo
    auth: off
  - id: plc-1
    fence: gateway
    home: gw-a
    serial: {port: /dev/ttyUSB0, baud: 9600, parity: E}
    auth: off
  - id: plc-2
    fence: gateway
    home: gw-b
    auth: off
  - id: meter-3
    fence: gateway
    home: gw-a
    mqtt_topic: site/meter-3
    auth: off`)))
	if err != nil {
		t.Fatal(err)
	}
	b := c.Bridged()
	if len(b) != 2 || b[0].ID != "plc-1" || b[0].Serial.Baud != 9600 || b[0].Serial.Parity != "E" || b[1].MQTTTopic != "site/meter-3" {
		t.Fatalf("bridged %+v", b)
	}
}

func TestPolicyAndOutboxConfig(t *testing.T) {
	base := "gateway: g\netcd: {endpoints: [http://127.0.0.1:2379]}\n"
	mqtt := "mqtt: {brokers: [mqtt://127.0.0.1:1883]}\n"
	c, err := ParseConfig([]byte(base + mqtt + "devices:\n  - id: a\n    auth: off\n  - id: b\n    auth: off\n    policy: autonomous\n    reissue_kinds: [set]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Devices[0].Policy != PolicyStrict || c.Devices[1].Policy != PolicyAutonomous || c.Devices[1].ReissueKinds[0] != "set" {
		t.Fatalf("%+v", c.Devices)
	}
	for _, bad := range []struct{ yaml, field string }{
		{"devices:\n  - id: a\n    policy: yolo\n", "devices[0].policy"},
		{"devices:\n  - id: a\n    reissue_kinds: ['']\n", "devices[0].reissue_kinds[0]"},
		{"outbox: {ttl: -1s}\ndevices:\n  - id: a\n", "outbox.ttl"},
		{"outbox: {max_per_device: -3}\ndevices:\n  - id: a\n", "outbox.max_per_device"},
	} {
		_, err := ParseConfig([]byte(base + bad.yaml))
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), bad.field) {
			t.Errorf("%q: %v, want an error naming %s", bad.yaml, err, bad.field)
		}
	}
}

// metrics.per_device: off unless set; anything but a boolean names the key.
func TestMetricsPerDeviceConfig(t *testing.T) {
	for _, tc := range []struct {
		value   string
		want    bool
		wantErr string
	}{
		{"", false, ""},
		{"  per_device: true\n", true, ""},
		{"  per_device: false\n", false, ""},
		{"  per_device: maybe\n", false, "metrics.per_device: cannot unmarshal"},
		{"  per_device: [true]\n", false, "metrics.per_device: cannot unmarshal"},
	} {
		c, err := ParseConfig([]byte(override(goodConfig, "metrics:\n  listen: 127.0.0.1:9464\n"+tc.value)))
		switch {
		case tc.wantErr != "":
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: %v, want %q", tc.value, err, tc.wantErr)
			}
		case err != nil:
			t.Errorf("%q: %v", tc.value, err)
		case c.Metrics.PerDevice != tc.want:
			t.Errorf("%q: per_device %v, want %v", tc.value, c.Metrics.PerDevice, tc.want)
		}
	}
}

func TestMQTTReconnectBackoffMaxConfig(t *testing.T) {
	for _, tc := range []struct{ value, want string }{
		{"100ms", "line 6: mqtt.reconnect_backoff_max: 100ms is below the first retry's delay 250ms"},
		{"-1s", "line 6: mqtt.reconnect_backoff_max: -1s is below the first retry's delay 250ms"},
		{"soon", "line 6: mqtt.reconnect_backoff_max: cannot unmarshal"},
	} {
		_, err := ParseConfig([]byte(override(goodConfig, "mqtt:\n  brokers: [mqtt://127.0.0.1:1883]\n  reconnect_backoff_max: "+tc.value)))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.value, err, tc.want)
		}
	}
	c, err := ParseConfig([]byte(override(goodConfig, "mqtt:\n  brokers: [mqtt://127.0.0.1:1883]\n  reconnect_backoff_max: 250ms")))
	if err != nil || c.MQTT.ReconnectBackoffMax != 250*time.Millisecond {
		t.Fatalf("250ms: %v %+v", err, c)
	}
}

func TestMQTTMaxPacketSizeConfig(t *testing.T) {
	_, err := ParseConfig([]byte(override(goodConfig, "mqtt:\n  brokers: [mqtt://127.0.0.1:1883]\n  max_packet_size: 1024")))
	if want := "line 6: mqtt.max_packet_size: 1024 bytes: want 68608"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("1024: %v, want %q", err, want)
	}
	c, err := ParseConfig([]byte(override(goodConfig, "mqtt:\n  brokers: [mqtt://127.0.0.1:1883]\n  max_packet_size: 1048576")))
	if err != nil || c.MQTT.MaxPacketSize != 1<<20 {
		t.Fatalf("1 MiB: %v %+v", err, c)
	}
}

// TestApplyDefaultsFillsEveryDefault: after ParseConfig (ApplyDefaults) no
// field whose zero value means "the default" is still zero, so `config
// check` prints the values that run (it printed outbox ttl 0s, serial baud
// 0). The keys whose zero is a value of its own are listed.
func TestApplyDefaultsFillsEveryDefault(t *testing.T) {
	c, err := ParseConfig([]byte(override(goodConfig, `devices:
  - id: dev-1
    auth: off
  - id: plc-1
    fence: gateway
    home: gw-a
    serial: {port: /dev/ttyUSB0}
    auth: off
  - id: meter-1
    fence: gateway
    home: gw-a
    modbus: {bus: rs485, unit: 1, profile: m}
    auth: off
modbus:
  buses:
    - {name: rs485, rtu: {port: /dev/ttyUSB1}}
    - {name: net, tcp: "127.0.0.1:502"}`)))
	if err != nil {
		t.Fatal(err)
	}
	zeroMeansItself := map[string]bool{
		"etcd.username": true, "etcd.password": true, "etcd.tls.ca_file": true, "etcd.tls.cert_file": true, "etcd.tls.key_file": true,
		"mqtt.username": true, "mqtt.password": true, "mqtt.tls.ca_file": true, "mqtt.tls.cert_file": true, "mqtt.tls.key_file": true,
		"metrics.listen": true, "metrics.per_device": true, "metrics.pprof": true, "twins.enabled": true, // off
		"auth.key_file": true, "auth.key_id": true, // no key: every device says auth: off
		"auth.certificate": true, "auth.revocations": true, "auth.trust_root": true, "auth.trust_root_kid": true, // none: no trust to check against
		"devices[].home": true, "devices[].serial": true, "devices[].mqtt_topic": true, "devices[].reissue_kinds": true,
		"devices[].labels": true,                          // none
		"devices[].modbus": true, "modbus.profiles": true, // none
		"modbus.buses[].rtu": true, "modbus.buses[].tcp": true, // one of them
	}
	var walk func(v reflect.Value, key string)
	walk = func(v reflect.Value, key string) {
		typ := v.Type()
		switch {
		case typ.Kind() == reflect.Pointer && !v.IsNil():
			walk(v.Elem(), key)
		case typ.Kind() == reflect.Struct && typ.PkgPath() != "time" && !reflect.PointerTo(typ).Implements(unmarshalerType):
			for i := range typ.NumField() {
				name, _, _ := strings.Cut(typ.Field(i).Tag.Get("yaml"), ",")
				k := name
				if key != "" {
					k = key + "." + name
				}
				walk(v.Field(i), k)
			}
		case typ.Kind() == reflect.Slice && typ.Elem().Kind() == reflect.Struct:
			for i := range v.Len() {
				walk(v.Index(i), key+"[]")
			}
		case v.IsZero() && !zeroMeansItself[key]:
			t.Errorf("%s is %v after ApplyDefaults: fill in its default", key, v.Interface())
		}
	}
	walk(reflect.ValueOf(c).Elem(), "")
	o := c.Outbox
	if o.TTL != offline.DefaultTTL || o.Retention != offline.DefaultRetention || o.MaxPerDevice != offline.DefaultMaxPerDevice ||
		o.MaxBytesPerDevice != offline.DefaultMaxBytesPerDevice || o.MaxTotal != offline.DefaultMaxTotal || o.MaxTotalBytes != offline.DefaultMaxTotalBytes {
		t.Errorf("outbox %+v, want offline's defaults", o)
	}
	if s := c.Devices[1].Serial; s.Baud != serial.DefaultBaud || s.Parity != serial.DefaultParity || s.ReadTimeout != serial.DefaultReadTimeout {
		t.Errorf("serial %+v, want transport/serial's defaults", *s)
	}
	b := c.Modbus.Buses[0]
	if r := b.RTU; r.Baud != 9600 || r.Parity != "E" || r.DataBits != 8 || r.StopBits != 1 || b.Timeout != time.Second || *b.Retries != 2 || b.PollUtilisation != 0.5 {
		t.Errorf("modbus bus %+v %+v, want the Modbus serial line defaults", b, *b.RTU)
	}
}

// Bad ids are reported in a config's words: the key, the value and the
// rule, not "fence: invalid envelope: device id".
func TestIDErrorsSayTheRule(t *testing.T) {
	long := strings.Repeat("d", 129)
	const idRule = "may contain only letters A-Z a-z, digits 0-9, '.', '_' and '-'"
	for _, tc := range []struct{ edit, want string }{
		{"devices:\n  - id: a\n  - id: b\n  - id: a/b", `devices[2].id: "a/b": ` + idRule},
		{"devices:\n  - id: .hidden", `devices[0].id: ".hidden": ` + idRule},
		{"devices:\n  - id: ''", `devices[0].id: required`},
		{"devices:\n  - id: " + long, `devices[0].id: "` + long[:32] + `"… is 129 characters: ` + idRule},
		{"gateway: 'gw 1'", `gateway: "gw 1": ` + idRule},
		{"devices:\n  - id: d\n    fence: gateway\n    home: gw/2", `devices[0].home: "gw/2": ` + idRule},
	} {
		_, err := ParseConfig([]byte(override(goodConfig, tc.edit)))
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "envelope") {
			t.Errorf("%q: got\n%v\nwant a line with %q", tc.edit, err, tc.want)
		}
	}
}
