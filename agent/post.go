package agent

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/offline"
)

// Parked sends: through a Sender that can post (transport/mqtt's
// Commander), a device's worker publishes its command and lets its
// goroutine go; the command's outcome — its ack, its ack deadline, the
// publish's error, or the end of delivery's run — starts a goroutine that
// settles it and runs the worker on. A fan-out to 10,000 devices then
// keeps no 10,000 goroutines (and their stacks, scanned by every garbage
// collection) waiting on the devices' fsyncs; only those in a publish, for
// the broker's PUBACK, are alive.
//
// The outcome is exactly one: the ack is handed over only while the
// poster still waits for it (its Drop reports whether it did), and the
// first of the outcomes ends the send (sendOp.finish). An ack that comes
// after the send ended without one is kept by the poster (the
// Commander's lapsed wait) and answers the resend at once, as a Send's
// late ack does: the device's first verdict is the one settled. The
// worker between the post and the outcome belongs to no
// goroutine: the one that posted returns at once (stepped parked) and
// touches the worker no more.

// postAbove is how many commands must be in flight on the link before a
// send parks its worker: a burst (a fan-out, a takeover's first commands,
// a replay) parks all but the first few, while commands sent one at a time
// keep the cheaper wait on the worker's goroutine (BENCHMARKS §75: a
// parked send costs a second goroutine a command, ≈ 10 % more CPU a
// command at steady load).
var postAbove int64 = 64 // a var: the tests park every send

// poster is a Sender that can send without waiting for the ack: Post
// returns once the command is published (or an error: not published, or
// its outcome unknown) and hands the ack to answer later, on a goroutine
// that answer must not block, unless Drop(id) came first. Drop reports
// whether the command was still waiting for its ack.
type poster interface {
	Post(ctx context.Context, env *fence.Envelope, answer func(*fence.Ack)) error
	Drop(id string) bool
}

// sendOp is one parked send: the worker and its entry, and the ack
// deadline's timer (resend.go's policy, as ackContext's).
type sendOp struct {
	q     *delivery
	ctx   context.Context
	w     *worker
	e     *offline.Entry
	tries int       // the attempt's number, from 0
	ahead int64     // commands in flight on the link before this one
	at    time.Time // sent

	over  atomic.Bool // finished
	mu    sync.Mutex  // guards timer
	timer *time.Timer
	// posted is closed once postAttempt is done with the poster: resume
	// waits for it, so that a worker's command is in one Post at a time
	// and postAttempt's Drop can only be of its own registration, never
	// of the resend's (a Post still waiting for its PUBACK when the ack
	// deadline passed).
	posted chan struct{}
	// endPost cancels the Post's context: the send's first outcome ends
	// a publish still waiting for its PUBACK, as a waiting Send's ack
	// deadline does (the outcome unknown: the resend is answered
	// duplicate if it got through).
	endPost context.CancelFunc
}

// recheck is how soon a deadline that passed looks again when the poster
// has not registered the command yet (it is between park and Post) or is
// handing its ack over.
const recheck = 10 * time.Millisecond

// postAttempt posts e and parks the worker (parked), or returns idle if
// delivery's run is ending.
func (q *delivery) postAttempt(ctx context.Context, w *worker, e *offline.Entry) stepped {
	pctx, endPost := context.WithCancel(ctx)
	op := &sendOp{q: q, ctx: ctx, w: w, e: e, tries: w.tries, posted: make(chan struct{}), endPost: endPost}
	w.tries++
	if !q.park(op) {
		endPost()
		return idle
	}
	defer close(op.posted)
	op.ahead = q.pace.inflight.Add(1) - 1
	op.at = time.Now()
	op.mu.Lock()
	op.timer = time.AfterFunc(op.left(), op.deadline)
	op.mu.Unlock()
	// From here w is op's: this goroutine returns parked whatever comes.
	id := e.Envelope.ID
	if err := q.post.Post(pctx, &e.Envelope, op.answer); err != nil {
		// Not published, or its outcome unknown: resent (an ack that
		// races the error answers the resend).
		q.post.Drop(id)
		op.finish(nil, err)
	} else if op.over.Load() {
		// Finished while Post was under way (its deadline, the run's
		// end), perhaps before it registered the command: no ack is
		// awaited. The registration is this Post's (the resend waits
		// for posted).
		q.post.Drop(id)
	}
	return parked
}

// park registers op as parked (run's end finishes it) and counts it among
// delivery's workers; false if the run is ending.
func (q *delivery) park(op *sendOp) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.runCtx == nil {
		return false
	}
	if q.parked == nil {
		q.parked = make(map[*sendOp]struct{})
	}
	q.parked[op] = struct{}{}
	q.workers.Add(1)
	return true
}

// unparkAll finishes every parked send with err: run's end (runCtx is nil
// by then, so none parks after).
func (q *delivery) unparkAll(err error) {
	q.mu.Lock()
	ops := q.parked
	q.parked = nil
	q.mu.Unlock()
	for op := range ops {
		q.post.Drop(op.e.Envelope.ID)
		op.finish(nil, err)
	}
}

// left is how long op's ack deadline is still away: ackWait's, with the
// link's pace measured until now.
func (op *sendOp) left() time.Duration {
	q := op.q
	return ackWait(op.tries, q.timeout, op.ahead, q.pace.ackInterval()) - time.Since(op.at)
}

// answer is the poster's: the command's ack.
func (op *sendOp) answer(ack *fence.Ack) { op.finish(ack, nil) }

// deadline is the timer's: without an ack by the deadline (as the link's
// pace now puts it), the send ends without one and the worker resends.
func (op *sendOp) deadline() {
	if op.over.Load() {
		return
	}
	op.mu.Lock()
	defer op.mu.Unlock()
	if left := op.left(); left > 0 {
		op.timer.Reset(left)
		return
	}
	if !op.q.post.Drop(op.e.Envelope.ID) {
		op.timer.Reset(recheck) // not posted yet, or its ack is being handed over
		return
	}
	op.finishLocked(nil, fmt.Errorf("await ack for %s: %w", op.e.Envelope.ID, errAckDeadline))
}

// finish ends op with its outcome, once: the first call resumes the
// worker in a goroutine of its own; later calls do nothing.
func (op *sendOp) finish(ack *fence.Ack, err error) {
	op.mu.Lock()
	defer op.mu.Unlock()
	op.finishLocked(ack, err)
}

func (op *sendOp) finishLocked(ack *fence.Ack, err error) {
	if !op.over.CompareAndSwap(false, true) {
		return
	}
	if op.timer != nil {
		op.timer.Stop()
	}
	op.endPost()
	q := op.q
	q.mu.Lock()
	delete(q.parked, op)
	q.mu.Unlock()
	go q.resume(op, ack, err)
}

// resume settles op's outcome and runs its worker on; it is counted among
// delivery's workers since op parked.
func (q *delivery) resume(op *sendOp, ack *fence.Ack, err error) {
	defer q.workers.Done()
	<-op.posted // the Post returned: the resend cannot overlap it
	busy := q.pace.inflight.Add(-1) > 0
	if err == nil {
		q.pace.acked(time.Now(), busy)
	}
	q.work(op.ctx, op.w, goOn(q.sent(op.ctx, op.w, op.e, ack, err)))
}
