package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/history"
	"github.com/edgefence/edgefence/internal/backoff"
	"github.com/edgefence/edgefence/offline"
)

// The command path with an outbox (Options.Outbox):
//
//	Send ─▶ outbox.Append (fsync) ─▶ kick(device) ─▶ worker: Next ─▶ Sender.Send ─▶ Resolve(ack)
//	  └──────────── waits for its ack, up to command.timeout ◀── notify ◀──────────┘
//
// One worker per device with pending entries delivers them one at a time, in
// queue order, with their original token and seq; a command with no ack is
// sent again (the same envelope: a fence point answers a repeat as a
// duplicate and never applies it twice) until an ack comes. Workers exist
// only while their device has pending entries.
//
// Expiry: an entry that has never been handed to the transport ends as
// expired when its TTL passes. The entry a worker has begun sending (and,
// after a restart, the head of every queue, which the previous process may
// have sent) is never expired locally — it may have reached the broker, so
// only the device can say what became of it; it is resent until the device
// answers.

const (
	expireEvery  = time.Second
	compactEvery = time.Hour
)

// delivery is the outbox's side of the agent: it issues commands under
// the device's controller (send.go), stores them, runs one worker per
// device with pending entries, resends, settles verdicts (the outbox's
// Resolve, group-committed), expires and compacts. It sees the leases
// through deposer (a fence point refused the current token) and reads
// device.ctl; which device fields it writes is said on device.
//
// Its locks: mu guards the waiters and the run state (runCtx, starting a
// worker); expireMu orders an expiry pass (W) against a worker
// picking its next entry (R). Order: d.sem → expireMu → mu → d.mu.
type delivery struct {
	outbox  *offline.Outbox
	sender  Sender
	hist    *history.Writer // nil: no history
	log     *slog.Logger
	now     func() time.Time
	timeout time.Duration      // command.timeout: how long Send waits for an ack
	later   bool               // outbox.verdict_delay > 0: device verdicts ride on the next commit (verdicts.go)
	gateway string             // the envelopes' Holder
	devices map[string]*device // the agent's; read-only
	leases  deposer
	trust   *trustPush  // nil: no trust updates
	auth    *deviceAuth // the checks of acks: which ones did not verify (untrusted.go)
	// learnEpoch takes the epoch a device's fence point answered at
	// (Agent.ackEpoch, epoch.go).
	learnEpoch func(d *device, ack *fence.Ack)
	lossRule

	mu      sync.Mutex
	waiters map[string]waiter // command id → its Send (or fan-out), waiting
	runCtx  context.Context   // set while run runs; nil: no new workers
	workers sync.WaitGroup    // the workers' goroutines and their parked sends
	post    poster            // the sender, if it can post (post.go); nil: Send
	// postAbove: with this many commands in flight on the link or
	// more, a send parks its worker (post.go); below, it waits.
	postAbove int64
	parked    map[*sendOp]struct{} // the parked sends (post.go)

	expireMu sync.RWMutex // expiry (W) vs a worker picking its next entry (R)

	stats deliveryCounters
	pace  linkPace // the resend policy's view of the link (resend.go)
}

// deliveryCounters are delivery's running totals (Counters).
type deliveryCounters struct {
	sent, noAck, sendErr                     atomic.Uint64
	accepted, duplicate, stale, inv, unknown atomic.Uint64
	queued, resent, expired, full            atomic.Uint64
	reissued, outboxErr, superseded          atomic.Uint64
	trustRetried                             atomic.Uint64 // resends after a trust update the fence point lacked (trustretry.go)
	hinted                                   atomic.Uint64 // entries a worker took without a read (hint.go)
}

// deposer is what delivery tells the leases: a fence point refused the
// token of d's current controller ctl as stale (leases' deposed).
type deposer interface {
	deposed(d *device, ctl *controller, env *fence.Envelope, ack *fence.Ack)
	// untrusted: d cannot be commanded with trust under ctl (untrusted.go).
	untrusted(d *device, ctl *controller, reason, why string)
}

