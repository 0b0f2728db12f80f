package modbustest

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// Write is one write a slave applied to its datastore, as its write log
// (Options.WriteLog) recorded it: the witness that a write was applied
// once, twice or never, whatever its master was told.
type Write struct {
	PID    int // the slave process: a Restart changes it
	Unit   byte
	Table  Table // Coils or HoldingRegisters
	Addr   uint16
	Values []uint16 // coils: 0 or 1
}

// logLine is a line of the write log (server.py).
type logLine struct {
	PID    int      `json:"pid"`
	Unit   byte     `json:"unit"`
	Table  string   `json:"table"` // holding, coil
	Addr   uint16   `json:"addr"`
	Values []uint16 `json:"values"`
}

// tables maps the write log's table names to mbpoll's.
var tables = map[string]Table{"holding": HoldingRegisters, "coil": Coils, "input": InputRegisters, "discrete": DiscreteInputs}

// faults adds the options' faults and the stall file to a slave's spec.
func (s *Server) faults(spec map[string]any) {
	if s.opts.WriteLog {
		spec["write_log"] = s.writeLog()
	}
	if len(s.opts.AnswerAs) > 0 {
		as := make(map[string]int, len(s.opts.AnswerAs))
		for k, v := range s.opts.AnswerAs {
			as[strconv.Itoa(int(k))] = int(v)
		}
		spec["answer_as"] = as
	}
	if s.opts.Busy > 0 {
		spec["busy"] = s.opts.Busy
	}
	spec["stall"] = s.stallFile()
}

func (s *Server) writeLog() string  { return filepath.Join(s.dir, "writes.jsonl") }
func (s *Server) stallFile() string { return filepath.Join(s.dir, "stall") }

// Writes returns the writes the slave applied since it was started, across
// restarts, in order. It fails t unless the slave has Options.WriteLog.
func (s *Server) Writes(t testing.TB) []Write {
	t.Helper()
	if !s.opts.WriteLog {
		t.Fatal("modbustest: Writes of a slave without Options.WriteLog")
	}
	ws, err := readWrites(s.writeLog())
	if err != nil {
		t.Fatalf("modbustest: %v", err)
	}
	return ws
}

// readWrites parses a write log; a missing one is empty.
func readWrites(path string) ([]Write, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Write
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		var l logLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return nil, fmt.Errorf("write log %s:%d: %w", path, n, err)
		}
		tbl := tables[l.Table]
		if tbl == "" {
			return nil, fmt.Errorf("write log %s:%d: table %q", path, n, l.Table)
		}
		out = append(out, Write{PID: l.PID, Unit: l.Unit, Table: tbl, Addr: l.Addr, Values: l.Values})
	}
	return out, sc.Err()
}

// WritesTo returns the values of the writes applied at unit's table addr.
func WritesTo(ws []Write, unit byte, table Table, addr uint16) [][]uint16 {
	var out [][]uint16
	for _, w := range ws {
		if w.Unit == unit && w.Table == table && w.Addr == addr {
			out = append(out, w.Values)
		}
	}
	return out
}

// Stall makes the slave, while on, apply each write and then hold its
// answer (the master waits, and times out): kill it then (Stop) and the
// write was applied but never answered. Off lets the held answer go.
func (s *Server) Stall(t testing.TB, on bool) {
	t.Helper()
	var err error
	if on {
		err = os.WriteFile(s.stallFile(), nil, 0o600)
	} else if err = os.Remove(s.stallFile()); errors.Is(err, fs.ErrNotExist) {
		err = nil
	}
	if err != nil {
		t.Fatalf("modbustest: stall: %v", err)
	}
}
