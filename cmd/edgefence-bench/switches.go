package main

import (
	"bufio"
	"cmp"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Thread wakes of the agent (issue 17): on a VM every sleep and wake of a
// thread costs tens of µs of CPU, so the rss benchmark counts the agent's
// context switches per thread (voluntary + involuntary, from
// /proc/PID/task/TID/status) and each thread's time on a CPU (the first
// field of /proc/PID/task/TID/schedstat, ns) over its idle and load
// windows.

// threadSample is one thread's context switches and CPU time so far.
type threadSample struct {
	switches uint64
	cpu      time.Duration
}

// threadSwitches is a sample of every thread of a process, by TID.
type threadSwitches map[int]threadSample

// readThreadSwitches samples pid's threads; nil if unreadable.
func readThreadSwitches(pid int) threadSwitches {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	s := make(threadSwitches, len(ents))
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if n, ok := taskSwitches(filepath.Join(dir, e.Name(), "status")); ok {
			s[tid] = threadSample{switches: n, cpu: taskCPU(filepath.Join(dir, e.Name(), "schedstat"))}
		}
	}
	return s
}

// taskSwitches reads voluntary_ctxt_switches + nonvoluntary_ctxt_switches
// of one task's status file.
func taskSwitches(path string) (uint64, bool) {
	f, err := os.Open(path)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	var n uint64
	found := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || (k != "voluntary_ctxt_switches" && k != "nonvoluntary_ctxt_switches") {
			continue
		}
		x, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		if err != nil {
			return 0, false
		}
		n += x
		found++
	}
	return n, found == 2
}

// taskCPU reads a task's time on a CPU from its schedstat file; 0 if
// unreadable.
func taskCPU(path string) time.Duration {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	f, _, _ := strings.Cut(string(b), " ")
	ns, err := strconv.ParseInt(f, 10, 64)
	if err != nil {
		return 0
	}
	return time.Duration(ns)
}

// switchWindow is what the agent's threads did between two samples: the
// total switches and CPU, and the busiest threads (by switches, highest
// first) with their CPU.
type switchWindow struct {
	For   time.Duration
	Total uint64
	CPU   time.Duration
	Top   []threadSample // at most 3
}

// since returns the window from s0 to s (threads born in between count
// from 0; threads gone are not counted).
func (s threadSwitches) since(s0 threadSwitches, d time.Duration) switchWindow {
	w := switchWindow{For: d}
	var each []threadSample
	for tid, n := range s {
		n.switches -= min(n.switches, s0[tid].switches)
		n.cpu -= min(n.cpu, s0[tid].cpu)
		w.Total += n.switches
		w.CPU += n.cpu
		each = append(each, n)
	}
	slices.SortFunc(each, func(a, b threadSample) int { return cmp.Compare(b.switches, a.switches) })
	w.Top = each[:min(3, len(each))]
	return w
}

// perSecond is the window's total rate.
func (w switchWindow) perSecond() float64 {
	if w.For <= 0 {
		return 0
	}
	return float64(w.Total) / w.For.Seconds()
}

// switchesPerCommand returns the load window's switches per accepted
// command, net of the idle window's rate over as long, and its busiest
// threads' per command (switches, and CPU µs in brackets), as text.
func switchesPerCommand(load, idle switchWindow, accepted int) (gross, net float64, top string) {
	if accepted == 0 {
		return 0, 0, ""
	}
	a := float64(accepted)
	gross = float64(load.Total) / a
	net = max(float64(load.Total)-idle.perSecond()*load.For.Seconds(), 0) / a
	parts := make([]string, len(load.Top))
	for i, n := range load.Top {
		parts[i] = fmt.Sprintf("%.1f (%.0f µs)", float64(n.switches)/a, float64(n.cpu)/float64(time.Microsecond)/a)
	}
	return gross, net, strings.Join(parts, " / ")
}

// Linux's prctl options for a thread's timer slack.
const (
	prSetTimerSlack = 29
	prGetTimerSlack = 30
)

// startWithSlack starts cmd with its timer slack set to slack (0: as the
// bench's), as systemd's TimerSlackNSec= does: the slack of the thread
// that forks is inherited by the child, kept across exec and inherited by
// every thread the child makes — the Go runtime's sysmon included, whose
// 20 µs sleeps while the agent is busy are a thread wake each.
func startWithSlack(cmd *exec.Cmd, slack time.Duration) error {
	if slack <= 0 {
		return cmd.Start()
	}
	runtime.LockOSThread() // the fork happens on this thread
	defer runtime.UnlockOSThread()
	old, _, _ := syscall.RawSyscall(syscall.SYS_PRCTL, prGetTimerSlack, 0, 0)
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetTimerSlack, uintptr(slack.Nanoseconds()), 0); errno != 0 {
		return fmt.Errorf("timer slack %v: %w", slack, errno)
	}
	defer syscall.RawSyscall(syscall.SYS_PRCTL, prSetTimerSlack, old, 0)
	return cmd.Start()
}