// record writes a history event for env, if the agent keeps a history.
func (q *delivery) record(op string, env *fence.Envelope, verdict, reason string) {
	if q.hist == nil {
		return
	}
	err := q.hist.Record(history.Event{Op: op, Device: env.Device, ID: env.ID, Token: uint64(env.Token), Seq: env.Seq,
		Kind: env.Kind, Verdict: verdict, Reason: reason})
	if err != nil {
		q.log.Warn("history", "err", err)
	}
}

// kick makes sure a worker is delivering d's pending entries. Before Run
// starts and after it stops it does nothing: Run kicks every device with
// pending entries when it starts.
func (q *delivery) kick(d *device) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.runCtx == nil {
		return
	}
	d.mu.Lock()
	if d.delivering {
		d.kicked = true
		d.mu.Unlock()
		return
	}
	d.delivering, d.kicked = true, false
	d.mu.Unlock()
	ctx := q.runCtx
	q.workers.Add(1)
	go func() {
		defer q.workers.Done()
		q.deliver(ctx, d)
	}()
}

// kickPending kicks d's worker if d has pending entries.
func (q *delivery) kickPending(d *device) {
	if n, _ := q.outbox.Pending(d.id); n > 0 {
		q.kick(d)
	}
}

// mayDeliver reports whether e may be sent to d now. A strict device's
// queue waits while the agent holds no lock for it — except entries whose
// token a fence point has already refused, which are sent only to have
// their refusal recorded.
func (q *delivery) mayDeliver(d *device, e *offline.Entry) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.policy == PolicyAutonomous || q.ignoresLoss() {
		return true
	}
	if d.ctl != nil && !d.ctl.lost.Load() {
		return true
	}
	return e.Envelope.Token <= d.deposedAt
}

// link is implemented by senders that know whether their link (the broker
// connection) is up, like the MQTT Commander.
type link interface {
	Connected() bool
	AwaitConnection(ctx context.Context) error
}

// superseded says why e must not be sent ("" if it may): a command of an
// epoch the device has left (epoch.go), or a strict device's command of a
// token another session's lock has superseded.
func (q *delivery) superseded(d *device, e *offline.Entry) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if e.Envelope.Epoch < d.epoch {
		return fmt.Sprintf("superseded: epoch %d is closed, the device is at epoch %d; never sent", e.Envelope.Epoch, d.epoch)
	}
	if d.untrusted != "" && (d.ctl == nil || d.ctl.lost.Load()) {
		return "superseded: " + d.untrusted + "; never sent"
	}
	if d.policy == PolicyAutonomous || q.ignoresLoss() || e.Envelope.Token > d.deposedAt {
		return ""
	}
	if d.ctl == nil || d.ctl.lost.Load() || d.ctl.token != e.Envelope.Token {
		return "superseded: another session holds the lock; never sent"
	}
	return ""
}

// deliver is a device's worker: it sends the device's pending entries in
// order until none is left (or the device's policy holds them back, or ctx
// ends).
func (q *delivery) deliver(ctx context.Context, d *device) {
	// Jittered: the workers that failed together resend spread out.
	q.work(ctx, &worker{d: d, delay: backoff.Backoff{Min: 100 * time.Millisecond, Max: 5 * time.Second}}, more)
}

// stepped is what a worker's step leaves it to do.
type stepped uint8

const (
	idle   stepped = iota // nothing to deliver now, or ctx ended
	more                  // go on with the next entry
	parked                // a command is at the device; its outcome resumes the worker (post.go)
)

// goOn is more if ok, else idle.
func goOn(ok bool) stepped {
	if ok {
		return more
	}
	return idle
}

