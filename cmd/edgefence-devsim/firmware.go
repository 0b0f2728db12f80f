package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/edgefence/edgefence/devices/fwjob"
	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence/history"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// exitReboot is the exit code of a firmware device that reboots: a command
// (fw.activate, or fw.cancel of the trial it runs) asked it to restart on
// its directory, after its ack and state report went out. The supervisor
// (--firmware) starts it again at once.
const exitReboot = 3

// firmwareFlags are the flags of firmware devices: --firmware (the
// supervisor) and --firmware-device (one device, its child).
type firmwareFlags struct {
	supervise    *bool
	device       *string
	window       *time.Duration
	tries        *int
	security     *uint64
	restartDelay *time.Duration
	inProcess    *bool
	cDevice      *string
}

func newFirmwareFlags(fs *flag.FlagSet) firmwareFlags {
	return firmwareFlags{
		supervise: fs.Bool("firmware", false, "run firmware-capable devices (--devices or --count), one child process each (--firmware-device), restarted when they reboot (exit code 3) or die"),
		device:    fs.String("firmware-device", "", "run ONE firmware-capable device with this id, its state in <dir>/<id>; exits with code 3 to reboot"),
		window:    fs.Duration("fw-window", fwjob.DefaultHealthWindow, "firmware devices: the health check window of a trial boot"),
		tries:     fs.Int("fw-tries", int(fwjob.DefaultBootTries), "firmware devices: the trial boots fw.activate arms (1..255)"),
		security:  fs.Uint64("fw-security", 0, "firmware devices: the factory image's security version (first boot)"),
		restartDelay: fs.Duration("restart-delay", time.Second,
			"with --firmware: wait this long before restarting a device that died (not one that rebooted)"),
		cDevice: fs.String("c-device", "",
			"with --firmware: run each device as this C device (efsdev, make efsdev: the library's firmware job) instead of a child of this binary"),
		inProcess: fs.Bool("in-process", false,
			"with --firmware: run every device in this one process (a reboot closes and boots it again in place): for scale benchmarks; the proofs use a process per device"),
	}
}

// check returns a usage error for the firmware flags, or "".
func (f firmwareFlags) check() string {
	switch {
	case *f.tries < 1 || *f.tries > math.MaxUint8:
		return "--fw-tries must be 1..255"
	case *f.window <= 0:
		return "--fw-window must be positive"
	case *f.restartDelay < 0:
		return "--restart-delay must not be negative"
	}
	return ""
}

// runFirmwareDevice runs one firmware device until ctx ends (exit 0) or a
// command asks it to reboot (exitReboot).
func runFirmwareDevice(ctx context.Context, log *slog.Logger, f devsimFlags, creds mqtt.Config) int {
	id := *f.fw.device
	dlog := log.With("device", id)
	a, err := f.deviceAuth([]string{id})
	if err != nil {
		dlog.Error("start", "err", err)
		return 1
	}
	hist, err := deviceHistory(*f.histPath, *f.histSrc, id)
	if err != nil {
		dlog.Error("open history", "err", err)
		return 1
	}
	defer hist.Close() // after the device: deferred calls run last in, first out
	d, err := sim.StartFirmware(ctx, sim.FirmwareConfig{Device: id, Dir: filepath.Join(*f.dir, id), Broker: *f.broker,
		Prefix: *f.prefix, ClientID: *f.clientID, Window: *f.fw.window, Tries: uint8(*f.fw.tries), Security: *f.fw.security,
		PowerLoss: func() { powerLoss(dlog) }, Keys: a.keys, Root: a.root, Signer: a.signers[id], Logger: log, MQTT: creds,
		History: hist})
	log = dlog
	if err != nil {
		if ctx.Err() != nil {
			log.Info("stopped during boot", "err", err)
			return 0
		}
		log.Error("start", "err", err)
		return 1
	}
	code := 0
	if err := d.AwaitReady(ctx); err == nil {
		s := d.Boot().Status
		log.Info("ready", "devices", 1, "broker", *f.broker, "prefix", *f.prefix, "slot", s.Slot,
			"fw_state", s.State, "reason", s.Reason, "user", creds.Username)
		select {
		case <-ctx.Done():
		case <-d.RebootRequested():
			code = exitReboot
		}
	} else if ctx.Err() == nil {
		log.Error("await broker", "err", err)
		code = 1
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := d.Close(sctx); err != nil {
		log.Error("shutdown", "err", err)
		return 1
	}
	st := d.Stats()
	log.Info("stopped", "reboot", code == exitReboot, "exit_code", code, "accepted", st.Accepted, "duplicate", st.Duplicate,
		"stale", st.Stale, "invalid", st.Invalid)
	return code
}

// powerLoss is what an image marked EDGEFENCE-HEALTH=crash does: the
// device dies at once, in the middle of its health check.
func powerLoss(log *slog.Logger) {
	log.Warn("image crashes the device during its health check (power loss): SIGKILL")
	if err := syscall.Kill(os.Getpid(), syscall.SIGKILL); err != nil {
		fmt.Fprintln(os.Stderr, "edgefence-devsim: power loss:", err)
		os.Exit(137)
	}
	time.Sleep(time.Minute) // the signal is on its way
	os.Exit(137)
}

// runFirmware checks the command line of --firmware (the supervisor) or
// --firmware-device (one device) and runs it.
func runFirmware(ctx context.Context, log *slog.Logger, fs *flag.FlagSet, f devsimFlags, usage func(string) int) int {
	var ids []string
	var err error
	if *f.fw.supervise {
		ids, err = deviceIDs(*f.devices, *f.count, *f.idPrefix)
	}
	if msg := mqttUsage(fs, f, err); msg != "" {
		return usage(msg)
	}
	switch {
	case *f.fw.supervise && *f.fw.device != "":
		return usage("--firmware runs the devices of --devices or --count; --firmware-device runs one (the supervisor's child): not both")
	case *f.port != "" || *f.logPath != "" || *f.noFence:
		return usage("firmware devices take no --serial, --log or unsafe flag")
	case *f.fw.supervise && *f.clientID != "":
		return usage("--client-id names one client: --firmware's devices derive theirs from their directories")
	case *f.fw.inProcess && !*f.fw.supervise:
		return usage("--in-process runs the devices of --firmware in this process: it needs --firmware")
	case *f.fw.cDevice != "" && (!*f.fw.supervise || *f.fw.inProcess):
		return usage("--c-device runs the devices of --firmware as efsdev processes: it needs --firmware, and takes no --in-process")
	case *f.fw.device != "" && (*f.devices != "" || *f.count != 0):
		return usage("--firmware-device runs one device: no --devices or --count")
	}
	if msg := f.fw.check(); msg != "" {
		return usage(msg)
	}
	user, pass, err := mqttCredentials(*f.mqttUser, *f.mqttPassFile)
	if err != nil {
		return usage(err.Error())
	}
	creds := mqtt.Config{Username: user, Password: pass}
	switch {
	case *f.fw.inProcess:
		return runFirmwareFleet(ctx, log, f, ids, creds)
	case *f.fw.supervise:
		return runSupervisor(ctx, log, fs, f, ids)
	}
	return runFirmwareDevice(ctx, log, f, creds)
}

// deviceHistory opens the history file path for firmware device id (nil
// without a path): the device appends to it under its own source,
// source+":"+id, one write(2) per line on an O_APPEND file, so the devices'
// processes share the file (history.Create).
func deviceHistory(path, source, id string) (*history.Writer, error) {
	if path == "" {
		return nil, nil
	}
	return history.Create(path, source+":"+id)
}
