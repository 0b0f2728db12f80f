package hiccup_test

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/edgefence/edgefence/agent/hiccup"
	"github.com/edgefence/edgefence/internal/cputime"
)

// TestWakesAndStops: the meter wakes every interval, reports lateness
// of 0 or more, and returns once ctx ends.
func TestWakesAndStops(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	var lates []time.Duration
	hiccup.Run(ctx, 10*time.Millisecond, func(late time.Duration, _ time.Time) {
		if lates = append(lates, late); len(lates) == 3 {
			cancel()
		}
	})
	for _, l := range lates {
		if l < 0 {
			t.Errorf("negative lateness %v", l)
		}
	}
}

// TestSeesFrozenProcess: a real SIGSTOP of a child process running the
// meter shows up as one wake late by about the freeze.
func TestSeesFrozenProcess(t *testing.T) {
	if os.Getenv("HICCUP_CHILD") == "1" {
		child()
		return
	}
	// The child gives up by itself after childLimit: no hang, whatever
	// happens to the signals.
	cmd := exec.Command(os.Args[0], "-test.run=^TestSeesFrozenProcess$", "-test.timeout="+(2*childLimit).String())
	cmd.Env = append(os.Environ(), "HICCUP_CHILD=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	if l := <-lines; l != "ready" { // the meter has woken once
		t.Fatalf("child said %q, want ready", l)
	}
	// Freeze the child; should a freeze go unseen (it never did alone,
	// but once in a loaded suite), freeze it again, up to three times.
	const freeze = 700 * time.Millisecond
	for attempt := 1; ; attempt++ {
		if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		time.Sleep(freeze)
		if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("child exited without reporting a stall")
			}
			ms, err := strconv.Atoi(l)
			if err != nil {
				t.Fatalf("child printed %q: %v", l, err)
			}
			// At least most of the freeze (a timer set just before it
			// wakes up to one interval into it); no upper bound: a slow
			// machine adds to it.
			if late := time.Duration(ms) * time.Millisecond; late < freeze-100*time.Millisecond {
				t.Errorf("max lateness %v after a %v freeze", late, freeze)
			}
			return
		case <-time.After(10 * time.Second):
			if attempt == 3 {
				t.Fatalf("no stall seen after %d freezes of %v", attempt, freeze)
			}
			t.Logf("freeze %d not seen; again", attempt)
		}
	}
}

// childLimit bounds the child's wait for a stall.
const childLimit = time.Minute

// child runs the meter, prints "ready" at its first wake (so that the
// freeze cannot come before the meter runs), then the first lateness above
// 300 ms, in ms, each on a line; it gives up after childLimit.
func child() {
	ctx, cancel := context.WithTimeout(context.Background(), childLimit)
	defer cancel()
	ready := false
	hiccup.Run(ctx, 50*time.Millisecond, func(late time.Duration, _ time.Time) {
		switch {
		case !ready:
			ready = true
			os.Stdout.WriteString("ready\n")
		case late > 300*time.Millisecond:
			os.Stdout.WriteString(strconv.Itoa(int(late/time.Millisecond)) + "\n")
			cancel()
		}
	})
}

// BenchmarkIdleCPU measures the meter's CPU cost on an otherwise idle
// process: each op is one second of the meter at the agent's intervals
// (100 ms: lease_ttl 4 s and below; 250 ms: the default 10 s);
// cpu-us/s is the process's user+system CPU per second of it,
// baseline-us/s the same second without the meter.
//
//	go test ./agent/hiccup -run '^$' -bench IdleCPU -benchtime 10x
func BenchmarkIdleCPU(b *testing.B) {
	cpu := cputime.Process
	for _, interval := range []time.Duration{100 * time.Millisecond, 250 * time.Millisecond} {
		b.Run(interval.String(), func(b *testing.B) {
			var with, without time.Duration
			for b.Loop() {
				c0 := cpu()
				time.Sleep(time.Second)
				c1 := cpu()
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				hiccup.Run(ctx, interval, func(time.Duration, time.Time) {})
				cancel()
				without += c1 - c0
				with += cpu() - c1
			}
			b.ReportMetric(float64(with.Microseconds())/float64(b.N), "cpu-us/s")
			b.ReportMetric(float64(without.Microseconds())/float64(b.N), "baseline-us/s")
		})
	}
}