// work runs w from s: it steps through its device's entries until none is
// left to deliver now, or until a step parks it (then the goroutine that
// resumes it runs work again, and this one must not touch w).
func (q *delivery) work(ctx context.Context, w *worker, s stepped) {
	d := w.d
	for {
		for s == more && ctx.Err() == nil {
			s = q.step(ctx, w)
		}
		if s == parked {
			return
		}
		if !q.flush(w) && backoff.Sleep(ctx, w.delay.Next()) {
			s = more // its entry is pending again: resend it
			continue
		}
		d.mu.Lock()
		if d.kicked && ctx.Err() == nil {
			d.kicked = false
			d.mu.Unlock()
			s = more
			continue
		}
		d.delivering = false
		d.mu.Unlock()
		return
	}
}

// worker is one run of a device's worker (deliver): its device, its
// backoff, the entry it is sending and how often it has, and the verdicts
// it is recording (verdicts.go).
type worker struct {
	d      *device
	delay  backoff.Backoff
	headID string
	tries  int
	// trustTries counts the resends of headID after a trust update its
	// fence point lacked (trustretry.go).
	trustTries int
	// unrecorded are device verdicts settled and not yet given to the
	// outbox (at most verdictBatch), recording the batch being recorded
	// (ResolveAll, fsynced) by its own goroutine while the worker sends
	// the next entries: at most one. flush records and waits for both.
	unrecorded []settled
	recording  *recordOp
	// waited counts the verdicts with a waiter left to ride on the
	// outbox's next commit (outbox.verdict_delay) since the worker last
	// asked for one (waitedLater).
	waited int
}

// step acts on the worker's device's next pending entry: it expires it,
// ends it as superseded, or sends it once and settles its verdict (or
// parks the worker until it comes: post.go). It returns idle when the
// worker is done for now (nothing to deliver, the device's policy holds
// the queue back, or ctx ended).
func (q *delivery) step(ctx context.Context, w *worker) stepped {
	d := w.d
	e, attempted, err := q.next(w)
	q.waitedLater(w, e)
	if err != nil {
		// A corrupt record: the queue stops there (fail closed)
		// until an operator repairs it; try again later.
		q.stats.outboxErr.Add(1)
		q.log.Error("outbox: cannot read the next command; device queue held", "device", d.id, "err", err)
		return goOn(backoff.Sleep(ctx, w.delay.Next()))
	}
	if e == nil {
		return idle
	}
	if !attempted && !q.now().Before(e.Deadline) {
		// Never sent and past its TTL: expire it, not send it.
		d.mu.Lock()
		d.inflight = ""
		d.mu.Unlock()
		q.expire()
		return more
	}
	if why := q.superseded(d, e); !attempted && why != "" {
		// Never sent, and another session holds the lock now (a strict
		// device does not get old orders late), or its epoch is
		// closed. End it as stale without sending it.
		ack := &fence.Ack{V: fence.Version, Device: d.id, ID: e.Envelope.ID, Token: e.Envelope.Token, Seq: e.Envelope.Seq,
			Verdict: fence.Stale, Reason: why}
		q.stats.superseded.Add(1)
		d.superseded.Add(1)
		return goOn(q.settle(w, e, ack, true) || backoff.Sleep(ctx, w.delay.Next()))
	}
	return q.attempt(ctx, w, e, attempted)
}

