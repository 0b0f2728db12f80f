package offline_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
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
// a child process, appends to until it is killed; killBodiesEnv, set,
// makes it append bodies (killBody) and resolve after every fourth append.
// killBatchEnv, set, makes it append in batches instead (outboxBatchHelper).
const (
	killHelperEnv = "EDGEFENCE_OUTBOX_KILL_HELPER"
	killBodiesEnv = "EDGEFENCE_OUTBOX_KILL_BODIES"
	killBatchEnv  = "EDGEFENCE_OUTBOX_KILL_BATCH"
	// killConcurrentEnv, set, makes it append from killWriters goroutines
	// at once (outboxConcurrentHelper): their appends share commits.
	killConcurrentEnv = "EDGEFENCE_OUTBOX_KILL_CONCURRENT"
)

// killBody is the body of the child's i-th entry with killBodiesEnv: a
// firmware chunk's 30 KiB for half of them (dropped once resolved), 100
// bytes (kept) or none.
func killBody(i int) []byte {
	var data []byte
	switch i % 4 {
	case 0, 1:
		data = bytes.Repeat([]byte{byte(i), byte(i >> 8), byte(i >> 16)}, 10<<10)
	case 2:
		data = bytes.Repeat([]byte{byte(i)}, 100)
	default:
		return nil
	}
	b, err := fence.EncodeBody(data)
	if err != nil {
		panic(err) // 30 KiB is within fence.MaxBodySize
	}
	return b
}

// killIndex is i of the child's id "p<pid>-<i>".
func killIndex(id string) int {
	_, after, _ := strings.Cut(id, "-")
	i, err := strconv.Atoi(after)
	if err != nil {
		return -1
	}
	return i
}

// TestOutboxHelperProcess is the process TestOutboxKill9 kills. It appends
// entries round-robin over four devices, with ids made unique by its pid,
// and prints "ok ID" after each Append returned; after every twelfth append
// it resolves the oldest pending entry of each of the four devices at once
// (four concurrent Resolve calls, which share commits: the group commit)
// and each prints "res ID" after its Resolve returned (with killBodiesEnv:
// bodies, and after every fourth append; TestOutboxKill9Bodies). Anything
// unexpected is printed as a "bad" line.
func TestOutboxHelperProcess(t *testing.T) {
	path := os.Getenv(killHelperEnv)
	if path == "" {
		t.Skip("the child process of TestOutboxKill9")
	}
	ob, err := offline.Open(path, &offline.Options{Timeout: 10 * time.Second})
	if err != nil {
		fmt.Println("bad open:", err)
		os.Exit(2)
	}
	w := bufio.NewWriter(os.Stdout)
	if os.Getenv(killBatchEnv) != "" {
		os.Exit(outboxBatchHelper(ob, w))
	}
	if os.Getenv(killConcurrentEnv) != "" {
		os.Exit(outboxConcurrentHelper(ob, w))
	}
	os.Exit(outboxHelper(ob, w))
}

// killBatch is the entries of one AppendAll and one ResolveAll in
// outboxBatchHelper.
const killBatch = 4

// outboxBatchHelper appends batch b (ids p<pid>-<4b>…<4b+3>, one device,
// consecutive seqs) with one AppendAll and prints "ok ID" for each once it
// returned; then it resolves batch b-1 with one ResolveAll and prints
// "res ID" for each. Chunk-sized bodies for half of them, so that a commit
// takes a while to write.
func outboxBatchHelper(ob *offline.Outbox, w *bufio.Writer) int {
	say := func(a ...any) { fmt.Fprintln(w, a...); w.Flush() }
	deadline := time.Now().Add(time.Minute) // never outlive a broken parent for long
	var prev []*offline.Entry
	for b := 0; time.Now().Before(deadline); b++ {
		es := make([]*offline.Entry, killBatch)
		for k := range es {
			i := b*killBatch + k
			es[k] = entry(fmt.Sprintf("dev-%d", b%4), fmt.Sprintf("p%d-%d", os.Getpid(), i), fence.Token(b+1), uint64(k+1))
			es[k].Envelope.Body = killBody(i)
		}
		if err := ob.AppendAll(context.Background(), es); err != nil {
			say("bad append:", err)
			return 2
		}
		for _, e := range es {
			say("ok", e.Envelope.ID) // after AppendAll returned: durable
		}
		if prev != nil {
			acks := make([]*fence.Ack, len(prev))
			for k, e := range prev {
				acks[k] = ack(e, fence.Accepted, "")
			}
			for k, err := range ob.ResolveAll(acks) {
				if err != nil {
					say("bad resolve:", err)
					return 2
				}
				say("res", prev[k].Envelope.ID) // after ResolveAll returned: durable
			}
		}
		prev = es
	}
	ob.Close()
	return 0
}

