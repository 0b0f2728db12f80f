package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/edgefence/edgefence/internal/backoff"
)

// PIDFile is the file in a firmware device's directory (<dir>/<id>/pid)
// where the supervisor writes the pid of the device's current process, so
// that a test or the sandbox can kill -9 or SIGSTOP that device.
const PIDFile = "pid"

// LogFile is the file in a firmware device's directory where the
// supervisor appends the device process's log (its stderr): the
// supervisor's own stderr has only its own lines, so that its one
// msg=ready line is the one a caller waits for.
const LogFile = "devsim.log"

// stopTimeout bounds a child's clean shutdown after SIGTERM; then SIGKILL.
const stopTimeout = 10 * time.Second

// supervisor runs one child process per firmware device and restarts it.
type supervisor struct {
	exe  string
	dir  string
	args []string // the flags every child gets, before --firmware-device
	// argsFor, if set, is a child's whole command line instead (the C
	// device, --c-device: efsdevArgs).
	argsFor func(id string) []string
	delay   time.Duration
	log     *slog.Logger

	mu      sync.Mutex
	waiting map[string]bool // devices not yet ready once
	ready   chan struct{}   // closed when waiting is empty
}

// supervisorOnly are the flags a child does not get.
var supervisorOnly = map[string]bool{"firmware": true, "devices": true, "count": true, "id-prefix": true,
	"restart-delay": true, "firmware-device": true, "c-device": true}

// runSupervisor runs the firmware devices ids as child processes of this
// binary until ctx ends: each is started with --firmware-device and the
// flags given here, restarted at once when it exits with exitReboot, and
// after the restart delay when it dies otherwise. It logs msg=ready once
// every device has been ready once.
func runSupervisor(ctx context.Context, log *slog.Logger, fs *flag.FlagSet, f devsimFlags, ids []string) int {
	exe, err := os.Executable()
	if err != nil {
		log.Error("supervisor: own executable", "err", err)
		return 1
	}
	s := &supervisor{exe: exe, dir: *f.dir, delay: *f.fw.restartDelay, log: log, waiting: map[string]bool{}, ready: make(chan struct{})}
	fs.Visit(func(fl *flag.Flag) {
		if !supervisorOnly[fl.Name] {
			s.args = append(s.args, "--"+fl.Name+"="+fl.Value.String())
		}
	})
	if *f.fw.cDevice != "" {
		s.exe, s.argsFor = *f.fw.cDevice, func(id string) []string { return efsdevArgs(f, id) }
	}
	for _, id := range ids {
		s.waiting[id] = true
	}
	g, gctx := errgroup.WithContext(ctx)
	for _, id := range ids {
		g.Go(func() error { return s.keep(gctx, id) })
	}
	select {
	case <-s.ready:
		log.Info("ready", "devices", len(ids), "firmware", true, "broker", *f.broker, "prefix", *f.prefix, "dir", *f.dir)
	case <-gctx.Done():
	}
	err = g.Wait()
	log.Info("stopped", "devices", len(ids))
	if err != nil {
		log.Error("supervisor", "err", err)
		return 1
	}
	return 0
}

// keep runs device id's process again and again until ctx ends. A child
// that exits with a usage error (2) ends the supervisor: it would only
// fail again.
func (s *supervisor) keep(ctx context.Context, id string) error {
	for run := 1; ; run++ {
		code, err := s.runOnce(ctx, id, run)
		switch {
		case err != nil:
			return err
		case ctx.Err() != nil:
			return nil
		case code == 2:
			return fmt.Errorf("device %s: usage error (exit code 2; see %s)", id, filepath.Join(s.dir, id, LogFile))
		case code == exitReboot:
			s.log.Info("device rebooting", "device", id)
			continue
		}
		s.log.Warn("device died; restarting", "device", id, "exit_code", code, "after", s.delay)
		if !backoff.Sleep(ctx, s.delay) {
			return nil
		}
	}
}

