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
