package agent

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"time"

	"github.com/edgefence/edgefence/transport/modbus/profile"
	"github.com/edgefence/edgefence/transport/serial"
)

// Defaults of the modbus section.
const (
	DefaultModbusTimeout         = time.Second
	DefaultModbusRetries         = 2
	DefaultModbusPollUtilisation = 0.5
	// DefaultModbusBaud and DefaultModbusParity are the Modbus over serial
	// line specification's (v1.02, 2.5.1): 9,600 baud, even parity; 8 data
	// bits and 1 stop bit, as transport/serial's defaults.
	DefaultModbusBaud   = 9600
	DefaultModbusParity = "E"
	MaxModbusRetries    = 10
	MaxModbusUnit       = 247 // unit ids 1..247; 0 is broadcast
)

// ModbusConfig is the Modbus buses this gateway masters and the device
// profiles of the devices on them (transport/modbus/profile).
type ModbusConfig struct {
	// Profiles are profile files, one per device model; a relative path
	// is from the config file's directory (LoadConfig resolves it).
	Profiles []string          `yaml:"profiles"`
	Buses    []ModbusBusConfig `yaml:"buses"`
}

// ModbusBusConfig is one Modbus bus: an RS-485 line (RTU) or a Modbus TCP
// endpoint, exactly one of them.
type ModbusBusConfig struct {
	Name string           `yaml:"name"` // what devices' modbus.bus names; in logs and metrics
	RTU  *ModbusRTUConfig `yaml:"rtu,omitempty"`
	TCP  string           `yaml:"tcp,omitempty"` // host:port, e.g. 192.0.2.7:502
	// Timeout is how long one transaction waits for its answer. Default 1s.
	Timeout time.Duration `yaml:"timeout"`
	// Retries is how many more times a read or an idempotent write is
	// sent after a lost answer; never a write the profile does not mark
	// idempotent. Default 2; 0 is none.
	Retries *int `yaml:"retries"`
	// PollUtilisation caps the share of the bus's time spent polling, so
	// that commands find it free: more than 0, at most 1. Default 0.5.
	PollUtilisation float64 `yaml:"poll_utilisation"`
}

// ModbusRTUConfig is an RTU bus's serial line. Zero values mean the Modbus
// serial line defaults (9600 baud, 8 data bits, even parity, 1 stop bit);
// ApplyDefaults fills them in.
type ModbusRTUConfig struct {
	Port     string `yaml:"port"`      // e.g. /dev/ttyUSB0 or /dev/serial/by-id/...
	Baud     int    `yaml:"baud"`      // default 9600
	DataBits int    `yaml:"data_bits"` // default 8
	Parity   string `yaml:"parity"`    // E (default), N or O
	StopBits int    `yaml:"stop_bits"` // 1 (default) or 2
}

// DeviceModbusConfig is where a Modbus device is.
type DeviceModbusConfig struct {
	Bus     string `yaml:"bus"`     // a name of modbus.buses
	Unit    int    `yaml:"unit"`    // its unit id on the bus, 1..247
	Profile string `yaml:"profile"` // the model of a profile of modbus.profiles
}

// applyDefaults fills in a bus's defaults.
func (b *ModbusBusConfig) applyDefaults() {
	orDefault(&b.Timeout, DefaultModbusTimeout)
	if b.Retries == nil {
		n := DefaultModbusRetries
		b.Retries = &n
	}
	orDefault(&b.PollUtilisation, DefaultModbusPollUtilisation)
	if b.RTU != nil {
		b.RTU.applyDefaults()
	}
}

func (r *ModbusRTUConfig) applyDefaults() {
	orDefault(&r.Baud, DefaultModbusBaud)
	orDefault(&r.DataBits, serial.DefaultDataBits)
	orDefault(&r.Parity, DefaultModbusParity)
	orDefault(&r.StopBits, serial.DefaultStopBits)
}

// PortConfig is the line as transport/serial opens it.
func (r ModbusRTUConfig) PortConfig() serial.PortConfig {
	r.applyDefaults()
	return serial.PortConfig{Path: r.Port, Baud: r.Baud, DataBits: r.DataBits, Parity: r.Parity, StopBits: r.StopBits, ReadTimeout: serial.DefaultReadTimeout}
}

// Bus returns the bus called name.
func (m *ModbusConfig) Bus(name string) (*ModbusBusConfig, bool) {
	for i := range m.Buses {
		if m.Buses[i].Name == name {
			return &m.Buses[i], true
		}
	}
	return nil, false
}

// checkModbusProfiles is the rule of modbus.profiles: paths, each once.
func checkModbusProfiles(c *Config, bad badFunc) {
	seen := map[string]bool{}
	for i, p := range c.Modbus.Profiles {
		key := fmt.Sprintf("modbus.profiles[%d]", i)
		switch {
		case p == "":
			bad(key, "empty: want a profile file")
		case seen[filepath.Clean(p)]:
			bad(key, "%q listed twice", p)
		}
		seen[filepath.Clean(p)] = true
	}
}

