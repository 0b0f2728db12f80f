package offline_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestReadersDoNotWaitForAppend: while an Append's commit is in progress
// (held here in its commit observer, after the write), Next and Pending
// of the device still answer: a device's delivery worker picks its next
// command while the agent appends the ones behind it (the firmware
// runner's window).
func TestReadersDoNotWaitForAppend(t *testing.T) {
	ob := open(t, dbPath(t), nil)
	appendOK(t, ob, entry("d1", "c1", 1, 1))
	var armed atomic.Bool
	inCommit, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	ob.ObserveCommits(func(time.Duration) {
		if armed.Load() {
			once.Do(func() { close(inCommit); <-release })
		}
	})
	armed.Store(true)
	appended := make(chan error, 1)
	go func() { appended <- ob.Append(context.Background(), entry("d1", "c2", 1, 2)) }()
	<-inCommit

	read := make(chan string, 1)
	go func() {
		e, ok, err := ob.Next("d1")
		if err != nil || !ok || e.Envelope.ID != "c1" {
			read <- fmt.Sprintf("next: %v %v %+v", ok, err, e)
			return
		}
		read <- ""
	}()
	select {
	case msg := <-read:
		if msg != "" {
			t.Error(msg)
		}
	case <-time.After(time.Minute):
		t.Error("Next waited for another command's Append")
	}
	close(release)
	if err := <-appended; err != nil {
		t.Fatal(err)
	}
	if n, _ := ob.Pending("d1"); n != 2 {
		t.Fatalf("pending %d, want 2", n)
	}
}

// TestConcurrentAppendsShareCommits: while one Append's commit is held
// (in its commit observer), 31 more Appends from as many goroutines are
// started; once all are counted pending, the commit is released. They
// share commits: far fewer than one each. Fails when an Append waits
// for the commit in progress before it can join the next group (the
// outbox's write lock taken per Append: 31 commits, one each).
func TestConcurrentAppendsShareCommits(t *testing.T) {
	const others = 31
	ob := open(t, dbPath(t), nil)
	var armed atomic.Bool
	var commits atomic.Int64
	inCommit, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	ob.ObserveCommits(func(time.Duration) {
		commits.Add(1)
		if armed.Load() {
			once.Do(func() { close(inCommit); <-release })
		}
	})
	armed.Store(true)
	errs := make(chan error, others+1)
	go func() { errs <- ob.Append(context.Background(), entry("d0", "c0", 1, 1)) }()
	<-inCommit
	for i := 1; i <= others; i++ {
		go func() {
			errs <- ob.Append(context.Background(), entry(fmt.Sprintf("d%d", i), fmt.Sprintf("c%d", i), 1, 1))
		}()
	}
	// Counted pending means reserved: the next step is joining the group,
	// whose leader waits for the held commit. (Without the mechanism they
	// are never all counted while the commit is held: released after a
	// minute, the count below fails.)
	ready := make(chan struct{})
	go func() {
		for len(ob.Devices()) < others+1 {
			time.Sleep(time.Millisecond)
		}
		close(ready)
	}()
	select {
	case <-ready:
	case <-time.After(time.Minute):
	}
	close(release)
	for range others + 1 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n := commits.Load() - 1; n > others/4 {
		t.Fatalf("%d appends behind a held commit took %d commits; want them to share (≤ %d)", others, n, others/4)
	}
	t.Logf("%d appends behind a held commit: %d commits", others, commits.Load()-1)
}