// next returns the worker's device's next entry if it may be delivered
// now (nil if not), and whether a worker may have sent it before
// (attempted): the one behind the entry whose verdict is being recorded,
// if one is. It marks the entry in flight: expiry leaves it alone.
func (q *delivery) next(w *worker) (e *offline.Entry, attempted bool, err error) {
	d := w.d
	q.expireMu.RLock()
	defer q.expireMu.RUnlock()
	e = q.takeFresh(d) // hint.go: no read when the entry was just stored
	if e == nil {
		// An empty queue needs no read (after a fan-out's verdict, the
		// usual case): the outbox counts an entry as pending from its
		// reservation, before its commit, until its terminal state is
		// recorded or deferred (offline's ResolveLater, which NextAfter
		// skips as well), an unreadable one included. An entry stored
		// after this look kicks the worker again.
		if n, _ := q.outbox.Pending(d.id); n == 0 {
			return nil, false, nil
		}
		var ok bool
		e, ok, err = q.outbox.NextAfter(d.id, w.settledThrough())
		if err != nil || !ok {
			return nil, false, err
		}
	}
	if !q.mayDeliver(d, e) {
		return nil, false, nil
	}
	d.mu.Lock()
	_, answered := d.recording[e.Envelope.ID] // answered once; its record failed
	attempted = d.inflight == e.Envelope.ID || answered
	d.inflight = e.Envelope.ID
	d.handed = max(d.handed, e.Pos)
	d.mu.Unlock()
	return e, attempted, nil
}

// attempt sends e once and settles its verdict (sent): through a poster,
// with postAbove commands or more in flight, it parks the worker until
// the verdict comes (post.go), else it waits for it. It returns idle when
// ctx ended.
func (q *delivery) attempt(ctx context.Context, w *worker, e *offline.Entry, attempted bool) stepped {
	if attempted {
		q.stats.resent.Add(1)
	}
	q.stats.sent.Add(1)
	if e.Envelope.ID != w.headID {
		w.headID, w.tries, w.trustTries = e.Envelope.ID, 0, 0
	}
	if q.post != nil && q.pace.inflight.Load() >= q.postAbove {
		return q.postAttempt(ctx, w, e)
	}
	sctx, done := q.ackContext(ctx, w.tries) // resend.go
	w.tries++
	ack, err := q.sender.Send(sctx, &e.Envelope)
	done(err == nil)
	return goOn(q.sent(ctx, w, e, ack, err))
}

// sent acts on the outcome of one send of e: it settles its verdict, or,
// without one, waits for the link or a backoff before the worker resends.
// It returns false when ctx ended.
func (q *delivery) sent(ctx context.Context, w *worker, e *offline.Entry, ack *fence.Ack, err error) bool {
	d := w.d
	if err != nil {
		if ctx.Err() != nil {
			return false
		}
		q.flush(w) // the verdicts before it: not kept waiting on this one (a failure resends them)
		q.stats.noAck.Add(1)
		if l, ok := q.sender.(link); ok && !l.Connected() {
			// The link is down: resend the moment it is back (the
			// replay after an outage), not a backoff later.
			q.log.Info("link down; command stays queued until it is back", "device", d.id, "token", e.Envelope.Token,
				"seq", e.Envelope.Seq, "id", e.Envelope.ID)
			if l.AwaitConnection(ctx) != nil {
				return false
			}
			w.delay.Reset()
			return true
		}
		q.untrustedAfter(w, &e.Envelope, nil)
		wait := w.delay.Next()
		q.log.Warn("no verdict yet; command stays queued and will be resent", "device", d.id, "token", e.Envelope.Token,
			"seq", e.Envelope.Seq, "id", e.Envelope.ID, "err", err, "retry_in", wait)
		return backoff.Sleep(ctx, wait)
	}
	if q.retryWithTrust(w, e, ack) {
		return true // the same envelope again, after the trust update (trustretry.go)
	}
	if !q.settle(w, e, ack, false) {
		return backoff.Sleep(ctx, w.delay.Next())
	}
	w.delay.Reset()
	return true
}

// resendAfter is how long a worker waits for the ack of its tries+1-th
// attempt at one command before sending it again when nothing else is in
// flight on the link (ackWait stretches it by the link's backlog): 1 s,
// 2 s, 4 s … up to the command timeout. A resend is safe (the fence point answers a repeat
// as a duplicate), and a short first wait matters after an outage: a
// command published before the device has resubscribed is dropped by the
// broker, and only a resend reaches it.
func resendAfter(tries int, timeout time.Duration) time.Duration {
	return min(timeout, time.Second<<min(tries, 10))
}

