package offline_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/offline"
)

// resolveLater is ResolveLater of one ack; the channel gets its error
// once its commit returned.
func resolveLater(ob *offline.Outbox, a *fence.Ack) <-chan error {
	ch := make(chan error, 1)
	ob.ResolveLater([]*fence.Ack{a}, func(errs []error) { ch <- errs[0] })
	return ch
}

// A deferred verdict ends its entry at once in every view, costs no
// commit of its own, and rides on the next Append's: n sequential
// commands, each appended and then resolved later, cost n commits, not 2n
// (ResolveAll's).
func TestResolveLaterRidesOnNextAppend(t *testing.T) {
	path := dbPath(t)
	ob := open(t, path, &offline.Options{VerdictDelay: time.Hour}) // only a commit of its own records it
	commits := countCommits(ob)
	const n = 10
	var last <-chan error
	for i := range n {
		e := entry("dev", fmt.Sprint("c", i), 3, uint64(i+1))
		appendOK(t, ob, e)
		if last != nil {
			if err := <-last; err != nil { // it rode on this Append: done before Append returned
				t.Fatal(err)
			}
		}
		last = resolveLater(ob, ack(e, fence.Accepted, ""))
		if _, ok, err := ob.Next("dev"); ok || err != nil {
			t.Fatalf("Next after ResolveLater: ok %v err %v, want none (ended)", ok, err)
		}
		if p, _ := ob.Pending("dev"); p != 0 {
			t.Fatalf("pending %d, want 0", p)
		}
		r, err := ob.Get(e.Envelope.ID)
		if err != nil || r.State != fence.Accepted || r.Ack == nil {
			t.Fatalf("Get: %+v %v, want accepted", r, err)
		}
		if l, _ := ob.List(offline.Filter{PendingOnly: true}); len(l) != 0 {
			t.Fatalf("List pending: %d", len(l))
		}
		if s, _ := ob.Summary(""); s.Pending != 0 {
			t.Fatalf("Summary: %+v", s)
		}
	}
	if got := commits.Load(); got != n {
		t.Errorf("%d commands: %d commits, want %d (each verdict rode on the next append)", n, got, n)
	}
	if ob.Waiting() != 1 {
		t.Errorf("waiting %d, want 1 (the last)", ob.Waiting())
	}
	if s, _ := ob.Summary(""); s.Waiting != 1 {
		t.Errorf("Summary.Waiting %d, want 1 (the last)", s.Waiting)
	}
	if s, _ := ob.Summary("other"); s.Waiting != 0 {
		t.Errorf("Summary(other).Waiting %d, want 0", s.Waiting)
	}
	if err := ob.Resolve("c9", ack(entry("dev", "c9", 3, 10), fence.Duplicate, "")); !errors.Is(err, offline.ErrResolved) {
		t.Errorf("Resolve of a deferred entry: %v, want ErrResolved", err)
	}
	if st, _ := ob.Stats(); st.Terminal[fence.Accepted] != n || st.Pending != 0 {
		t.Errorf("stats %+v", st)
	}
	ob.Flush()
	if err := <-last; err != nil {
		t.Fatal(err)
	}
	if got := commits.Load(); got != n+1 {
		t.Errorf("after Flush: %d commits, want %d", got, n+1)
	}
	ob.Close()
	ob = open(t, path, nil)
	if l, err := ob.List(offline.Filter{TerminalOnly: true}); err != nil || len(l) != n {
		t.Fatalf("after reopen: %d terminal, %v", len(l), err)
	}
}

// With nothing else to ride on, the outbox commits a deferred verdict
// itself, VerdictDelay after it; Close commits those still waiting.
func TestResolveLaterTimerAndClose(t *testing.T) {
	path := dbPath(t)
	ob := open(t, path, &offline.Options{VerdictDelay: time.Millisecond})
	a, b := entry("dev", "a", 3, 1), entry("dev", "b", 3, 2)
	appendOK(t, ob, a)
	appendOK(t, ob, b)
	if err := <-resolveLater(ob, ack(a, fence.Accepted, "")); err != nil { // the timer's commit
		t.Fatal(err)
	}
	ob.Close()
	ob = open(t, path, &offline.Options{VerdictDelay: time.Hour})
	if r, err := ob.Get("a"); err != nil || r.State != fence.Accepted {
		t.Fatalf("a after the timer: %+v %v", r, err)
	}
	done := resolveLater(ob, ack(b, fence.Stale, "old"))
	if err := ob.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	ob = open(t, path, nil)
	if r, err := ob.Get("b"); err != nil || r.State != fence.Stale {
		t.Fatalf("b after Close: %+v %v", r, err)
	}
}

