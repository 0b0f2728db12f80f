package jobs

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
)

// Workers listing the jobs at the same time share listings: 100 callers
// arriving while one listing runs take one more listing between them, not
// 100. And none takes a listing that started before its call: a caller
// that arrives while a listing runs gets the one after it.
func TestJobListerShares(t *testing.T) {
	var l jobLister
	var fetches atomic.Int64
	release := make(chan struct{})
	started := make(chan int64, 10)
	fetch := func(ctx context.Context) ([]Job, error) {
		n := fetches.Add(1)
		started <- n
		<-release
		return []Job{{ID: "j" + string(rune('0'+n))}}, nil
	}
	ctx := t.Context()
	first := make(chan []Job, 1)
	go func() {
		jobs, _ := l.list(ctx, fetch)
		first <- jobs
	}()
	if n := <-started; n != 1 {
		t.Fatalf("first listing is fetch %d", n)
	}
	// 100 callers arrive while listing 1 runs.
	var wg sync.WaitGroup
	got := make([][]Job, 100)
	var waiting sync.WaitGroup
	waiting.Add(100)
	for i := range got {
		wg.Go(func() {
			waiting.Done()
			jobs, err := l.list(ctx, fetch)
			if err != nil {
				t.Error(err)
			}
			got[i] = jobs
		})
	}
	waiting.Wait()
	close(release) // listing 1 ends; listing 2 (theirs) runs and ends at once
	wg.Wait()
	if j := <-first; len(j) != 1 || j[0].ID != "j1" {
		t.Fatalf("first caller got %v", j)
	}
	for i, j := range got {
		if len(j) != 1 || j[0].ID == "j1" {
			t.Fatalf("caller %d got %v: a listing that started before its call", i, j)
		}
	}
	// The callers that raced in before listing 1 ended may have joined
	// listing 2 or, if they came after it started, listing 3: never more.
	if n := fetches.Load(); n > 3 {
		t.Fatalf("%d listings for 101 callers", n)
	}
	// Each caller owns its slice.
	got[0][0].ID = "changed"
	if got[1][0].ID == "changed" {
		t.Fatal("callers share the slice")
	}
}