// settle records ack as e's terminal state and acts on it. It returns false
// if the outbox could not record it (the entry stays pending and is resent:
// the fence point will answer duplicate or stale, never apply twice). local
// means the agent decided the verdict itself (the command was never sent).
//
// A device's verdict other than stale is recorded while the worker goes
// on to the next entries (the outbox's fsync off the device's path: one
// command is still in flight at the device, in queue order), several in
// one commit when the queue is deep (verdicts.go); a record that fails
// leaves its entries pending, so they are resent (duplicates at the
// device).
func (q *delivery) settle(w *worker, e *offline.Entry, ack *fence.Ack, local bool) bool {
	d, env := w.d, &e.Envelope
	if ack.ID == "" { // matched by correlation data; the outbox keys by id
		c := *ack
		c.ID = env.ID
		ack = &c
	}
	// After a record that failed, this one is made at once: the next
	// entry is then the failed one again. A stale verdict or the agent's
	// own is recorded at once, after the verdicts before it. With
	// outbox.verdict_delay, a device's other verdicts are settled now and
	// recorded with the outbox's next commit (resolveLater; its waiter is
	// told once it is).
	later := q.later && !local && ack.Verdict != fence.Stale
	async := !later && !local && ack.Verdict != fence.Stale && q.queueVerdict(w, e, ack)
	switch {
	case later:
		if q.resolveLater(d, e, ack) {
			w.waited++
		}
	case !async:
		q.flush(w)
		if err := q.resolve(ack); err != nil && !q.resolveFailed(d, ack, err) {
			return false
		}
	}
	d.mu.Lock()
	if d.inflight == env.ID {
		d.inflight = ""
	}
	if !async && !later {
		delete(d.recording, env.ID) // recorded now, if a failed batch had kept it
	}
	d.lastAck = ack
	if ack.Verdict == fence.Stale && env.Token > d.deposedAt {
		d.deposedAt = env.Token
	}
	if !local && ack.Epoch == env.Epoch && env.Epoch == d.epoch {
		d.noteMark(ack) // a mark of another epoch says nothing of our tokens
	}
	ctl := d.ctl
	if ack.Verdict == fence.Accepted && ctl != nil && ctl.token == env.Token {
		d.refusals = 0
	}
	d.mu.Unlock()
	if !local {
		q.countVerdict(d, ack.Verdict)
	}
	if !async && !later { // recorded tells the waiter of a later one, once it is durable
		q.record(history.OpTerminal, env, ack.Verdict.String(), ack.Reason)
		q.notify(env.ID, ack)
	}
	q.logVerdict(d, env, ack, local)
	if ack.Verdict != fence.Stale {
		if !local {
			q.untrustedAfter(w, env, ack)
		}
		return true
	}
	q.afterStale(d, ctl, e, ack, local)
	return true
}

// afterStale acts on a stale verdict for e: a closed epoch is learnt and
// the command reissued if its kind asks; a stale answer to the current
// token is a deposition; one to an older token reissues under the current.
func (q *delivery) afterStale(d *device, ctl *controller, e *offline.Entry, ack *fence.Ack, local bool) {
	env := &e.Envelope
	if !local && ack.Epoch > env.Epoch || env.Epoch < d.epochOf() {
		// Its epoch is closed: the device is at a later one (the
		// operator's reset or epoch statement), or the agent moved on
		// while the command was out — neither a deposition nor a token
		// regression in the epoch the agent commands in now.
		if !local {
			q.learnEpoch(d, ack)
		}
		if ctl != nil && !ctl.lost.Load() && d.reissue[env.Kind] {
			q.reissue(d, e)
		}
		return
	}
	switch {
	case ctl != nil && ctl.token == env.Token:
		q.leases.deposed(d, ctl, env, ack)
	case ctl != nil && ctl.token > env.Token && !ctl.lost.Load() && d.reissue[env.Kind]:
		q.reissue(d, e)
	}
}

