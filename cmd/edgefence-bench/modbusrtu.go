package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/edgefence/edgefence/devices/legacy"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/transport/modbus"
	"github.com/edgefence/edgefence/transport/serial"
)

// modbusRTUConfig configures the modbus-rtu benchmark: the bare bus master
// (transport/modbus) on the master end of a paced RS-485 line
// (sandbox.RS485, 8N1) and the Go slave (devices/legacy) on a drop.
type modbusRTUConfig struct {
	Bauds []int
	N     int // transactions per baud rate and operation
	Dir   string
	Log   io.Writer
}

// runModbusRTU measures 1-register reads and writes at each baud rate
// against the line's limit.
func runModbusRTU(ctx context.Context, cfg modbusRTUConfig) ([]sandbox.LineRate, error) {
	var out []sandbox.LineRate
	for _, baud := range cfg.Bauds {
		rates, err := modbusRTUAt(ctx, cfg, baud)
		out = append(out, rates...)
		if err != nil {
			return out, fmt.Errorf("modbus-rtu at %d baud: %w", baud, err)
		}
	}
	return out, nil
}

func modbusRTUAt(ctx context.Context, cfg modbusRTUConfig, baud int) (_ []sandbox.LineRate, err error) {
	dir, err := os.MkdirTemp(cfg.Dir, "rs485-")
	if err != nil {
		return nil, err
	}
	l, err := sandbox.NewRS485(sandbox.RS485Config{Baud: baud, Drops: 1, Dir: dir})
	if err != nil {
		return nil, err
	}
	defer l.Close()
	sctx, cancel := context.WithCancel(ctx)
	done, err := l.ServeSlave(sctx, 0, &legacy.Slave{Units: legacy.Units{1: legacy.NewRegisters("u1", 16, nil)}})
	if err != nil {
		cancel()
		return nil, err
	}
	defer func() {
		cancel()
		err = errors.Join(err, <-done)
	}()
	bus, err := modbus.OpenBus(modbus.BusConfig{Name: "bench", RTU: &serial.PortConfig{Path: l.Master, Baud: baud}})
	if err != nil {
		return nil, err
	}
	defer bus.Close()
	var out []sandbox.LineRate
	for _, op := range []struct {
		name string
		q    modbus.Request
	}{
		{"read 1 register (0x03)", modbus.Request{Func: modbus.FuncReadHolding, Addr: 3, Count: 1}},
		{"write 1 register (0x06)", modbus.Request{Func: modbus.FuncWriteSingle, Addr: 3, Values: []uint16{42}}},
	} {
		fmt.Fprintf(cfg.Log, "modbus-rtu: %d baud, %s × %d\n", baud, op.name, cfg.N)
		r, err := l.MeasureLineRate(ctx, bus, 1, &op.q, op.name, cfg.N)
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, nil
}

func printModbusRTU(w io.Writer, rates []sandbox.LineRate) {
	fmt.Fprintln(w, "### Modbus RTU at the line rate: the bus master and the Go slave on a paced RS-485 line")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| baud | bits/char | transaction | bytes req+rsp | n | errors | tx/s | limit tx/s | ratio | ms/tx | limit ms/tx | CPU µs/tx |")
	fmt.Fprintln(w, "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rates {
		fmt.Fprintf(w, "| %d | %d | %s | %d+%d | %d | %d | %.1f | %.1f | %.2f | %.2f | %.2f | %d |\n", r.Baud, r.BitsPerChar, r.Op,
			r.ReqBytes, r.RspBytes, r.N, r.Errors, r.TxPerSec(), r.LimitTxPerSec(), r.Ratio(),
			float64(r.PerTx().Microseconds())/1000, float64(r.Limit.Microseconds())/1000, r.CPUPerTx().Microseconds())
	}
	fmt.Fprintln(w)
}
