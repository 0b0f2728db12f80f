package sandbox

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/edgefence/edgefence/transport/modbus"
	"github.com/edgefence/edgefence/transport/modbus/profile"
)

// Figure1Modbus runs Figure 1 against a Modbus slave the caller runs
// (pymodbus in the tests): the device is one unit on a bus wired to
// gateway B, its home (`fence: gateway`, `home: gw-b`), whose fence table
// is the only fence — the slave applies whatever reaches it. Both agents
// send `twin.set` of one writable holding field of the device's profile
// (SetpointA, SetpointB, SetpointLate); with NoFence, B runs with its
// fence table off. At the end, once every process of the run has stopped,
// Read reads the field's registers back with a master of the caller's
// (mbpoll in the tests): Figure1Result.Values holds what the slave holds,
// decoded by the profile, and Figure1Result.Registers the raw registers.
//
// The line is 8N1: a pty has no parity (see RS485), so B's bus, the slave
// and the reader must all use none.
type Figure1Modbus struct {
	// The bus at B's end: exactly one of RTU, a tty path (an RS485 line's
	// Master, with the slave on a drop, or one end of a pty pair), and
	// TCP, a host:port.
	RTU  string
	Baud int // RTU: the line's rate; default 19200
	TCP  string

	Unit    byte   // the slave's unit id, 1..247
	Profile string // the device profile's file, e.g. configs/profiles/hvac-controller.yaml
	Field   string // the writable holding field the commands set; default "setpoint"

	// Read reads count holding registers of Unit from addr (PDU
	// addressing). Required.
	Read func(ctx context.Context, addr uint16, count int) ([]uint16, error)
}

// kindTwinSet is agent.KindTwinSet (this package does not import agent).
const kindTwinSet = "twin.set"

// modbusBus is the name of the run's bus in B's config.
const modbusBus = "fig1-bus"

// atGateway reports whether the run's device is fenced at its home
// gateway B (Serial, Modbus) rather than by itself (the MQTT devices).
func (c *Figure1Config) atGateway() bool { return c.Serial || c.Modbus != nil }

// checkModbus validates the Modbus mode of a run and loads its profile and
// field.
func (f *figure1) checkModbus() error {
	if f.cfg.Modbus == nil {
		return nil
	}
	mc := *f.cfg.Modbus // the defaults are the run's, not the caller's
	m := &mc
	f.cfg.Modbus = m
	if m.Field == "" {
		m.Field = "setpoint"
	}
	if m.Baud == 0 {
		m.Baud = 19200
	}
	c := f.cfg
	switch {
	case c.Serial || c.Forgery || c.RestartDevicesBeforeLate:
		return errors.New("sandbox: figure 1 over Modbus: not with Serial, Forgery or RestartDevicesBeforeLate")
	case len(c.Devices) != 1:
		return errors.New("sandbox: figure 1 over Modbus takes one device")
	case (m.RTU == "") == (m.TCP == ""):
		return errors.New("sandbox: figure 1 over Modbus: exactly one of RTU and TCP")
	case m.Unit < 1 || m.Unit > 247:
		return fmt.Errorf("sandbox: figure 1 over Modbus: unit %d not in 1..247", m.Unit)
	case m.Read == nil:
		return errors.New("sandbox: figure 1 over Modbus: Read is required")
	}
	p, err := profile.Load(m.Profile)
	if err != nil {
		return fmt.Errorf("sandbox: figure 1 over Modbus: %w", err)
	}
	fd, ok := p.Field(m.Field)
	if !ok || fd.Table != profile.Holding || !fd.Writable || fd.Enum != nil {
		return fmt.Errorf("sandbox: figure 1 over Modbus: profile %s has no writable numeric holding field %q", p.Model, m.Field)
	}
	for _, v := range []float64{SetpointA, SetpointB, SetpointLate} {
		if _, err := p.PlanFields(map[string]any{m.Field: v}); err != nil {
			return fmt.Errorf("sandbox: figure 1 over Modbus: %w", err)
		}
	}
	f.prof, f.field = p, fd
	return nil
}

// modbusYAML is gw-b's `modbus:` section: the profile and the bus.
func (f *figure1) modbusYAML(gw string) string {
	m := f.cfg.Modbus
	if m == nil || gw != "gw-b" {
		return ""
	}
	bus := "tcp: " + yamlQuote(m.TCP)
	if m.RTU != "" {
		bus = fmt.Sprintf("rtu: {port: %s, baud: %d, data_bits: 8, parity: N, stop_bits: 1}", yamlQuote(m.RTU), m.Baud)
	}
	return fmt.Sprintf("modbus:\n  profiles: [%s]\n  buses:\n    - name: %s\n      %s\n      retries: 2\n",
		yamlQuote(m.Profile), modbusBus, bus)
}

// modbusDeviceYAML is the device's place on gw-b's bus, in its devices
// entry.
func (f *figure1) modbusDeviceYAML() string {
	return fmt.Sprintf("    modbus: {bus: %s, unit: %d, profile: %s}\n", modbusBus, f.cfg.Modbus.Unit, yamlQuote(f.prof.Model))
}

// modbusWhere says where the slave is, for the narration.
func (f *figure1) modbusWhere() string {
	m := f.cfg.Modbus
	if m.RTU != "" {
		return fmt.Sprintf("unit %d on an RS-485 line at %d baud (%s)", m.Unit, m.Baud, m.RTU)
	}
	return fmt.Sprintf("unit %d at Modbus TCP %s", m.Unit, m.TCP)
}

// readModbus reads the field's registers back from the slave, once every
// process has stopped, and decodes them with the profile.
func (f *figure1) readModbus(ctx context.Context, res *Figure1Result) error {
	m, fd := f.cfg.Modbus, f.field
	n := fd.Type.Width()
	regs, err := m.Read(ctx, fd.Address, n)
	if err != nil {
		return fmt.Errorf("sandbox: figure 1 over Modbus: read back: %w", err)
	}
	if len(regs) != n {
		return fmt.Errorf("sandbox: figure 1 over Modbus: read back %d registers, want %d", len(regs), n)
	}
	b := profile.Block{Req: &modbus.Request{Func: modbus.FuncReadHolding, Addr: fd.Address, Count: uint16(n)}, Fields: []string{fd.Name}}
	vals, err := f.prof.Decode(b, &modbus.Response{Func: modbus.FuncReadHolding, Addr: fd.Address, Count: uint16(n), Values: regs})
	if err != nil {
		return fmt.Errorf("sandbox: figure 1 over Modbus: decode %v: %w", regs, err)
	}
	x, ok := number(vals[fd.Name])
	if !ok {
		return fmt.Errorf("sandbox: figure 1 over Modbus: field %s decoded as %T", fd.Name, vals[fd.Name])
	}
	dev := f.cfg.Devices[0]
	res.Values[dev], res.Registers = x, regs
	words := make([]string, n)
	for i, r := range regs {
		words[i] = fmt.Sprint(r)
	}
	f.say("the processes are stopped; a master apart from the agents reads holding register %d of unit %d: %s, %s=%g",
		fd.Address, m.Unit, strings.Join(words, " "), fd.Name, x)
	return nil
}

// number is a decoded profile value as a float64: int64 for an unscaled
// integer, float64 otherwise.
func number(v any) (float64, bool) {
	switch x := v.(type) {
	case int64:
		return float64(x), true
	case float64:
		return x, true
	}
	return 0, false
}