// resolveFailed logs a verdict the outbox did not record; false: the
// entry stays pending and will be resent.
func (q *delivery) resolveFailed(d *device, ack *fence.Ack, err error) bool {
	if !errors.Is(err, offline.ErrResolved) {
		q.stats.outboxErr.Add(1)
		q.log.Error("outbox: cannot record verdict; will resend", "device", d.id, "id", ack.ID, "verdict", ack.Verdict, "err", err)
		return false
	}
	// Cannot happen while this worker is the only one to resolve d's
	// entries; say so loudly if it does.
	q.log.Error("outbox: verdict for a command already terminal", "device", d.id, "id", ack.ID, "verdict", ack.Verdict, "err", err)
	return true
}

// reissue queues the command of a refused old-token entry again under the
// device's current token, if no later command of the same kind is pending
// (a later one supersedes it).
func (q *delivery) reissue(d *device, e *offline.Entry) {
	recs, err := q.outbox.List(offline.Filter{Device: d.id, PendingOnly: true})
	if err != nil {
		q.log.Warn("reissue: cannot list the queue; not reissued", "device", d.id, "id", e.Envelope.ID, "err", err)
		return
	}
	for _, r := range recs {
		if r.Kind == e.Envelope.Kind && r.Pos > e.Pos {
			q.log.Info("reissue: a later command of the same kind is queued; not reissued", "device", d.id, "id", e.Envelope.ID, "later", r.ID)
			return
		}
	}
	d.sem <- struct{}{}
	d.mu.Lock()
	ctl := d.ctl
	d.mu.Unlock()
	epoch := d.epochOf()
	if ctl == nil || ctl.lost.Load() || ctl.token <= e.Envelope.Token && epoch <= e.Envelope.Epoch {
		<-d.sem
		return
	}
	ctl.seq++
	env := e.Envelope
	now := q.now()
	env.Token, env.Seq, env.ID, env.IssuedAt, env.Epoch = ctl.token, ctl.seq, offline.NewCommandID(now), now.UnixMilli(), epoch
	ne := &offline.Entry{Envelope: env}
	err = q.outbox.Append(context.Background(), ne)
	if err != nil {
		ctl.seq--
	}
	<-d.sem
	if err != nil {
		q.log.Error("reissue: not queued", "device", d.id, "id", e.Envelope.ID, "err", err)
		return
	}
	q.stats.reissued.Add(1)
	q.record(history.OpCreated, &env, "", "reissue of "+e.Envelope.ID)
	q.log.Info("reissued under the current token", "device", d.id, "kind", env.Kind, "old_id", e.Envelope.ID,
		"old_token", e.Envelope.Token, "id", env.ID, "token", env.Token, "seq", env.Seq)
}

// waiter is a command's waiter: the channel its ack goes to, and whether
// the waiter paces the outbox's commits of its verdicts itself (a
// fan-out: fanWait) rather than the worker asking for each (waitedLater).
type waiter struct {
	ch    chan *fence.Ack
	paced bool
}

// waited reports whether command id has a waiter the worker asks the
// outbox's commit for (Send, Pending.Wait; not a fan-out's).
func (q *delivery) waited(id string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	w, ok := q.waiters[id]
	return ok && !w.paced
}

// notify hands ack to command id's waiter, if it has one; ack must be
// durable in the outbox (invariant I9).
func (q *delivery) notify(id string, ack *fence.Ack) {
	q.mu.Lock()
	ch := q.waiters[id].ch
	q.mu.Unlock()
	if ch != nil {
		select {
		case ch <- ack:
		default:
		}
	}
}