// ResolveLater refuses at once what ResolveAll would: not found, already
// terminal, already waiting, another device's ack; expiry leaves an entry
// whose verdict waits alone.
func TestResolveLaterRefusals(t *testing.T) {
	clk := newClock()
	ob := open(t, dbPath(t), &offline.Options{VerdictDelay: time.Hour, Now: clk.Now, TTL: time.Minute})
	a, b := entry("dev", "a", 3, 1), entry("dev", "b", 3, 2)
	appendOK(t, ob, a)
	appendOK(t, ob, b)
	if err := ob.Resolve("b", ack(b, fence.Accepted, "")); err != nil {
		t.Fatal(err)
	}
	wrong := ack(a, fence.Accepted, "")
	wrong.Device = "other"
	var errs []error
	ob.ResolveLater([]*fence.Ack{ack(entry("dev", "zz", 3, 9), fence.Accepted, ""), ack(b, fence.Accepted, ""), wrong},
		func(e []error) { errs = e }) // all refused: done before it returns
	if len(errs) != 3 || !errors.Is(errs[0], offline.ErrNotFound) || !errors.Is(errs[1], offline.ErrResolved) ||
		!errors.Is(errs[2], fence.ErrInvalid) {
		t.Fatalf("errs %v", errs)
	}
	done := resolveLater(ob, ack(a, fence.Accepted, ""))
	if err := <-resolveLater(ob, ack(a, fence.Duplicate, "")); !errors.Is(err, offline.ErrResolved) {
		t.Errorf("twice: %v", err)
	}
	clk.Advance(time.Hour)
	if n, err := ob.ExpireDue(); n != 0 || err != nil {
		t.Errorf("expired %d %v, want 0: its verdict waits", n, err)
	}
	ob.Flush()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if r, _ := ob.Get("a"); r.State != fence.Accepted {
		t.Errorf("a: %v", r.State)
	}
}

// killLaterEnv names the outbox file TestResolveLaterHelperProcess works
// on until it is killed.
const killLaterEnv = "EDGEFENCE_OUTBOX_KILL_LATER"

// TestResolveLaterHelperProcess is the process TestResolveLaterKill9
// kills: it appends a, resolves it later, appends b (a's verdict rides on
// it) and prints "rode a"; it resolves b later and prints "waiting b" once
// b has ended in its views, and waits to be killed (VerdictDelay an hour).
func TestResolveLaterHelperProcess(t *testing.T) {
	path := os.Getenv(killLaterEnv)
	if path == "" {
		t.Skip("the child process of TestResolveLaterKill9")
	}
	ob, err := offline.Open(path, &offline.Options{Timeout: 10 * time.Second, VerdictDelay: time.Hour})
	if err != nil {
		fmt.Println("bad", err)
		return
	}
	a, b := entry("dev", "a", 3, 1), entry("dev", "b", 3, 2)
	if err := ob.Append(context.Background(), a); err != nil {
		fmt.Println("bad", err)
		return
	}
	da := resolveLater(ob, ack(a, fence.Accepted, ""))
	if err := ob.Append(context.Background(), b); err != nil {
		fmt.Println("bad", err)
		return
	}
	select {
	case err := <-da:
		fmt.Println("rode a", err)
	default:
		fmt.Println("bad: a did not ride on b's append")
	}
	_ = resolveLater(ob, ack(b, fence.Accepted, ""))
	if r, err := ob.Get("b"); err != nil || r.State != fence.Accepted {
		fmt.Println("bad", r.State, err)
	}
	fmt.Println("waiting b")
	time.Sleep(time.Hour)
}

// kill -9 while a verdict waits: after the restart its entry is pending
// (the agent resends it, the device answers duplicate) and can be
// resolved once; the verdict that rode on a commit is durable.
func TestResolveLaterKill9(t *testing.T) {
	path := dbPath(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestResolveLaterHelperProcess$")
	cmd.Env = append(os.Environ(), killLaterEnv+"="+path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	var lines []string
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if strings.HasPrefix(sc.Text(), "waiting b") || strings.HasPrefix(sc.Text(), "bad") {
			break
		}
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	if len(lines) != 2 || lines[0] != "rode a <nil>" || lines[1] != "waiting b" {
		t.Fatalf("child said %q", lines)
	}
	ob := open(t, path, nil)
	if r, err := ob.Get("a"); err != nil || r.State != fence.Accepted {
		t.Errorf("a (rode on b's append): %+v %v, want accepted", r, err)
	}
	e, ok, err := ob.Next("dev")
	if err != nil || !ok || e.Envelope.ID != "b" {
		t.Fatalf("Next: %v %v %v, want b pending again", e, ok, err)
	}
	if err := ob.Resolve("b", ack(e, fence.Duplicate, "")); err != nil {
		t.Errorf("b resolved once after the restart: %v", err)
	}
}
