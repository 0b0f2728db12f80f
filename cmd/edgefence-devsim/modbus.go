package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/edgefence/edgefence/devices/legacy"
)

// modbusFlags are the flags of a simulated Modbus slave: field devices
// that cannot check a token, behind their home gateway's fence table.
type modbusFlags struct {
	tcp, rtu, units *string
	baud            *int
}

// parseUnits parses --modbus-units: unit ids 1..247, comma-separated.
func parseUnits(s string) ([]byte, error) {
	var out []byte
	seen := map[byte]bool{}
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 || n > 247 {
			return nil, fmt.Errorf("--modbus-units: %q is not a unit id 1..247", f)
		}
		if seen[byte(n)] {
			return nil, fmt.Errorf("--modbus-units: unit %d twice", n)
		}
		seen[byte(n)] = true
		out = append(out, byte(n))
	}
	return out, nil
}

// runModbus serves simulated Modbus devices — units of one slave, each a
// bank of holding registers with no fence of its own — on a TCP address
// (Modbus TCP) or a tty (Modbus RTU; a pty end or a serial port whose
// reads honour deadlines), until ctx ends. Every applied write is logged
// as a JSON line (devices/legacy.Applied, the unit's id "unit-N").
func runModbus(ctx context.Context, log *slog.Logger, f modbusFlags, nregs int, logPath string, stdout io.Writer) int {
	ids, err := parseUnits(*f.units)
	if err != nil {
		log.Error("modbus", "err", err)
		return 2
	}
	applied, closeLog, err := appliedLog(logPath, stdout)
	if err != nil {
		log.Error("open applied log", "err", err)
		return 1
	}
	defer closeLog()
	units := legacy.Units{}
	unitIDs := make([]int, len(ids)) // for the log: a []byte would print as a string
	for i, u := range ids {
		units[u] = legacy.NewRegisters("unit-"+strconv.Itoa(int(u)), nregs, applied)
		unitIDs[i] = int(u)
	}
	if nregs <= 0 {
		nregs = legacy.DefaultRegisters
	}
	s := &legacy.Slave{Units: units, Baud: *f.baud, Logger: log}
	if *f.tcp != "" {
		ln, err := net.Listen("tcp", *f.tcp)
		if err != nil {
			log.Error("modbus tcp", "err", err)
			return 1
		}
		log.Info("ready", "modbus_tcp", ln.Addr().String(), "units", unitIDs, "registers", nregs)
		err = s.ServeTCP(ctx, ln)
		return stopped(log, s, err)
	}
	port, err := os.OpenFile(*f.rtu, os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		log.Error("modbus rtu", "err", err)
		return 1
	}
	defer port.Close()
	log.Info("ready", "modbus_rtu", *f.rtu, "baud", *f.baud, "units", unitIDs, "registers", nregs)
	return stopped(log, s, s.ServeRTU(ctx, port))
}

func stopped(log *slog.Logger, s *legacy.Slave, err error) int {
	st := s.Stats()
	log.Info("stopped", "requests", st.Requests, "broadcast", st.Broadcast, "foreign", st.Foreign, "bad", st.Bad)
	if err != nil {
		log.Error("modbus", "err", err)
		return 1
	}
	return 0
}
