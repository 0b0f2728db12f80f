package agent

import (
	"context"
	"errors"
	"fmt"
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

// sendQueued appends env durably, hands it to the device's worker, and, if
// wait, waits up to the command timeout for its ack. The caller holds d.sem
// and sendQueued releases it once the entry is stored.
func (a *Agent) sendQueued(ctx context.Context, d *device, ctl *controller, env *fence.Envelope, wait bool) (*fence.Ack, *fence.Envelope, error) {
	// Wait for the ack from before the append: a running worker may
	// deliver the entry the moment it is stored.
	ch := make(chan *fence.Ack, 1)
	if wait {
		a.wmu.Lock()
		a.waiters[env.ID] = ch
		a.wmu.Unlock()
		defer func() {
			a.wmu.Lock()
			delete(a.waiters, env.ID)
			a.wmu.Unlock()
		}()
	}
	e := &offline.Entry{Envelope: *env}
	if err := a.outbox.Append(ctx, e); err != nil {
		ctl.seq-- // nothing was created
		<-d.sem
		if errors.Is(err, offline.ErrFull) {
			a.stats.full.Add(1)
		}
		return nil, nil, fmt.Errorf("send to %s: %w", d.id, err)
	}
	a.stats.queued.Add(1)
	a.record(history.OpCreated, env, "", "")
	<-d.sem
	a.kick(d)
	if !wait {
		return nil, env, nil
	}

	t := time.NewTimer(a.cfg.Command.Timeout)
	defer t.Stop()
	select {
	case ack := <-ch:
		return ack, env, ack.Err()
	case <-t.C:
		return nil, env, &QueuedError{Device: d.id, ID: env.ID, Token: env.Token, Seq: env.Seq,
			Err: fmt.Errorf("%w within %v", ErrNoAck, a.cfg.Command.Timeout)}
	case <-ctx.Done():
		return nil, env, &QueuedError{Device: d.id, ID: env.ID, Token: env.Token, Seq: env.Seq, Err: ctx.Err()}
	}
}

// QueuedError is Send's error when the caller stopped waiting before the
// device answered (no ack within the command timeout, or ctx ended): the
// command is stored in the outbox and will be delivered; its terminal
// state is recorded there under ID. It matches ErrQueued and ErrNoAck.
type QueuedError struct {
	Device string
	ID     string
	Token  fence.Token
	Seq    uint64
	Err    error // why the wait ended
}

func (e *QueuedError) Error() string {
	return fmt.Sprintf("send to %s (token %d seq %d): %v: %v as %s", e.Device, e.Token, e.Seq, e.Err, ErrQueued, e.ID)
}

// Unwrap returns ErrQueued, ErrNoAck and the reason the wait ended.
func (e *QueuedError) Unwrap() []error { return []error{ErrQueued, ErrNoAck, e.Err} }

// record writes a history event for env, if the agent keeps a history.
func (a *Agent) record(op string, env *fence.Envelope, verdict, reason string) {
	if a.hist == nil {
		return
	}
	err := a.hist.Record(history.Event{Op: op, Device: env.Device, ID: env.ID, Token: uint64(env.Token), Seq: env.Seq,
		Kind: env.Kind, Verdict: verdict, Reason: reason})
	if err != nil {
		a.log.Warn("history", "err", err)
	}
}

// kick makes sure a worker is delivering d's pending entries. Before Run
// starts and after it stops it does nothing: Run kicks every device with
// pending entries when it starts.
func (a *Agent) kick(d *device) {
	a.wmu.Lock()
	defer a.wmu.Unlock()
	if a.runCtx == nil {
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
	ctx := a.runCtx
	a.workers.Add(1)
	go func() {
		defer a.workers.Done()
		a.deliver(ctx, d)
	}()
}

// mayDeliver reports whether e may be sent to d now. A strict device's
// queue waits while the agent holds no lock for it — except entries whose
// token a fence point has already refused, which are sent only to have
// their refusal recorded.
func (a *Agent) mayDeliver(d *device, e *offline.Entry) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.policy == PolicyAutonomous || a.ignoresLoss() {
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

// superseded reports whether e is a strict device's command of a token
// another session's lock has superseded.
func (a *Agent) superseded(d *device, e *offline.Entry) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.policy == PolicyAutonomous || a.ignoresLoss() || e.Envelope.Token > d.deposedAt {
		return false
	}
	return d.ctl == nil || d.ctl.lost.Load() || d.ctl.token != e.Envelope.Token
}

// deliver is a device's worker: it sends the device's pending entries in
// order until none is left (or the device's policy holds them back, or ctx
// ends).
func (a *Agent) deliver(ctx context.Context, d *device) {
	// Jittered: the workers that failed together resend spread out.
	delay := backoff.Backoff{Min: 100 * time.Millisecond, Max: 5 * time.Second}
	var headID string // the entry being sent, and how often it was
	var tries int
	for {
		for ctx.Err() == nil {
			a.expireMu.RLock()
			e, ok, err := a.outbox.Next(d.id)
			if err != nil {
				a.expireMu.RUnlock()
				// A corrupt record: the queue stops there (fail closed)
				// until an operator repairs it; try again later.
				a.stats.outboxErr.Add(1)
				a.log.Error("outbox: cannot read the next command; device queue held", "device", d.id, "err", err)
				if !backoff.Sleep(ctx, delay.Next()) {
					break
				}
				continue
			}
			if !ok || !a.mayDeliver(d, e) {
				a.expireMu.RUnlock()
				break
			}
			d.mu.Lock()
			attempted := d.inflight == e.Envelope.ID
			d.inflight = e.Envelope.ID
			d.mu.Unlock()
			a.expireMu.RUnlock()
			if !attempted && !a.now().Before(e.Deadline) {
				// Never sent and past its TTL: expire it, not send it.
				d.mu.Lock()
				d.inflight = ""
				d.mu.Unlock()
				a.expire()
				continue
			}
			if !attempted && a.superseded(d, e) {
				// Never sent, and another session holds the lock now:
				// a strict device does not get old orders late. End it
				// as stale without sending it.
				ack := &fence.Ack{V: fence.Version, Device: d.id, ID: e.Envelope.ID, Token: e.Envelope.Token, Seq: e.Envelope.Seq,
					Verdict: fence.Stale, Reason: "superseded: another session holds the lock; never sent"}
				a.stats.superseded.Add(1)
				d.superseded.Add(1)
				if !a.settle(d, e, ack, true) && !backoff.Sleep(ctx, delay.Next()) {
					break
				}
				continue
			}
			if attempted {
				a.stats.resent.Add(1)
			}
			a.stats.sent.Add(1)
			if e.Envelope.ID != headID {
				headID, tries = e.Envelope.ID, 0
			}
			sctx, cancel := context.WithTimeout(ctx, resendAfter(tries, a.cfg.Command.Timeout))
			tries++
			ack, err := a.sender.Send(sctx, &e.Envelope)
			cancel()
			if err != nil {
				if ctx.Err() != nil {
					break
				}
				a.stats.noAck.Add(1)
				if l, ok := a.sender.(link); ok && !l.Connected() {
					// The link is down: resend the moment it is back
					// (the replay after an outage), not a backoff later.
					a.log.Info("link down; command stays queued until it is back", "device", d.id, "token", e.Envelope.Token,
						"seq", e.Envelope.Seq, "id", e.Envelope.ID)
					if l.AwaitConnection(ctx) != nil {
						break
					}
					delay.Reset()
					continue
				}
				wait := delay.Next()
				a.log.Warn("no verdict yet; command stays queued and will be resent", "device", d.id, "token", e.Envelope.Token,
					"seq", e.Envelope.Seq, "id", e.Envelope.ID, "err", err, "retry_in", wait)
				if !backoff.Sleep(ctx, wait) {
					break
				}
				continue
			}
			if !a.settle(d, e, ack, false) {
				if !backoff.Sleep(ctx, delay.Next()) {
					break
				}
				continue
			}
			delay.Reset()
		}
		d.mu.Lock()
		if d.kicked && ctx.Err() == nil {
			d.kicked = false
			d.mu.Unlock()
			continue
		}
		d.delivering = false
		d.mu.Unlock()
		return
	}
}

// resendAfter is how long a worker waits for the ack of its tries+1-th
// attempt at one command before sending it again: 1 s, 2 s, 4 s … up to
// the command timeout. A resend is safe (the fence point answers a repeat
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
func (a *Agent) settle(d *device, e *offline.Entry, ack *fence.Ack, local bool) bool {
	env := &e.Envelope
	if ack.ID == "" { // matched by correlation data; the outbox keys by id
		c := *ack
		c.ID = env.ID
		ack = &c
	}
	if err := a.resolve(ack); err != nil {
		if !errors.Is(err, offline.ErrResolved) {
			a.stats.outboxErr.Add(1)
			a.log.Error("outbox: cannot record verdict; will resend", "device", d.id, "id", env.ID, "verdict", ack.Verdict, "err", err)
			return false
		}
		// Cannot happen while this worker is the only one to resolve
		// d's entries; say so loudly if it does.
		a.log.Error("outbox: verdict for a command already terminal", "device", d.id, "id", env.ID, "verdict", ack.Verdict, "err", err)
	}
	d.mu.Lock()
	if d.inflight == env.ID {
		d.inflight = ""
	}
	d.lastAck = ack
	if ack.Verdict == fence.Stale && env.Token > d.deposedAt {
		d.deposedAt = env.Token
	}
	if !local {
		d.noteMark(ack)
	}
	ctl := d.ctl
	if ack.Verdict == fence.Accepted && ctl != nil && ctl.token == env.Token {
		d.refusals = 0
	}
	d.mu.Unlock()
	if !local {
		a.countVerdict(d, ack.Verdict)
	}
	a.record(history.OpTerminal, env, ack.Verdict.String(), ack.Reason)
	a.notify(env.ID, ack)
	a.logVerdict(d, env, ack, local)
	if ack.Verdict != fence.Stale {
		return true
	}
	switch {
	case ctl != nil && ctl.token == env.Token:
		a.deposed(d, ctl, env, ack)
	case ctl != nil && ctl.token > env.Token && !ctl.lost.Load() && d.reissue[env.Kind]:
		a.reissue(d, e)
	}
	return true
}

// deposed stops ctl after a fence point refused its token: a newer holder
// has reached the device (I6), or the device holds a token from a past etcd
// (a token regression, told apart by recampaign). It is a lease change,
// logged as one line. The lock is let go, so that it can move on, and the
// device is campaigned for again after a backoff.
func (a *Agent) deposed(d *device, ctl *controller, env *fence.Envelope, ack *fence.Ack) {
	reason := fmt.Sprintf("deposed: the fence point holds newer token %d", ack.MaxToken)
	if a.ignoresLoss() {
		reason += " (UNSAFE: the controller carries on)"
	}
	a.log.Warn("lease lost", "device", d.id, "token", env.Token, "reason", reason, "holder", a.cfg.Gateway, "fence_token", ack.MaxToken)
	if a.ignoresLoss() {
		return
	}
	if ctl.lost.Swap(true) {
		return // another verdict, or the session's end, came first
	}
	// The first news of this lock's loss counts as one loss, unless the
	// session's end already counted it (autonomy).
	d.mu.Lock()
	counted := d.autonomy && d.ctl == ctl
	d.mu.Unlock()
	if !counted {
		a.stats.lost.Add(1)
	}
	a.setStateReason(d, ctl, StateLost, reason)
	a.recampaign(d, ctl.token, ctl.key, ctl.lease, true)
}

// reissue queues the command of a refused old-token entry again under the
// device's current token, if no later command of the same kind is pending
// (a later one supersedes it).
func (a *Agent) reissue(d *device, e *offline.Entry) {
	recs, err := a.outbox.List(offline.Filter{Device: d.id, PendingOnly: true})
	if err != nil {
		a.log.Warn("reissue: cannot list the queue; not reissued", "device", d.id, "id", e.Envelope.ID, "err", err)
		return
	}
	for _, r := range recs {
		if r.Kind == e.Envelope.Kind && r.Pos > e.Pos {
			a.log.Info("reissue: a later command of the same kind is queued; not reissued", "device", d.id, "id", e.Envelope.ID, "later", r.ID)
			return
		}
	}
	d.sem <- struct{}{}
	d.mu.Lock()
	ctl := d.ctl
	d.mu.Unlock()
	if ctl == nil || ctl.lost.Load() || ctl.token <= e.Envelope.Token {
		<-d.sem
		return
	}
	ctl.seq++
	env := e.Envelope
	env.Token, env.Seq, env.ID, env.IssuedAt = ctl.token, ctl.seq, newCommandID(), a.now().UnixMilli()
	ne := &offline.Entry{Envelope: env}
	err = a.outbox.Append(context.Background(), ne)
	if err != nil {
		ctl.seq--
	}
	<-d.sem
	if err != nil {
		a.log.Error("reissue: not queued", "device", d.id, "id", e.Envelope.ID, "err", err)
		return
	}
	a.stats.reissued.Add(1)
	a.record(history.OpCreated, &env, "", "reissue of "+e.Envelope.ID)
	a.log.Info("reissued under the current token", "device", d.id, "kind", env.Kind, "old_id", e.Envelope.ID,
		"old_token", e.Envelope.Token, "id", env.ID, "token", env.Token, "seq", env.Seq)
}

func (a *Agent) notify(id string, ack *fence.Ack) {
	a.wmu.Lock()
	ch := a.waiters[id]
	a.wmu.Unlock()
	if ch != nil {
		select {
		case ch <- ack:
		default:
		}
	}
}

// expire ends the queued commands past their TTL that were never sent.
func (a *Agent) expire() {
	a.expireMu.Lock()
	defer a.expireMu.Unlock()
	ended, err := a.outbox.ExpireEntries(func(dev, id string) bool {
		d := a.devices[dev]
		if d == nil {
			return false
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.inflight == id
	})
	if err != nil {
		a.stats.outboxErr.Add(1)
		a.log.Error("outbox: expiry", "err", err)
	}
	for _, x := range ended {
		a.stats.expired.Add(1)
		env := &fence.Envelope{Device: x.Device, ID: x.ID, Token: x.Token, Seq: x.Seq, Kind: x.Kind}
		a.record(history.OpTerminal, env, fence.Expired.String(), "time to live passed before it was sent")
		ack := &fence.Ack{V: fence.Version, Device: x.Device, ID: x.ID, Token: x.Token, Seq: x.Seq, Verdict: fence.Expired,
			Reason: "time to live passed before it was sent"}
		if d := a.devices[x.Device]; d != nil {
			d.verdicts[verdictIndex(fence.Expired)].Add(1)
			d.mu.Lock()
			d.lastAck = ack // the last verdict shown is the last command that ended
			d.mu.Unlock()
		}
		a.notify(x.ID, ack)
		a.log.Warn("command refused", "device", x.Device, "token", x.Token, "reason", ack.Reason, "verdict", fence.Expired,
			"seq", x.Seq, "id", x.ID, "kind", x.Kind, "sent", false)
	}
}

// resolveReq asks the resolver to record one ack.
type resolveReq struct {
	ack  *fence.Ack
	done chan error
}

// resolve records ack as its entry's terminal state, durably, through the
// resolver: acks that arrive together (from several devices' workers) share
// one commit (Outbox.ResolveMany) instead of one fsync each.
func (a *Agent) resolve(ack *fence.Ack) error {
	req := resolveReq{ack: ack, done: make(chan error, 1)}
	a.resolveCh <- req // the resolver runs until every worker has stopped
	return <-req.done
}

// resolver is the group commit of acks: it takes what has queued up while
// the previous commit ran, up to maxResolveBatch, and commits it at once.
// No timer: a lone ack is committed at once.
func (a *Agent) resolver(ch <-chan resolveReq) {
	batch := make([]resolveReq, 0, maxResolveBatch)
	acks := make([]*fence.Ack, 0, maxResolveBatch)
	for req := range ch {
		batch, acks = append(batch[:0], req), append(acks[:0], req.ack)
	more:
		for len(batch) < maxResolveBatch {
			select {
			case r, ok := <-ch:
				if !ok {
					break more
				}
				batch, acks = append(batch, r), append(acks, r.ack)
			default:
				break more
			}
		}
		errs, err := a.outbox.ResolveMany(acks)
		for i, r := range batch {
			switch {
			case err != nil:
				r.done <- err
			default:
				r.done <- errs[i]
			}
		}
	}
}

const maxResolveBatch = 256

// runOutbox starts delivery of what an earlier run left queued and runs
// expiry and compaction until ctx ends; then it waits for the workers.
func (a *Agent) runOutbox(ctx context.Context) {
	resolved := make(chan struct{})
	ch := make(chan resolveReq, maxResolveBatch)
	go func() {
		defer close(resolved)
		a.resolver(ch)
	}()
	a.wmu.Lock()
	a.resolveCh = ch // before any worker exists
	a.runCtx = ctx
	a.wmu.Unlock()
	for _, id := range a.outbox.Devices() {
		d := a.devices[id]
		if d == nil {
			a.log.Warn("outbox holds commands for a device no longer configured; they will expire", "device", id)
			continue
		}
		// The previous process may have sent the head entry: never
		// expire it locally.
		if e, ok, err := a.outbox.Next(id); err == nil && ok {
			d.mu.Lock()
			d.inflight = e.Envelope.ID
			d.mu.Unlock()
		}
		n, _ := a.outbox.Pending(id)
		a.log.Info("outbox: resuming queued commands", "device", id, "pending", n)
		a.kick(d)
	}
	a.compact()
	exp := time.NewTicker(expireEvery)
	comp := time.NewTicker(compactEvery)
	defer exp.Stop()
	defer comp.Stop()
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-exp.C:
			a.expire()
		case <-comp.C:
			a.compact()
		}
	}
	a.wmu.Lock()
	a.runCtx = nil
	a.wmu.Unlock()
	a.workers.Wait()
	close(ch) // no worker is left to resolve
	<-resolved
}

func (a *Agent) compact() {
	n, err := a.outbox.Compact()
	if err != nil {
		a.stats.outboxErr.Add(1)
		a.log.Error("outbox: compaction", "err", err)
		return
	}
	if n > 0 {
		a.log.Info("outbox: compacted terminal entries past retention", "entries", n)
	}
}
