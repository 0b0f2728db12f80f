package jobs

import (
	"context"
	"slices"
	"sync"
)

// jobLister shares the listing of the job documents among the workers that
// need it at the same time. A takeover of 10,000 devices starts 10,000
// workers within seconds, each listing the jobs once: 10,000 range reads of
// <prefix>/jobs/ that etcd serves between the lock writes of the devices
// not yet taken over (docs/BENCHMARKS.md, the cluster benchmark). Shared,
// they are a few. A caller never takes a listing that started before its
// call: it joins the next one, which starts when the one running ends, so
// it sees every job created before it asked — as its own read would.
type jobLister struct {
	mu      sync.Mutex
	running chan struct{} // closed when the listing running ends; nil: none runs
	next    *jobListing   // the listing the callers arriving now join
}

// jobListing is one listing and its result.
type jobListing struct {
	done chan struct{}
	jobs []Job
	err  error
}

// list returns fetch's result from a listing that started after this
// call, run by this caller or shared with others.
func (l *jobLister) list(ctx context.Context, fetch func(context.Context) ([]Job, error)) ([]Job, error) {
	l.mu.Lock()
	if l.next == nil {
		l.next = &jobListing{done: make(chan struct{})}
	}
	mine := l.next
	for {
		select {
		case <-mine.done:
			l.mu.Unlock()
			return slices.Clone(mine.jobs), mine.err
		default:
		}
		if l.running == nil {
			// Nothing runs: mine starts now, after every call that joined it.
			running := make(chan struct{})
			l.running, l.next = running, nil
			l.mu.Unlock()
			mine.jobs, mine.err = fetch(ctx)
			l.mu.Lock()
			l.running = nil
			close(mine.done)
			close(running)
			l.mu.Unlock()
			return slices.Clone(mine.jobs), mine.err
		}
		running := l.running
		l.mu.Unlock()
		select {
		case <-mine.done:
		case <-running:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		l.mu.Lock()
	}
}
