package jobs

import (
	"math/rand/v2"
	"time"
)

// Waiting for a place in a rollout. A worker whose queued execution the
// rollout does not start yet (max_concurrent, canaries, a paused rollout)
// waits in its job's queue; a change of the rollout wakes only as many of
// them, oldest first, as the rollout has places for (decided as Store.Start
// decides), not every waiting worker: with 950 devices waiting, each finish
// would otherwise send 950 workers to etcd for a start that one of them
// gets (the thundering herd). A worker that starts to wait after the
// change it missed is woken at once if that change left a place no other
// worker took. A long, jittered backstop wakes a waiter if all else fails.

// placeBackstop is the least wait of a worker waiting for a place with no
// change of the rollout; it waits up to twice as long (jitter).
const placeBackstop = 30 * time.Second

// places is one job's waiting workers and the wakes its rollout allows.
type places struct {
	// queue holds the waiting workers, oldest first; an entry whose worker
	// no longer waits on this job (waitingOn) is skipped.
	queue []*worker
	// rev is the rollout revision budget was decided at: the wakes left
	// for it. woken counts the workers woken whose round has not ended.
	rev    int64
	budget int
	woken  int
}

// awaitPlace records that the worker waits for a place in job's rollout
// and returns how long it sleeps unless woken: retryAfter when the rollout
// named a time (its rate), else the jittered backstop.
func (w *worker) awaitPlace(job string, retryAfter time.Duration) time.Duration {
	w.waitFor = job
	if retryAfter > 0 && retryAfter != busyRetry {
		return retryAfter
	}
	return placeBackstop + rand.N(placeBackstop)
}

// unwake: the worker woken for a place has had its start decided (or
// its round ended before): it is no longer counted as woken.
func (r *Runner) unwake(w *worker) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.unwakeLocked(w)
}

func (r *Runner) unwakeLocked(w *worker) {
	if w.woken != "" {
		if p := r.waits[w.woken]; p != nil && p.woken > 0 {
			p.woken--
		}
		w.woken = ""
	}
}

// settle ends the worker's round in the job queues: a woken worker is no
// longer counted as woken; one waiting for a place (waitFor) is queued, at
// its old place if it was queued already, and woken at once if the
// rollout's last change left a place.
func (r *Runner) settle(w *worker) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.unwakeLocked(w)
	if w.waitingOn == w.waitFor {
		return
	}
	w.waitingOn = w.waitFor
	if w.waitFor == "" {
		return
	}
	p := r.waits[w.waitFor]
	if p == nil {
		p = &places{}
		r.waits[w.waitFor] = p
	}
	p.queue = append(p.queue, w)
	r.grant(w.waitFor, p)
}

// offer wakes the workers waiting on job j that its rollout ro, changed
// at rev, has places for.
func (r *Runner) offer(j Job, ro Rollout, rev int64) {
	now := r.cfg.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.waits[j.ID]
	if p == nil {
		p = &places{}
		r.waits[j.ID] = p
	}
	if rev <= p.rev {
		return
	}
	p.rev, p.budget = rev, max(0, freePlaces(j, ro, now)-p.woken)
	r.grant(j.ID, p)
}

// grant wakes waiting workers of job, oldest first, while p's budget
// lasts. r.mu is held.
func (r *Runner) grant(job string, p *places) {
	for p.budget > 0 && len(p.queue) > 0 {
		w := p.queue[0]
		p.queue[0] = nil
		p.queue = p.queue[1:]
		if w.waitingOn != job || r.workers[w.dev] != w {
			continue // stopped waiting, or gone
		}
		w.waitingOn, w.woken = "", job
		p.budget--
		p.woken++
		w.poke(true)
	}
	if len(p.queue) == 0 && p.woken == 0 {
		p.queue = nil
	}
}

// waitsOn reports whether dev's worker waits for a place in job's rollout.
func (r *Runner) waitsOn(dev, job string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	w := r.workers[dev]
	return w != nil && w.waitingOn == job
}

// forgetPlaces drops job's queue (its rollout ended or stopped: every
// worker of the job is kicked instead).
func (r *Runner) forgetPlaces(job string) {
	r.mu.Lock()
	delete(r.waits, job)
	r.mu.Unlock()
}

// freePlaces is how many more starts the rollout ro of job j allows now,
// one after another, as Store.Start decides them (decideStart).
func freePlaces(j Job, ro Rollout, now time.Time) int {
	j.ApplyDefaults()
	ro.Counts = cloneCounts(ro.Counts)
	n := 0
	for ; n < MaxTargets; n++ {
		canary, err := decideStart(&j, &ro, now)
		if err != nil {
			break
		}
		applyStart(&j, &ro, canary, now)
	}
	return n
}
