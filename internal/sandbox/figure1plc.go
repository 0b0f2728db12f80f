package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/edgefence/edgefence/devices/legacy"
	"github.com/edgefence/edgefence/transport/modbus"
	"github.com/edgefence/edgefence/transport/serial"
)

// The PLC of RunFigure1PLC: its unit id and its line's rate.
const (
	PLCUnit = 5
	PLCBaud = 19200
)

// plcProfile is the PLC's device profile, written into the run's dir (the
// sandbox binary must not need the source tree): edgefence-devsim's Modbus
// unit is a bank of holding registers, so its profile maps one of them,
// the setpoint, like configs/profiles/hvac-controller.yaml does.
const plcProfile = `# The PLC of the sandbox's Figure 1 on a fieldbus (edgefence-devsim --modbus-rtu):
# a bank of holding registers; register 0 is the setpoint in tenths of a degree.
model: sandbox-plc
description: setpoint register of a PLC that cannot check tokens
fields:
  - name: setpoint
    table: holding
    address: 0
    type: int16
    scale: 0.1
    unit: °C
    writable: true
    verify: true
`

// RunFigure1PLC runs Figure 1 in Modbus mode (Figure1Config.Modbus)
// against real processes only, with no peer from outside the module (what
// the demo runs): a PLC, unit PLCUnit served by `edgefence-devsim
// --modbus-rtu` (the Go slave, devices/legacy.Slave), on drop 0 of an
// RS485 line at PLCBaud made in cfg.Dir, with gateway B on the line's
// master end. Once the agents have stopped, a transport/modbus bus master
// opened on that end reads the register back (Figure1Result.Registers and
// Values); the PLC is then stopped and its log of applied writes read
// (Figure1Result.Applied, device "unit-5"). cfg.Devices is one id
// (default plc-1); cfg.Modbus must be nil; DevsimBin is required.
func RunFigure1PLC(ctx context.Context, cfg Figure1Config) (*Figure1Result, error) {
	if cfg.Modbus != nil || cfg.DevsimBin == "" || cfg.Dir == "" {
		return nil, errors.New("sandbox: figure 1 on a PLC: DevsimBin and Dir are required, Modbus is the run's")
	}
	if len(cfg.Devices) == 0 {
		cfg.Devices = []string{"plc-1"}
	}
	profPath, lineDir := filepath.Join(cfg.Dir, "plc-profile.yaml"), filepath.Join(cfg.Dir, "rs485")
	if err := os.WriteFile(profPath, []byte(plcProfile), 0o644); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(lineDir, 0o755); err != nil {
		return nil, err
	}
	line, err := NewRS485(RS485Config{Baud: PLCBaud, Drops: 1, Dir: lineDir})
	if err != nil {
		return nil, err
	}
	defer line.Close()
	appliedPath := filepath.Join(cfg.Dir, "plc-applied.jsonl")
	plc, err := StartProc("plc", filepath.Join(cfg.Dir, "plc.log"), nil, cfg.DevsimBin, "--modbus-rtu", line.Drops[0],
		"--modbus-units", strconv.Itoa(PLCUnit), "--modbus-baud", strconv.Itoa(PLCBaud), "--log", appliedPath)
	if err != nil {
		return nil, err
	}
	defer func() { _ = plc.Stop(10 * time.Second) }() // the error paths; stopped below otherwise
	if err := plc.WaitLine(ctx, "ready"); err != nil {
		return nil, fmt.Errorf("sandbox: the PLC (edgefence-devsim --modbus-rtu): %w", err)
	}
	cfg.Modbus = &Figure1Modbus{RTU: line.Master, Baud: PLCBaud, Unit: PLCUnit, Profile: profPath,
		Read: func(ctx context.Context, addr uint16, count int) ([]uint16, error) {
			return ReadHoldingRTU(ctx, line.Master, PLCBaud, PLCUnit, addr, count)
		}}
	res, err := RunFigure1(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := plc.Stop(10 * time.Second); err != nil {
		return nil, fmt.Errorf("sandbox: stop the PLC: %w", err)
	}
	lf, err := os.Open(appliedPath)
	if errors.Is(err, os.ErrNotExist) {
		return res, nil // it applied nothing
	}
	if err != nil {
		return nil, err
	}
	defer lf.Close()
	if res.Applied, err = legacy.ReadApplied(lf); err != nil {
		return nil, fmt.Errorf("sandbox: the PLC's applied log: %w", err)
	}
	return res, nil
}

// ReadHoldingRTU reads count holding registers of unit from addr with a
// transport/modbus bus master opened on the tty path (8N1 at baud), and
// closes it. A read is idempotent: it is tried up to three times while the
// answer is missing or corrupt.
func ReadHoldingRTU(ctx context.Context, path string, baud int, unit byte, addr uint16, count int) ([]uint16, error) {
	bus, err := modbus.OpenBus(modbus.BusConfig{Name: "read-back", RTU: &serial.PortConfig{Path: path, Baud: baud}})
	if bus == nil {
		return nil, err
	}
	defer bus.Close()
	q := &modbus.Request{Func: modbus.FuncReadHolding, Addr: addr, Count: uint16(count)}
	for range 3 {
		var r *modbus.Response
		if r, err = bus.Transact(ctx, unit, q); err == nil {
			return r.Values, nil
		}
		if ctx.Err() != nil || errors.Is(err, modbus.ErrException) {
			break
		}
	}
	return nil, fmt.Errorf("sandbox: read holding %d+%d of unit %d on %s: %w", addr, count, unit, path, err)
}