func outboxHelper(ob *offline.Outbox, w *bufio.Writer) int {
	bodies, every := os.Getenv(killBodiesEnv) != "", 12
	if bodies {
		every = 4
	}
	deadline := time.Now().Add(time.Minute) // never outlive a broken parent for long
	for i := 0; time.Now().Before(deadline); i++ {
		e := entry(fmt.Sprintf("dev-%d", i%4), fmt.Sprintf("p%d-%d", os.Getpid(), i), 1, uint64(i+1))
		if bodies {
			e.Envelope.Body = killBody(i)
		}
		if err := ob.Append(context.Background(), e); err != nil {
			fmt.Fprintln(w, "bad append:", err)
			w.Flush()
			return 2
		}
		fmt.Fprintln(w, "ok", e.Envelope.ID) // after Append returned: durable
		w.Flush()
		if i%every == every-1 && !resolveAll(ob, w) {
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

		boltCheck(t, path, round)
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

// boltCheck fails unless bbolt's consistency check of the file is clean.
func boltCheck(t *testing.T, path string, round int) {
	t.Helper()
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
}

// TestOutboxKill9Bodies kills, at a random moment, a child appending
// entries with bodies (killBody: half of them 30 KiB chunks) and resolving
// four of them after every fourth append. After each kill every entry is
// either pending with its whole body — delivered whole by NextAfter — or
// terminal with its body kept (small) or dropped with its size and
// SHA-256: never pending without its body. Every resolve the child printed
// is accepted.
func TestOutboxKill9Bodies(t *testing.T) {
	rounds := 12
	path := dbPath(t)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 15))
	resolved := map[string]bool{}
	var dropped int // at the last round
	var appended []string
	for round := range rounds {
		recs := killAndList(t, path, rng, round, killBodiesEnv, &appended, resolved)
		ob := open(t, path, nil)
		dropped = 0
		for _, r := range recs {
			if err := bodyErr(r, killBody(killIndex(r.ID))); err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
			if resolved[r.ID] && r.State != fence.Accepted {
				t.Fatalf("round %d: %s resolved, but %s", round, r.ID, r.StateString())
			}
			if r.BodyDropped {
				dropped++
			}
		}
		for dev := range 4 { // the pending entries as they will be sent
			d := fmt.Sprintf("dev-%d", dev)
			e, ok, err := ob.Next(d)
			for ; ok && err == nil; e, ok, err = ob.NextAfter(d, e.Pos) {
				if !bytes.Equal(e.Envelope.Body, killBody(killIndex(e.Envelope.ID))) {
					t.Fatalf("round %d: %s sent with a body of %d bytes, not as appended", round, e.Envelope.ID, len(e.Envelope.Body))
				}
			}
			if err != nil {
				t.Fatalf("round %d: next of %s: %v", round, d, err)
			}
		}
		ob.Close()
	}
	t.Logf("%d rounds, %d acknowledged resolves, %d terminal entries without their body", rounds, len(resolved), dropped)
	if dropped == 0 {
		t.Fatal("no body dropped")
	}
}

// TestOutboxKill9Batches kills, at a random moment, a child appending
// batches with AppendAll and resolving them with ResolveAll. After each
// kill: bbolt's check is clean; every entry the child printed is there,
// every resolve it printed is accepted; and each batch is whole — its
// four entries all stored or none, all accepted or none: one commit each.
func TestOutboxKill9Batches(t *testing.T) {
	rounds := 12
	path := dbPath(t)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 17))
	var appended []string
	resolved := map[string]bool{}
	for round := range rounds {
		recs := killAndList(t, path, rng, round, killBatchEnv, &appended, resolved)
		byID := make(map[string]offline.Record, len(recs))
		type batch struct{ stored, accepted int }
		batches := map[string]*batch{} // by pid and batch number
		for _, r := range recs {
			byID[r.ID] = r
			pid, _, _ := strings.Cut(r.ID, "-")
			key := fmt.Sprintf("%s/%d", pid, killIndex(r.ID)/killBatch)
			if batches[key] == nil {
				batches[key] = &batch{}
			}
			batches[key].stored++
			if r.State == fence.Accepted {
				batches[key].accepted++
			}
		}
		for key, b := range batches {
			if b.stored != killBatch || b.accepted != 0 && b.accepted != killBatch {
				t.Fatalf("round %d: batch %s torn: %d of %d stored, %d accepted", round, key, b.stored, killBatch, b.accepted)
			}
		}
		for _, id := range appended {
			if rec, ok := byID[id]; !ok || resolved[id] && rec.State != fence.Accepted {
				t.Fatalf("round %d: acknowledged %s (resolved %v) is %+v", round, id, resolved[id], rec)
			}
		}
	}
	t.Logf("%d rounds, %d acknowledged appends, %d acknowledged resolves", rounds, len(appended), len(resolved))
}

// killAndList runs one round of killRound with env set, adds what the
// child printed to appended and resolved, checks the file with bbolt and
// returns its records.
func killAndList(t *testing.T, path string, rng *rand.Rand, round int, env string, appended *[]string, resolved map[string]bool) []offline.Record {
	t.Helper()
	a, r := killRound(t, path, time.Duration(rng.IntN(30_001))*time.Microsecond, env+"=1")
	*appended = append(*appended, a...)
	for _, id := range r {
		resolved[id] = true
	}
	boltCheck(t, path, round)
	ob := open(t, path, nil)
	recs, err := ob.List(offline.Filter{})
	ob.Close()
	if err != nil {
		t.Fatalf("round %d: %v", round, err)
	}
	return recs
}

// killRound runs one child, kills it with SIGKILL wait after its first
// acknowledged append, and returns the ids it printed as appended and as
// resolved. env is added to the child's environment.
func killRound(t *testing.T, path string, wait time.Duration, env ...string) (appended, resolved []string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestOutboxHelperProcess$", "-test.count=1")
	cmd.Env = append(append(os.Environ(), killHelperEnv+"="+path), env...)
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
