package main

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestSwitchWindow(t *testing.T) {
	s0 := threadSwitches{1: {switches: 10, cpu: time.Millisecond}, 2: {switches: 5}, 3: {switches: 7}}
	// Thread 3 is gone, thread 4 was born; thread 2 did nothing.
	s1 := threadSwitches{1: {switches: 110, cpu: 3 * time.Millisecond}, 2: {switches: 5}, 4: {switches: 40, cpu: time.Millisecond}}
	w := s1.since(s0, 2*time.Second)
	if w.Total != 140 || w.CPU != 3*time.Millisecond {
		t.Fatalf("window: %d switches, %v CPU; want 140, 3ms", w.Total, w.CPU)
	}
	if len(w.Top) != 3 || w.Top[0].switches != 100 || w.Top[1].switches != 40 || w.Top[2].switches != 0 {
		t.Fatalf("busiest threads: %+v", w.Top)
	}
	if r := w.perSecond(); r != 70 {
		t.Errorf("rate %v, want 70/s", r)
	}
	idle := switchWindow{For: 10 * time.Second, Total: 50} // 5/s
	gross, net, top := switchesPerCommand(w, idle, 10)
	if gross != 14 || net != 13 {
		t.Errorf("per command: gross %v, net %v; want 14, 13", gross, net)
	}
	if want := "10.0 (200 µs) / 4.0 (100 µs) / 0.0 (0 µs)"; top != want {
		t.Errorf("busiest per command %q, want %q", top, want)
	}
	if g, n, top := switchesPerCommand(w, idle, 0); g != 0 || n != 0 || top != "" {
		t.Errorf("no command accepted: %v %v %q", g, n, top)
	}
}

// readThreadSwitches reads a live process: this one has threads, each
// has switched at least once by now.
func TestReadThreadSwitches(t *testing.T) {
	s := readThreadSwitches(os.Getpid())
	if len(s) == 0 {
		t.Fatal("no threads read from /proc/self/task")
	}
	var total uint64
	for _, x := range s {
		total += x.switches
	}
	if total == 0 {
		t.Errorf("%d threads, 0 switches", len(s))
	}
	if readThreadSwitches(-1) != nil {
		t.Error("a process that does not exist read as a sample")
	}
}

// startWithSlack gives the child the slack asked for (as systemd's
// TimerSlackNSec= does); without one, the child has the bench's own
// (every thread of the bench has the main thread's: none sets another),
// also after a start with a slack (the forking thread's is restored).
func TestStartWithSlack(t *testing.T) {
	b, err := os.ReadFile("/proc/self/timerslack_ns") // Linux 4.6 and later
	if err != nil {
		t.Fatal(err)
	}
	own := strings.TrimSpace(string(b))
	for _, tc := range []struct {
		slack time.Duration
		want  string
	}{{0, own}, {time.Millisecond, "1000000"}, {0, own}, {0, own}} {
		var out bytes.Buffer
		cmd := exec.Command("cat", "/proc/self/timerslack_ns")
		cmd.Stdout = &out
		if err := startWithSlack(cmd, tc.slack); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(out.String()); got != tc.want {
			t.Errorf("slack %v: the child's timer slack is %s ns, want %s", tc.slack, got, tc.want)
		}
	}
}
