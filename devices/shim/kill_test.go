package shim_test

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/edgefence/edgefence/devices/shim"
	"github.com/edgefence/edgefence/fence"
)

// helperEnv names the database file a re-executed test binary drives until
// it is killed (see helperMain).
const helperEnv = "EDGEFENCE_SHIM_KILL_HELPER"

// killSchedule is the k-th command the helper sends, k from 0: eight seqs
// under each token, tokens from 100 up, as a holder hand-over every eight
// commands would produce.
func killSchedule(k uint64) fence.Mark {
	return fence.Mark{Token: fence.Token(100 + k/8), Seq: k%8 + 1}
}

func killIndex(m fence.Mark) (uint64, bool) {
	if m == (fence.Mark{}) {
		return 0, false
	}
	return (uint64(m.Token)-100)*8 + m.Seq - 1, true
}

// helperMain runs in the child: resume the schedule after the stored mark
// and drive commands through the shim for ever, printing each ack after
// Handle returns. Interleaved redeliveries and stale commands must not
// disturb the count.
func helperMain() int {
	path := os.Getenv(helperEnv)
	s, err := shim.Open(path, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 2
	}
	m, err := s.Mark("dev-k")
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 2
	}
	k, ok := killIndex(m)
	if ok {
		k++
	}
	deadline := time.Now().Add(30 * time.Second) // never outlive a broken parent for long
	if os.Getenv(batchEnv) != "" {
		return helperBatches(s, k, deadline)
	}
	for ; time.Now().Before(deadline); k++ {
		c := killSchedule(k)
		raw, _ := fence.MarshalEnvelope(&fence.Envelope{V: fence.Version, Device: "dev-k", Token: c.Token, Seq: c.Seq,
			ID: fmt.Sprintf("k-%d", k), Kind: "ok"})
		ack := s.Handle("dev-k", raw, counter{})
		fmt.Printf("ack %d %d %d %s\n", k, ack.Token, ack.Seq, ack.Verdict)
		if k%3 == 0 { // redelivery
			if a := s.Handle("dev-k", raw, counter{}); a.Verdict != fence.Duplicate {
				fmt.Printf("bad redelivery %d %s\n", k, a.Verdict)
			}
		}
		if k%5 == 0 && c.Token > 100 { // a frozen older holder
			old, _ := fence.MarshalEnvelope(&fence.Envelope{V: fence.Version, Device: "dev-k", Token: c.Token - 1, Seq: 99,
				ID: "old", Kind: "ok"})
			if a := s.Handle("dev-k", old, counter{}); a.Verdict != fence.Stale {
				fmt.Printf("bad stale %d %s\n", k, a.Verdict)
			}
		}
	}
	s.Close()
	return 0
}

// TestKill9 kills a process that applies commands through the shim at random
// moments and checks after each kill that the mark never falls behind an
// acknowledged command, runs at most one command ahead (the one in flight),
// and that the effect (a TxApplier) was applied exactly once per command up
// to the mark.
func TestKill9(t *testing.T) {
	testKill9(t, 1)
}

// testKill9 is TestKill9 with the helper deciding batches of batch
// commands (1: one by one with Handle): the mark may run ahead of the
// last printed ack by at most the batch in flight.
func testKill9(t *testing.T, batch uint64) {
	if testing.Short() {
		t.Skip("re-executes the test binary")
	}
	path := filepath.Join(t.TempDir(), "fence.db")
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	var last fence.Mark // mark after the previous round
	for round := range 12 {
		acked, killedAfter := killRound(t, path, time.Duration(rng.IntN(60_000))*time.Microsecond, batch > 1)

		s, err := shim.Open(path, nil)
		if err != nil {
			t.Fatalf("round %d: reopen: %v", round, err)
		}
		m := mark(t, s, "dev-k")
		st := counterOf(t, s, "dev-k")
		s.Close()

		got, ok := killIndex(m)
		floor := last
		if len(acked) > 0 {
			floor = acked[len(acked)-1]
		}
		lastK, lastOK := killIndex(floor)
		switch {
		case !ok && lastOK:
			t.Fatalf("round %d: mark lost (acked up to %v)", round, floor)
		case ok && lastOK && got < lastK:
			t.Fatalf("round %d: mark %v fell behind acknowledged %v", round, m, floor)
		case ok && lastOK && got > lastK+batch:
			t.Fatalf("round %d: mark %v more than %d commands beyond the last acked %v", round, m, batch, floor)
		case ok && !lastOK && got >= batch:
			t.Fatalf("round %d: mark %v with nothing acked", round, m)
		}
		// Exactly once: one effect per schedule command up to the mark.
		if want := got + 1; ok && (st.n != want || st.last != m) || !ok && st.n != 0 {
			t.Fatalf("round %d: state %+v, mark %v: want %d effects ending at the mark", round, st, m, want)
		}
		ahead := ok && (!lastOK || got > lastK)
		t.Logf("round %d: killed after %v with %d acks printed; mark %v (in-flight command committed: %v), %d effects",
			round, killedAfter, len(acked), m, ahead, st.n)
		last = m
	}
}

