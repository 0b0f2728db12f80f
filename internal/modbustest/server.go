package modbustest

import (
	"bufio"
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

//go:embed server.py
var serverScript []byte

// Python is the interpreter that sees Debian's pymodbus (a python3 earlier
// on PATH, pyenv's, does not).
const Python = "/usr/bin/python3"

// startWait bounds a slave's start: Python and pymodbus take about a
// second to import on a loaded machine.
const startWait = 30 * time.Second

// Options describe a slave. The zero value is unit 1 with blocks of 100 at
// 19,200 baud 8N1.
type Options struct {
	Units    []byte // the unit ids it answers; default {1}
	Size     int    // addresses in each block (hr, ir, co, di), from 0; default 100
	Baud     int    // RTU: default 19200
	Parity   string // RTU: "N" (default), "E" or "O"
	StopBits int    // RTU: default 1

	// Faults and their witness, for fault tests (faults.go):
	WriteLog bool          // record every write the slave applies (Server.Writes)
	AnswerAs map[byte]byte // answers to unit k carry unit id AnswerAs[k]: a foreign unit answering
	Busy     int           // the first Busy writes after each start are answered "slave device busy", not applied
}

func (o Options) withDefaults() Options {
	if len(o.Units) == 0 {
		o.Units = []byte{1}
	}
	if o.Size == 0 {
		o.Size = 100
	}
	if o.Baud == 0 {
		o.Baud = 19200
	}
	if o.Parity == "" {
		o.Parity = "N"
	}
	if o.StopBits == 0 {
		o.StopBits = 1
	}
	return o
}

// Initial is the value holding and input register addr of unit starts with.
func Initial(unit byte, addr uint16) uint16 { return uint16(unit)<<8 | addr&0xff }

// Server is a running (or stopped) pymodbus slave.
type Server struct {
	t    testing.TB
	opts Options
	path string // RTU: the tty it serves; "" for TCP
	port int    // TCP: the port it serves
	dir  string // its write log and stall file (faults.go)

	mu     sync.Mutex
	cmd    *exec.Cmd
	stderr *bytes.Buffer
}

// StartRTU starts a slave on the tty at path (one end of a PtyPair) at
// opts' baud rate and parity. It is killed when the test ends.
func StartRTU(t testing.TB, path string, opts Options) *Server {
	t.Helper()
	Require(t)
	s := &Server{t: t, opts: opts.withDefaults(), path: path, dir: t.TempDir()}
	s.start(t)
	t.Cleanup(s.Stop)
	return s
}

// StartTCP starts a slave on a free port of 127.0.0.1 (Addr). It is killed
// when the test ends.
func StartTCP(t testing.TB, opts Options) *Server {
	t.Helper()
	Require(t)
	s := &Server{t: t, opts: opts.withDefaults(), dir: t.TempDir()}
	s.start(t)
	t.Cleanup(s.Stop)
	return s
}

// Addr is a TCP slave's host:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Stop kills the slave (SIGKILL: no goodbye on the line or the
// connection) and waits for it. A stopped slave can be restarted.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	if s.t.Failed() && s.stderr.Len() > 0 {
		s.t.Logf("pymodbus stderr:\n%s", s.stderr.String())
	}
	s.cmd = nil
}

// Restart kills the slave if it runs and starts it again on the same tty
// or port, with its registers back to their initial values. A failure to
// start fails t (the running test, perhaps a subtest of the one that
// started the slave).
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Stop()
	s.start(t)
}

func (s *Server) start(t testing.TB) {
	t.Helper()
	units := make([]int, len(s.opts.Units)) // not []byte: JSON would make that base64
	for i, u := range s.opts.Units {
		units[i] = int(u)
	}
	spec := map[string]any{"units": units, "hr": s.opts.Size, "ir": s.opts.Size, "co": s.opts.Size, "di": s.opts.Size}
	if s.path != "" {
		spec["rtu"], spec["baud"], spec["parity"], spec["stop_bits"] = s.path, s.opts.Baud, s.opts.Parity, s.opts.StopBits
	} else {
		spec["tcp"] = s.port // 0 the first time: the slave picks a free port
	}
	s.faults(spec)
	arg, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(t.TempDir(), "server.py")
	if err := os.WriteFile(script, serverScript, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(Python, script, string(arg))
	stderr := &bytes.Buffer{}
	cmd.Stderr = stderr // read only after Wait
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("modbustest: start pymodbus: %v", err)
	}
	port, err := awaitReady(out)
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("modbustest: pymodbus %s: %v\n%s", arg, err, stderr.String())
	}
	if s.path == "" {
		s.port = port
	}
	s.mu.Lock()
	s.cmd, s.stderr = cmd, stderr
	s.mu.Unlock()
}

// awaitReady reads the slave's "ready PORT" line.
func awaitReady(out interface{ Read([]byte) (int, error) }) (int, error) {
	type ready struct {
		port int
		err  error
	}
	ch := make(chan ready, 1)
	go func() {
		line, err := bufio.NewReader(out).ReadString('\n')
		if err != nil {
			ch <- ready{err: fmt.Errorf("no ready line: %w", err)}
			return
		}
		port, err := strconv.Atoi(strings.TrimPrefix(strings.TrimSpace(line), "ready "))
		ch <- ready{port, err}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), startWait)
	defer cancel()
	select {
	case r := <-ch:
		return r.port, r.err
	case <-ctx.Done():
		return 0, fmt.Errorf("not ready after %v", startWait)
	}
}
