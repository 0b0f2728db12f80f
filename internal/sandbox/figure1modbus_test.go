package sandbox

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgefence/edgefence/internal/modbustest"
)

// fig1Unit is the slave's unit id in the Modbus Figure 1 runs.
const fig1Unit = 5

// runFigure1Modbus runs Figure 1 on the real binaries against a pymodbus
// slave (unit 5, the thermostat profile acme-tc20: setpoint in holding
// register 0, int16 ×0.1) wired to gateway B: over RTU through an RS-485
// line at 19,200 baud (the slave on drop 0, B on the master end), or over
// Modbus TCP. The run reads the register back with mbpoll once every
// process has stopped (on the line: from the master end B has let go of).
func runFigure1Modbus(t *testing.T, rtu, noFence bool) *Figure1Result {
	t.Helper()
	binaries(t) // skipped with -short before pymodbus is asked for
	modbustest.Require(t)
	prof, err := filepath.Abs(filepath.Join("..", "..", "configs", "profiles", "hvac-controller.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m := &Figure1Modbus{Unit: fig1Unit, Profile: prof}
	var target modbustest.Target
	if rtu {
		const baud = 19200
		l := newLine(t, RS485Config{Baud: baud, Drops: 1})
		modbustest.StartRTU(t, l.Drops[0], modbustest.Options{Units: []byte{fig1Unit}, Baud: baud})
		m.RTU, m.Baud = l.Master, baud
		target = modbustest.Target{Path: l.Master, Baud: baud}
	} else {
		s := modbustest.StartTCP(t, modbustest.Options{Units: []byte{fig1Unit}})
		m.TCP, target = s.Addr(), s.TCPTarget()
	}
	m.Read = func(ctx context.Context, addr uint16, count int) ([]uint16, error) {
		return modbustest.Read(ctx, target, fig1Unit, modbustest.HoldingRegisters, addr, count)
	}
	return runFigure1(t, func(c *Figure1Config) {
		c.Modbus, c.Devices, c.NoFence = m, []string{"tc-1"}, noFence
	})
}

// TestFigure1ModbusFrozenHolderIsFenced: Figure 1 on a real Modbus slave.
// Holder A sets the thermostat (21 °C), is frozen (SIGSTOP) past its
// lease, B (the home gateway) takes over and sets 25 °C, A resumes and
// sends its queued 99 °C: B's fence table answers it stale and it never
// reaches the bus — mbpoll, an independent master, reads B's 250 (×0.1)
// from the slave. Over RTU (an RS-485 line) and over TCP.
func TestFigure1ModbusFrozenHolderIsFenced(t *testing.T) {
	for _, rtu := range []bool{true, false} {
		t.Run(map[bool]string{true: "rtu", false: "tcp"}[rtu], func(t *testing.T) {
			res := runFigure1Modbus(t, rtu, false)
			if err := res.CheckFenced(); err != nil {
				t.Fatal(err)
			}
			if l := res.Late["tc-1"]; l.Verdict != "stale" {
				t.Fatalf("A's late command: %+v, want stale from B's table", l)
			}
			if len(res.Registers) != 1 || res.Registers[0] != uint16(SetpointB*10) {
				t.Fatalf("the slave holds %v, want B's %d", res.Registers, uint16(SetpointB*10))
			}
		})
	}
}

// TestFigure1ModbusWithoutFenceCorrupts: the same schedule with B's fence
// table off (the no-fence-table failpoint): A's stale write reaches the
// bus and the slave holds 99 °C. It shows the test above fails without
// the fence.
func TestFigure1ModbusWithoutFenceCorrupts(t *testing.T) {
	res := runFigure1Modbus(t, true, true)
	if res.Corrupted() != 1 || len(res.Registers) != 1 || res.Registers[0] != uint16(SetpointLate*10) {
		t.Fatalf("the slave holds %v (%v), want the stale holder's %d", res.Registers, res.Values, uint16(SetpointLate*10))
	}
	if err := res.CheckFenced(); err == nil || !strings.Contains(err.Error(), "late command was accepted") {
		t.Fatalf("CheckFenced without the table: %v", err)
	}
}

// A Modbus run that cannot be set up is refused before any process
// starts, with what is wrong.
func TestFigure1ModbusConfigRefused(t *testing.T) {
	prof, err := filepath.Abs(filepath.Join("..", "..", "configs", "profiles", "hvac-controller.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	read := func(context.Context, uint16, int) ([]uint16, error) { return nil, nil }
	ok := Figure1Modbus{TCP: "127.0.0.1:1", Unit: 1, Profile: prof, Read: read}
	for name, tc := range map[string]struct {
		mutate func(*Figure1Config)
		want   string
	}{
		"two devices":  {func(c *Figure1Config) { c.Devices = []string{"a", "b"} }, "takes one device"},
		"no bus":       {func(c *Figure1Config) { c.Modbus.TCP = "" }, "exactly one of RTU and TCP"},
		"two buses":    {func(c *Figure1Config) { c.Modbus.RTU = "/dev/null" }, "exactly one of RTU and TCP"},
		"broadcast":    {func(c *Figure1Config) { c.Modbus.Unit = 0 }, "unit 0 not in 1..247"},
		"no read":      {func(c *Figure1Config) { c.Modbus.Read = nil }, "Read is required"},
		"no profile":   {func(c *Figure1Config) { c.Modbus.Profile = filepath.Join(t.TempDir(), "x.yaml") }, "x.yaml"},
		"enum field":   {func(c *Figure1Config) { c.Modbus.Field = "mode" }, `no writable numeric holding field "mode"`},
		"input field":  {func(c *Figure1Config) { c.Modbus.Field = "humidity" }, `no writable numeric holding field "humidity"`},
		"with serial":  {func(c *Figure1Config) { c.Serial = true }, "not with Serial"},
		"with restart": {func(c *Figure1Config) { c.RestartDevicesBeforeLate = true }, "not with Serial"},
	} {
		t.Run(name, func(t *testing.T) {
			m := ok
			c := Figure1Config{AgentBin: "edgefence", Dir: t.TempDir(), Etcd: "http://127.0.0.1:1", MQTT: "mqtt://127.0.0.1:1",
				Devices: []string{"tc-1"}, Modbus: &m}
			tc.mutate(&c)
			_, err := RunFigure1(t.Context(), c)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want it to say %q", err, tc.want)
			}
		})
	}
}
