package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/edgefence/edgefence/internal/sandbox"
)

// plcDevice is the PLC's device id.
const plcDevice = "plc-1"

// demoPLC replays Figure 1 on a fieldbus (sandbox.RunFigure1PLC): a PLC
// that cannot check tokens, on an RS-485 line whose master end is gateway
// B's, B's fence table its only fence; with contrast, again with B's table
// off. base is the world's run config; the results go into run.
func demoPLC(ctx context.Context, base sandbox.Figure1Config, dir string, contrast bool, stdout io.Writer, run *demoRun) error {
	fmt.Fprintf(stdout, "\nFigure 1 once more, on a fieldbus: plc-1 is a PLC, Modbus unit %d on an RS-485 line at %d baud (a line simulator on ptys),\n"+
		"played by edgefence-devsim --modbus-rtu (the Go Modbus RTU slave, a real process). It cannot check tokens:\n"+
		"it applies every write that reaches it. Gateway B, its home, is on the line's master end; B's fence table is the\n"+
		"PLC's fence, and A's commands reach the line only through B. Both set the setpoint (holding register 0, ×0.1 °C).\n\n",
		sandbox.PLCUnit, sandbox.PLCBaud)
	res, err := demoPLCRun(ctx, base, filepath.Join(dir, "plc"), "/edgefence/plc", false)
	if err != nil {
		return err
	}
	run.PLC = res
	if err := res.CheckFenced(); err != nil {
		return fmt.Errorf("the fence table did not hold: %w", err)
	}
	if slices.Contains(plcWrites(res), uint16(sandbox.SetpointLate*10)) {
		return fmt.Errorf("the fence table did not hold: the PLC applied %s", plcApplied(res))
	}
	fmt.Fprintf(stdout, "\n=> on the fieldbus: B's fence table refused A's late write (%s) before the bus; register 0 keeps B's %d (setpoint %g);\n"+
		"   the PLC's log of applied writes: %s — A's %d never reached the line.\n",
		res.Late[plcDevice].Verdict, res.Registers[0], sandbox.SetpointB, plcApplied(res), uint16(sandbox.SetpointLate*10))
	if !contrast {
		return nil
	}

	fmt.Fprintf(stdout, "\nThe same schedule on the fieldbus with B's fence table switched off:\n\n")
	if run.PLCUnfenced, err = demoPLCRun(ctx, base, filepath.Join(dir, "plc-unfenced"), "/edgefence/plc-unfenced", true); err != nil {
		return err
	}
	if r := run.PLCUnfenced; r.Corrupted() > 0 {
		fmt.Fprintf(stdout, "\n=> without B's table: A's late write went onto the line and the PLC applied it (%s): register 0 holds %d (setpoint %g), overwriting B's %d.\n",
			plcApplied(r), r.Registers[0], sandbox.SetpointLate, uint16(sandbox.SetpointB*10))
	} else {
		fmt.Fprintf(stdout, "\n=> without B's table the late write did not land this time (the agent noticed first)\n")
	}
	return nil
}

// demoPLCRun runs Figure 1 on the PLC once, in dir, under etcdPrefix.
func demoPLCRun(ctx context.Context, base sandbox.Figure1Config, dir, etcdPrefix string, noFence bool) (*sandbox.Figure1Result, error) {
	cfg := base
	cfg.Dir, cfg.NoFence, cfg.Devices = dir, noFence, []string{plcDevice}
	cfg.EtcdPrefix, cfg.MQTTPrefix = etcdPrefix, strings.TrimPrefix(etcdPrefix, "/")
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, err
	}
	return sandbox.RunFigure1PLC(ctx, cfg)
}

// plcWrites are the values the PLC applied to register 0, in order.
func plcWrites(r *sandbox.Figure1Result) []uint16 {
	var vs []uint16
	for _, a := range r.Applied {
		if a.Addr == 0 && len(a.Values) > 0 {
			vs = append(vs, a.Values[0])
		}
	}
	return vs
}

// plcApplied says plcWrites for people.
func plcApplied(r *sandbox.Figure1Result) string {
	var vs []string
	for _, v := range plcWrites(r) {
		vs = append(vs, fmt.Sprint(v))
	}
	if len(vs) == 0 {
		return "none"
	}
	return strings.Join(vs, ", ")
}
