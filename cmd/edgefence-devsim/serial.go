package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/edgefence/edgefence/devices/legacy"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/transport/serial"
)

// runSerial serves one legacy register device on a serial port until ctx
// ends: Modbus PDUs in edgefence serial frames, applied without any fence
// (the gateway's fence table is the fence), every applied write logged as a
// JSON line. The port may come and go (a USB adapter unplugged): it is
// reopened and serving resumes, remembering the last transaction so that a
// retried request is answered again, not applied twice.
func runSerial(ctx context.Context, log *slog.Logger, path, id string, nregs int, logPath string, stdout io.Writer) int {
	if err := fence.ValidateDeviceID(id); err != nil {
		log.Error("device id", "err", err)
		return 2
	}
	applied, closeLog, err := appliedLog(logPath, stdout)
	if err != nil {
		log.Error("open applied log", "err", err)
		return 1
	}
	defer closeLog()
	dev := legacy.NewRegisters(id, nregs, applied)
	conn, err := serial.OpenConn(serial.ConnConfig{Port: serial.PortConfig{Path: path}, Logger: log})
	switch {
	case conn == nil:
		log.Error("serial port", "err", err)
		return 2
	case err != nil:
		log.Warn("serial port not there yet; waiting for it", "port", path, "err", err)
	}
	defer conn.Close()
	r := &serial.Responder{Handler: dev.Handle}
	log.Info("ready", "device", id, "serial", path, "registers", nregs)
	for ctx.Err() == nil {
		err := r.Serve(ctx, conn)
		if err == nil || ctx.Err() != nil {
			break
		}
		if errors.Is(err, serial.ErrClosed) {
			log.Error("serial", "err", err)
			return 1
		}
		log.Warn("serial link interrupted; resuming", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	st := r.Stats()
	writes, bad := dev.Stats()
	log.Info("stopped", "writes", writes, "refused", bad, "stats", fmt.Sprintf("%+v", st))
	return 0
}

// appliedLog opens the applied-writes log at path (appending), or returns
// stdout without one.
func appliedLog(path string, stdout io.Writer) (io.Writer, func(), error) {
	if path == "" {
		return stdout, func() {}, nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, err
	}
	return f, func() { f.Close() }, nil
}