// checkModbusBuses is the rule of modbus.buses: each named once, on a
// serial line or a TCP endpoint.
func checkModbusBuses(c *Config, bad badFunc) {
	seen := map[string]bool{}
	for i := range c.Modbus.Buses {
		b := &c.Modbus.Buses[i]
		key := fmt.Sprintf("modbus.buses[%d]", i)
		if p := idProblem(b.Name); p != "" {
			bad(key+".name", "%s", p)
		} else if seen[b.Name] {
			bad(key+".name", "%q listed twice", b.Name)
		}
		seen[b.Name] = true
		switch {
		case (b.RTU == nil) == (b.TCP == ""):
			bad(key, "give rtu (a serial line) or tcp (host:port), one of them")
		case b.RTU != nil && b.RTU.Port == "":
			bad(key+".rtu.port", "required")
		case b.RTU != nil:
			checkPort(b.RTU.PortConfig(), key+".rtu", bad)
		default:
			if err := checkHostPort(b.TCP, true); err != nil {
				bad(key+".tcp", "%v (e.g. 192.0.2.7:502)", err)
			}
		}
		if b.Timeout < 0 {
			bad(key+".timeout", "must be positive")
		}
		if r := b.Retries; r != nil && (*r < 0 || *r > MaxModbusRetries) {
			bad(key+".retries", "%d: want 0..%d", *r, MaxModbusRetries)
		}
		if u := b.PollUtilisation; u < 0 || u > 1 || u != u {
			bad(key+".poll_utilisation", "%v: want more than 0 and at most 1", u)
		}
	}
}

// checkDeviceModbus is the device rule of modbus: a bus of modbus.buses,
// a unit id, a profile; one device per unit of a bus.
func checkDeviceModbus(v deviceCheck, bad badFunc) {
	m := v.d.Modbus
	if m == nil {
		return
	}
	key := v.key + ".modbus"
	if _, ok := v.c.Modbus.Bus(m.Bus); !ok {
		names := make([]string, 0, len(v.c.Modbus.Buses))
		for _, b := range v.c.Modbus.Buses {
			names = append(names, b.Name)
		}
		bad(key+".bus", "%q: not a bus of modbus.buses (%s)", m.Bus, cmp.Or(strings.Join(names, ", "), "none"))
	}
	switch {
	case m.Unit == 0:
		bad(key+".unit", "0 is broadcast, which no device answers: want its unit id, 1..%d", MaxModbusUnit)
	case m.Unit < 0 || m.Unit > MaxModbusUnit:
		bad(key+".unit", "%d: want 1..%d", m.Unit, MaxModbusUnit)
	default:
		for j := range v.i {
			if o := v.c.Devices[j].Modbus; o != nil && o.Bus == m.Bus && o.Unit == m.Unit {
				bad(key+".unit", "unit %d of bus %q is also %q", m.Unit, m.Bus, v.c.Devices[j].ID)
				break
			}
		}
	}
	if m.Profile == "" {
		bad(key+".profile", "required: the model of a profile of modbus.profiles")
	}
}

// resolveProfiles makes relative profile paths relative to dir, the
// config file's directory.
func (m *ModbusConfig) resolveProfiles(dir string) {
	for i, p := range m.Profiles {
		if p != "" && !filepath.IsAbs(p) {
			m.Profiles[i] = filepath.Join(dir, p)
		}
	}
}

// ModbusProfiles loads the device profiles of modbus.profiles (a relative
// path is from the current directory, unless LoadConfig resolved it from
// the config file's) and returns them by model. LoadConfig calls it, so
// that a config it returns has profiles that load; the daemon calls it
// again to use them. Problems are ConfigErrors: those in a profile name
// its file, line and key (fields[2].type); a file that cannot be read, a
// model in two files or a device naming a model no profile has, their key
// of the config (modbus.profiles[1], devices[3].modbus.profile).
func (c *Config) ModbusProfiles() (map[string]*profile.Profile, error) {
	out := make(map[string]*profile.Profile, len(c.Modbus.Profiles))
	var errs []error
	from := map[string]string{}
	for i, path := range c.Modbus.Profiles {
		key := fmt.Sprintf("modbus.profiles[%d]", i)
		p, err := profile.Load(path)
		if pes := profile.Errors(err); len(pes) > 0 {
			for _, pe := range pes {
				errs = append(errs, &ConfigError{File: pe.File, Line: pe.Line, Key: pe.Key, Msg: pe.Msg})
			}
			continue
		}
		if err != nil {
			msg := err.Error()
			if pe, ok := errors.AsType[*fs.PathError](err); ok {
				msg = pe.Err.Error()
			}
			errs = append(errs, &ConfigError{Key: key, Msg: fmt.Sprintf("%s: %s", path, msg)})
			continue
		}
		if other, dup := from[p.Model]; dup {
			errs = append(errs, &ConfigError{Key: key, Msg: fmt.Sprintf("model %q is also the model of %s", p.Model, other)})
			continue
		}
		from[p.Model] = path
		out[p.Model] = p
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...) // the devices are not checked against a partial set
	}
	for i, d := range c.Devices {
		if d.Modbus != nil && d.Modbus.Profile != "" && out[d.Modbus.Profile] == nil && d.Home == c.Gateway {
			errs = append(errs, &ConfigError{Key: fmt.Sprintf("devices[%d].modbus.profile", i),
				Msg: fmt.Sprintf("%q: no profile of modbus.profiles has this model", d.Modbus.Profile)})
		}
	}
	return out, errors.Join(errs...)
}
