package offline_test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/offline"
)

// killHelperEnv names the outbox file that TestOutboxHelperProcess, run in
// a child process, appends to until it is killed.
const killHelperEnv = "EDGEFENCE_OUTBOX_KILL_HELPER"

// TestOutboxHelperProcess is the process TestOutboxKill9 kills. It appends
// entries round-robin over four devices, with ids made unique by its pid,
// and prints "ok ID" after each Append returned; after every twelfth append
// it resolves the oldest pending entry of each of the four devices at once
// (four concurrent Resolve calls, which share commits: the group commit)
// and each prints "res ID" after its Resolve returned. Anything unexpected
// is printed as a "bad" line.
func TestOutboxHelperProcess(t *testing.T) {
	path := os.Getenv(killHelperEnv)
	if path == "" {
		t.Skip("the child process of TestOutboxKill9")
	}
	os.Exit(outboxHelper(path))
}

func outboxHelper(path string) int {
	ob, err := offline.Open(path, &offline.Options{Timeout: 10 * time.Second})
	if err != nil {
		fmt.Println("bad open:", err)
		return 2
	}
	w := bufio.NewWriter(os.Stdout)
	deadline := time.Now().Add(time.Minute) // never outlive a broken parent for long
	for i := 0; time.Now().Before(deadline); i++ {
		e := entry(fmt.Sprintf("dev-%d", i%4), fmt.Sprintf("p%d-%d", os.Getpid(), i), 1, uint64(i+1))
		if err := ob.Append(context.Background(), e); err != nil {
			fmt.Fprintln(w, "bad append:", err)
			w.Flush()
			return 2
		}
		fmt.Fprintln(w, "ok", e.Envelope.ID) // after Append returned: durable
		w.Flush()
		if i%12 == 11 && !resolveAll(ob, w) {
			return 2
		}
	}
	ob.Close()
	return 0
}

// resolveAll resolves the oldest pending entry of dev-0..dev-3 concurrently
// and prints "res ID" for each after its Resolve returned.
func resolveAll(ob *offline.Outbox, w *bufio.Writer) bool {
	var mu sync.Mutex
	say := func(a ...any) { mu.Lock(); fmt.Fprintln(w, a...); w.Flush(); mu.Unlock() }
	ok := true
	var wg sync.WaitGroup
	for d := range 4 {
		wg.Go(func() {
			n, found, err := ob.Next(fmt.Sprintf("dev-%d", d))
			if err == nil && found {
				err = ob.Resolve(n.Envelope.ID, ack(n, fence.Accepted, ""))
			}
			if err != nil || !found {
				say("bad resolve:", found, err)
				mu.Lock()
				ok = false
				mu.Unlock()
				return
			}
			say("res", n.Envelope.ID) // after Resolve returned: durable
		})
	}
	wg.Wait()
	return ok
}

// TestOutboxKill9 kills a process appending to the outbox at a random
// moment, 0 to 30 ms after its first acknowledged append, again and again.
// After each kill: bbolt's consistency check is clean; every id the child
// printed is in the outbox, and every one it printed as resolved is
// accepted; each device's positions run 1..n without gap; per round at
// most one entry beyond the printed appends (the append in flight) and at
// most four resolves beyond the printed ones (a concurrent group in flight)
// exist.
func TestOutboxKill9(t *testing.T) {
	rounds := 20
	path := dbPath(t)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 9))
	var appended []string
	resolved := map[string]bool{}
	for round := range rounds {
		a, r := killRound(t, path, time.Duration(rng.IntN(30_001))*time.Microsecond)
		appended = append(appended, a...)
		for _, id := range r {
			resolved[id] = true
		}

		db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true, Timeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		err = db.View(func(tx *bbolt.Tx) error {
			for err := range tx.Check() {
				return err
			}
			return nil
		})
		db.Close()
		if err != nil {
			t.Fatalf("round %d: bbolt check: %v", round, err)
		}

		ob, err := offline.Open(path, nil)
		if err != nil {
			t.Fatalf("round %d: reopen: %v", round, err)
		}
		for _, id := range appended {
			r, err := ob.Get(id)
			if err != nil || resolved[id] && r.State != fence.Accepted {
				ob.Close()
				t.Fatalf("round %d: acknowledged %s (resolved %v): %+v %v", round, id, resolved[id], r, err)
			}
		}
		recs, err := ob.List(offline.Filter{})
		ob.Close()
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if extra := len(recs) - len(appended); extra < 0 || extra > round+1 {
			t.Fatalf("round %d: %d entries, %d acknowledged appends", round, len(recs), len(appended))
		}
		accepted := 0
		perDev := map[string][]uint64{}
		for _, r := range recs {
			perDev[r.Device] = append(perDev[r.Device], r.Pos)
			if !r.Pending() {
				accepted++
			}
		}
		if extra := accepted - len(resolved); extra < 0 || extra > 4*(round+1) { // four resolves in flight at a kill
			t.Fatalf("round %d: %d accepted, %d acknowledged resolves", round, accepted, len(resolved))
		}
		for dev, pos := range perDev {
			for i, p := range pos {
				if p != uint64(i+1) {
					t.Fatalf("round %d: %s positions %v: a gap or reorder", round, dev, pos)
				}
			}
		}
	}
	t.Logf("%d rounds, %d acknowledged appends, %d acknowledged resolves", rounds, len(appended), len(resolved))
}

// killRound runs one child, kills it with SIGKILL wait after its first
// acknowledged append, and returns the ids it printed as appended and as
// resolved.
func killRound(t *testing.T, path string, wait time.Duration) (appended, resolved []string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestOutboxHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), killHelperEnv+"="+path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	var timer <-chan time.Time // armed at the first acknowledged append
	fail := time.After(30 * time.Second)
	killed := false
	kill := func() {
		if !killed {
			cmd.Process.Signal(syscall.SIGKILL)
			killed = true
		}
	}
	for lines != nil {
		select {
		case line, ok := <-lines:
			if !ok {
				lines = nil
				break
			}
			if id, ok := strings.CutPrefix(line, "res "); ok {
				resolved = append(resolved, id)
				break
			}
			id, ok := strings.CutPrefix(line, "ok ")
			if !ok {
				kill()
				for range lines {
				}
				cmd.Wait()
				t.Fatalf("child: %s", line)
			}
			appended = append(appended, id)
			if timer == nil && !killed {
				timer = time.After(wait)
			}
		case <-timer:
			kill()
			timer = nil
		case <-fail:
			kill()
			fail = nil
		}
	}
	if !killed { // the child ended by itself: it must not
		cmd.Wait()
		t.Fatal("child exited before it was killed")
	}
	cmd.Wait()
	if len(appended) == 0 {
		t.Fatal("child acknowledged nothing")
	}
	return appended, resolved
}