// runOnce starts device id's process, waits for it to exit (stopping it
// with SIGTERM, then SIGKILL after stopTimeout, when ctx ends) and returns
// its exit code (-1 for a signal).
func (s *supervisor) runOnce(ctx context.Context, id string, run int) (int, error) {
	ddir := filepath.Join(s.dir, id)
	if err := os.MkdirAll(ddir, 0o700); err != nil {
		return 0, fmt.Errorf("device %s: %w", id, err)
	}
	logf, err := os.OpenFile(filepath.Join(ddir, LogFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return 0, fmt.Errorf("device %s: %w", id, err)
	}
	defer logf.Close()
	args := append(append([]string(nil), s.args...), "--firmware-device="+id)
	if s.argsFor != nil {
		args = s.argsFor(id)
	}
	cmd := exec.Command(s.exe, args...)
	// Pdeathsig: the child dies with the supervisor, however it dies;
	// Setpgid: a terminal's ^C reaches the supervisor only, which stops
	// the children in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	pipe, err := cmd.StderrPipe()
	if err != nil {
		return 0, fmt.Errorf("device %s: %w", id, err)
	}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("device %s: start: %w", id, err)
	}
	pid := cmd.Process.Pid
	if err := writePID(ddir, pid); err != nil {
		s.log.Error("pid file", "device", id, "err", err)
	}
	s.log.Info("device started", "device", id, "pid", pid, "run", run)
	exited := make(chan struct{})
	stopped := make(chan struct{})
	go func() { // owned: ends when the child has exited
		defer close(stopped)
		s.stopOnCancel(ctx, cmd.Process, exited)
	}()
	s.copyLog(id, pipe, logf)
	werr := cmd.Wait()
	close(exited)
	<-stopped
	code := cmd.ProcessState.ExitCode()
	s.log.Info("device exited", "device", id, "pid", pid, "exit_code", code, "status", cmd.ProcessState.String())
	var ee *exec.ExitError
	if werr != nil && !errors.As(werr, &ee) {
		return 0, fmt.Errorf("device %s: wait: %w", id, werr)
	}
	return code, nil
}

// stopOnCancel sends p SIGTERM when ctx ends, and SIGKILL if it has not
// exited stopTimeout later.
func (s *supervisor) stopOnCancel(ctx context.Context, p *os.Process, exited <-chan struct{}) {
	select {
	case <-exited:
		return
	case <-ctx.Done():
	}
	_ = p.Signal(syscall.SIGTERM)
	t := time.NewTimer(stopTimeout)
	defer t.Stop()
	select {
	case <-exited:
	case <-t.C:
		s.log.Warn("device did not stop after SIGTERM; SIGKILL", "pid", p.Pid)
		_ = p.Kill()
	}
}

// copyLog appends the child's stderr to its log file until it closes, and
// notes the child's msg=ready line.
func (s *supervisor) copyLog(id string, r io.Reader, w io.Writer) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if _, err := fmt.Fprintln(w, line); err != nil {
			s.log.Warn("device log", "device", id, "err", err)
		}
		if strings.Contains(line, "msg=ready") {
			s.deviceReady(id)
		}
	}
	_, _ = io.Copy(io.Discard, r) // a line over the scanner's limit: drain, so the child never blocks
}

func (s *supervisor) deviceReady(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.waiting[id] {
		return
	}
	delete(s.waiting, id)
	if len(s.waiting) == 0 {
		close(s.ready)
	}
}

// writePID writes pid to dir/PIDFile atomically (a reader sees the old pid
// or the new one, never a partial one).
func writePID(dir string, pid int) error {
	tmp := filepath.Join(dir, PIDFile+".tmp")
	if err := os.WriteFile(tmp, []byte(strconv.Itoa(pid)+"\n"), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, PIDFile))
}

// efsdevArgs is the command line of the C device (efsdev --firmware,
// devices/firmware/linux) for device id, from the supervisor's flags: the
// same broker, prefix, credentials, trust and history as a devsim child,
// its state in <dir>/<id>.
func efsdevArgs(f devsimFlags, id string) []string {
	a := []string{"--firmware", "--mqtt", *f.broker, "--prefix", *f.prefix, "--devices", id, "--dir", filepath.Join(*f.dir, id),
		"--fw-window", fmt.Sprintf("%dms", f.fw.window.Milliseconds()), "--fw-tries", strconv.Itoa(*f.fw.tries),
		"--fw-security", strconv.FormatUint(*f.fw.security, 10)}
	opt := func(flag, v string) {
		if v != "" {
			a = append(a, flag, v)
		}
	}
	opt("--mqtt-user", *f.mqttUser)
	opt("--mqtt-password-file", *f.mqttPassFile)
	if *f.histPath != "" {
		a = append(a, "--history", *f.histPath, "--history-source", *f.histSrc+":"+id)
	}
	switch {
	case *f.trustRoot != "":
		a = append(a, "--trust-root", *f.trustRoot, "--trust-root-kid", *f.trustRootKid)
		opt("--certs", *f.certs)
		opt("--revocations", *f.revocations)
		opt("--epoch", *f.epoch)
		opt("--device-keys", *f.deviceKeys)
	case *f.resetRoot != "":
		a = append(a, "--reset-root", *f.resetRoot, "--trust-root-kid", *f.trustRootKid)
	}
	return a
}