// expire ends the queued commands past their TTL that were never sent.
func (q *delivery) expire() {
	q.expireMu.Lock()
	defer q.expireMu.Unlock()
	ended, err := q.outbox.ExpireEntries(func(dev, id string) bool {
		d := q.devices[dev]
		if d == nil {
			return false
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		_, rec := d.recording[id]
		return d.inflight == id || rec
	})
	if err != nil {
		q.stats.outboxErr.Add(1)
		q.log.Error("outbox: expiry", "err", err)
	}
	for _, x := range ended {
		q.stats.expired.Add(1)
		env := &fence.Envelope{Device: x.Device, ID: x.ID, Token: x.Token, Seq: x.Seq, Kind: x.Kind}
		q.record(history.OpTerminal, env, fence.Expired.String(), "time to live passed before it was sent")
		ack := &fence.Ack{V: fence.Version, Device: x.Device, ID: x.ID, Token: x.Token, Seq: x.Seq, Verdict: fence.Expired,
			Reason: "time to live passed before it was sent"}
		if d := q.devices[x.Device]; d != nil {
			d.verdicts[verdictIndex(fence.Expired)].Add(1)
			d.mu.Lock()
			d.lastAck = ack // the last verdict shown is the last command that ended
			if d.fresh != nil && d.fresh.Envelope.ID == x.ID {
				d.fresh = nil // ended: no longer the device's next (hint.go)
			}
			d.mu.Unlock()
		}
		q.notify(x.ID, ack)
		q.log.Warn("command refused", "device", x.Device, "token", x.Token, "reason", ack.Reason, "verdict", fence.Expired,
			"seq", x.Seq, "id", x.ID, "kind", x.Kind, "sent", false)
	}
}

// resolve records ack as its entry's terminal state, durably. Acks that
// arrive together (several devices' workers) share one commit: the
// outbox's Resolve is group-committed.
func (q *delivery) resolve(ack *fence.Ack) error {
	return q.outbox.Resolve(ack.ID, ack)
}

// run starts delivery of what an earlier run left queued and runs
// expiry and compaction until ctx ends; then it waits for the workers.
func (q *delivery) run(ctx context.Context) {
	q.mu.Lock()
	q.runCtx = ctx
	q.mu.Unlock()
	for _, id := range q.outbox.Devices() {
		d := q.devices[id]
		if d == nil {
			q.log.Warn("outbox holds commands for a device no longer configured; they will expire", "device", id)
			continue
		}
		// The previous process may have sent the head entry: never
		// expire it locally.
		if e, ok, err := q.outbox.Next(id); err == nil && ok {
			d.mu.Lock()
			d.inflight = e.Envelope.ID
			d.mu.Unlock()
		}
		n, _ := q.outbox.Pending(id)
		q.log.Info("outbox: resuming queued commands", "device", id, "pending", n)
		q.kick(d)
	}
	q.compact(slog.LevelInfo)
	exp := time.NewTicker(expireEvery)
	comp := time.NewTicker(compactEvery)
	defer exp.Stop()
	defer comp.Stop()
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-exp.C:
			q.expire()
			if q.outbox.EndedOver() { // outbox.max_ended: before the hourly pass
				q.compact(slog.LevelDebug) // under a steady load, each second
			}
		case <-comp.C:
			q.compact(slog.LevelInfo)
		}
	}
	q.mu.Lock()
	q.runCtx = nil
	q.mu.Unlock()
	q.unparkAll(ctx.Err())
	q.workers.Wait()
	q.outbox.Flush() // the verdicts still waiting: durable, and in the history, before Run returns
}

// compact deletes the ended commands past outbox.retention or over
// outbox.max_ended, logging how many at level.
func (q *delivery) compact(level slog.Level) {
	n, err := q.outbox.Compact()
	if err != nil {
		q.stats.outboxErr.Add(1)
		q.log.Error("outbox: compaction", "err", err)
		return
	}
	if n > 0 {
		q.log.Log(context.Background(), level, "outbox: compacted terminal entries past retention or over max_ended", "entries", n, "kept", q.outbox.Ended())
	}
}