// batchEnv makes the helper decide its commands in batches (helperBatches).
const batchEnv = "EDGEFENCE_SHIM_KILL_BATCH"

// killBatch is the schedule commands in one batch of helperBatches.
const killBatch = 4

// helperBatches is helperMain's loop through ProcessBatch: killBatch
// schedule commands from k, a redelivery of the first and a frozen older
// holder's command in one batch, the acks printed once it returned.
func helperBatches(s *shim.Shim, k uint64, deadline time.Time) int {
	for ; time.Now().Before(deadline); k += killBatch {
		var reqs []shim.Request
		for i := range uint64(killBatch) {
			c := killSchedule(k + i)
			raw, _ := fence.MarshalEnvelope(&fence.Envelope{V: fence.Version, Device: "dev-k", Token: c.Token, Seq: c.Seq,
				ID: fmt.Sprintf("k-%d", k+i), Kind: "ok"})
			reqs = append(reqs, shim.Request{Device: "dev-k", Raw: raw})
		}
		old, _ := fence.MarshalEnvelope(&fence.Envelope{V: fence.Version, Device: "dev-k", Token: 99, Seq: 1, ID: "old", Kind: "ok"})
		reqs = append(reqs, reqs[0], shim.Request{Device: "dev-k", Raw: old})
		res := s.ProcessBatch(reqs, counter{})
		for i := range uint64(killBatch) {
			a := res[i].Ack
			fmt.Printf("ack %d %d %d %s\n", k+i, a.Token, a.Seq, a.Verdict)
		}
		if v := res[killBatch].Ack.Verdict; v != fence.Duplicate {
			fmt.Printf("bad redelivery %d %s\n", k, v)
		}
		if v := res[killBatch+1].Ack.Verdict; v != fence.Stale {
			fmt.Printf("bad stale %d %s\n", k, v)
		}
	}
	s.Close()
	return 0
}

// TestKill9Batches is TestKill9 through ProcessBatch: every printed ack's
// mark survives the kill (the batch's commit came first), the mark runs
// at most one batch ahead, and each command took effect exactly once.
func TestKill9Batches(t *testing.T) {
	testKill9(t, killBatch)
}

// killRound starts the helper, lets it run for d after its first ack, kills it
// with SIGKILL and returns the acks it printed.
func killRound(t *testing.T, path string, d time.Duration, batches bool) ([]fence.Mark, time.Duration) {
	t.Helper()
	env := []string{helperEnv + "=" + path}
	if batches {
		env = append(env, batchEnv+"=1")
	}
	var acked []fence.Mark
	runKilled(t, env, d, func(l string) {
		var k uint64
		var tok fence.Token
		var seq uint64
		var v string
		if _, err := fmt.Sscanf(l, "ack %d %d %d %s", &k, &tok, &seq, &v); err != nil {
			t.Errorf("helper said %q", l)
			return
		}
		if v != "accepted" || killSchedule(k) != (fence.Mark{Token: tok, Seq: seq}) {
			t.Errorf("helper acked %q", l)
		}
		acked = append(acked, fence.Mark{Token: tok, Seq: seq})
	})
	return acked, d
}

// runKilled re-executes the test binary with env added, feeds each line it
// prints to parse, lets it run for d after its first line, and kills it
// with SIGKILL.
func runKilled(t *testing.T, env []string, d time.Duration, parse func(line string)) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 1024)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		io.Copy(io.Discard, out)
	}()
	select {
	case l, ok := <-lines:
		if !ok {
			cmd.Wait()
			t.Fatal("helper exited before its first line")
		}
		parse(l)
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatal("nothing from the helper")
	}
	time.Sleep(d)
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for l := range lines {
		parse(l)
	}
	<-done
	if err := cmd.Wait(); err == nil {
		t.Fatal("helper exited cleanly; it was meant to be killed")
	}
}
