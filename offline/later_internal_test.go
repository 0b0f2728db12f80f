package offline

import (
	"context"
	"errors"
	"path/filepath"
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
