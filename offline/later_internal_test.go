package offline

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/internal/groupcommit"
)

// A deferred verdict whose commit fails (a disk error here) puts its entry
// back: pending in the views and the counts, resent by the agent.
func TestResolveLaterFailedCommit(t *testing.T) {
	ob, err := Open(filepath.Join(t.TempDir(), File), &Options{VerdictDelay: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer ob.Close()
	e := &Entry{Envelope: fence.Envelope{V: fence.Version, Device: "dev", Token: 3, Seq: 1, ID: "a", Kind: "set"}}
	if err := ob.Append(context.Background(), e); err != nil {
		t.Fatal(err)
	}
	errDisk := errors.New("disk error")
	ok := ob.group
	ob.group = groupcommit.New(func(func(*bbolt.Tx) error) error { return errDisk }, 0)
	a := fence.NewAck(&e.Envelope, fence.Accepted, fence.Mark{Token: 3, Seq: 1}, "")
	ch := make(chan error, 1)
	ob.ResolveLater([]*fence.Ack{&a}, func(errs []error) { ch <- errs[0] })
	if n, _ := ob.Pending("dev"); n != 0 {
		t.Fatalf("pending %d while waiting", n)
	}
	ob.Flush()
	if err := <-ch; !errors.Is(err, errDisk) {
		t.Fatalf("done: %v, want the disk error", err)
	}
	ob.group = ok
	if n, _ := ob.Pending("dev"); n != 1 {
		t.Errorf("pending %d after the failed commit, want 1", n)
	}
	if got, found, err := ob.Next("dev"); err != nil || !found || got.Envelope.ID != "a" {
		t.Errorf("Next: %v %v %v, want a again", got, found, err)
	}
	if err := ob.Resolve("a", &a); err != nil {
		t.Errorf("resolved after the failure: %v", err)
	}
}

// CommitSoon commits the deferred verdicts at once, not VerdictDelay
// later (an hour here), and those asked for while a commit runs share the
// next one: ten verdicts, the first alone while its commit hangs, the
// nine others parked meanwhile, take two commits. Each done comes once
// its verdict is durable (read back from the file).
func TestCommitSoonAtOnceAndShared(t *testing.T) {
	ob, err := Open(filepath.Join(t.TempDir(), File), &Options{VerdictDelay: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer ob.Close()
	const n = 10
	es := make([]*Entry, n)
	for i := range es {
		es[i] = &Entry{Envelope: fence.Envelope{V: fence.Version, Device: fmt.Sprint("dev", i), Token: 3, Seq: 1,
			ID: fmt.Sprint("c", i), Kind: "set"}}
	}
	if err := ob.AppendAll(context.Background(), es); err != nil {
		t.Fatal(err)
	}
	var commits atomic.Int64
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	ob.group = groupcommit.New(func(fn func(*bbolt.Tx) error) error {
		once.Do(func() { close(entered); <-release })
		return ob.db.Update(func(tx *bbolt.Tx) error {
			tx.OnCommit(func() { commits.Add(1) })
			return fn(tx)
		})
	}, 0)
	dones := make(chan error, n)
	soon := func(e *Entry) {
		a := fence.NewAck(&e.Envelope, fence.Accepted, fence.Mark{Token: 3, Seq: 1}, "")
		ob.ResolveLater([]*fence.Ack{&a}, func(errs []error) { dones <- errs[0] })
		ob.CommitSoon()
	}
	soon(es[0])
	<-entered // the flusher's commit of the first, hanging
	for _, e := range es[1:] {
		soon(e)
	}
	close(release)
	for range n {
		if err := <-dones; err != nil {
			t.Fatal(err)
		}
	}
	if got := commits.Load(); got != 2 {
		t.Errorf("%d verdicts in %d commits, want 2 (the first, then the nine parked during it)", n, got)
	}
	if w := ob.Waiting(); w != 0 {
		t.Errorf("waiting %d after every done", w)
	}
	err = ob.db.View(func(tx *bbolt.Tx) error {
		for _, e := range es {
			r, err := getRecord(tx, []byte(e.Envelope.ID))
			if err != nil || r.state != fence.Accepted {
				return fmt.Errorf("%s in the file: %+v %v, want accepted", e.Envelope.ID, r, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
	ob.flushers.Wait() // the flusher ends once none waits
	if ob.again || ob.flushing {
		t.Errorf("again %v, flushing %v after every done", ob.again, ob.flushing)
	}
}
