package offline

import (
	"fmt"
	"time"

	"go.etcd.io/bbolt"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/internal/groupcommit"
)

// DefaultVerdictDelay is Options.VerdictDelay's default.
const DefaultVerdictDelay = 100 * time.Millisecond

// Deferred verdicts (ResolveLater): a verdict whose record may wait for
// the outbox's next commit. Its entry ends at once in every view of the
// outbox (Next, List, Get, Summary, Stats, the pending counts), and its
// record rides on the next commit made for any reason (an Append, another
// resolve, SetHeld) or, at the latest, on the one the outbox makes itself
// Options.VerdictDelay after the first verdict left waiting (since the
// last time none was), or on the one CommitSoon starts. Close commits the
// ones still waiting. Until then the file holds the entry pending: a kill
// -9 leaves it pending, to be resent after a restart (the fence point
// answers a duplicate) and ended then, once. A commit that fails puts it
// back: pending again in every view.

// later is a verdict waiting for its commit (ResolveLater).
type later struct {
	dev      string
	size     int64 // its envelope's bytes, taken off the pending counts
	ack      *fence.Ack
	resolved time.Time
}

// ResolveLater is ResolveAll without waiting for the commit: the entries
// end now in the outbox's views, their records ride on the next commit
// (see above), and done gets each ack's error, as ResolveAll's, once
// that commit has been made (fsynced) or has failed — an entry whose
// record failed is pending again. done is called exactly once: at once,
// before ResolveLater returns, for acks all refused at once (not pending,
// unreadable, closed); otherwise on the goroutine of the commit, which
// done must not hold up (nor call the outbox from).
func (ob *Outbox) ResolveLater(acks []*fence.Ack, done func(errs []error)) {
	errs := make([]error, len(acks))
	fail := func(err error) {
		for i, a := range acks {
			errs[i] = fmt.Errorf("offline: resolve %s: %w", ackID(a), err)
		}
		done(errs)
	}
	if ob.opts.ReadOnly {
		fail(ErrReadOnly)
		return
	}
	ob.mu.RLock()
	defer ob.mu.RUnlock()
	if ob.closed {
		fail(ErrClosed)
		return
	}
	ops := make([]resolveOp, len(acks))
	recorded := func(cerrs []error) { ob.recordedLater(acks, ops, cerrs, errs, done) }
	if !ob.deferVerdicts(acks, ops, ob.opts.Now(), recorded) {
		for i := range ops {
			errs[i] = fmt.Errorf("offline: resolve %s: %w", ackID(acks[i]), ops[i].err)
		}
		done(errs)
	}
}

// recordedLater is the outcome of the commit that carried the deferred
// verdicts of acks (ops: their checks; cerrs: the commit's errors of the
// ones deferred): it takes them out of ob.later, puts the failed ones back
// pending, and hands done the errors.
func (ob *Outbox) recordedLater(acks []*fence.Ack, ops []resolveOp, cerrs, errs []error, done func([]error)) {
	ob.lmu.Lock()
	ob.cmu.Lock()
	for i := range ops {
		op := &ops[i]
		if op.err == nil {
			if op.err = cerrs[0]; op.err == nil {
				op.err = op.refused
			}
			cerrs = cerrs[1:]
			l := ob.later[op.id]
			delete(ob.later, op.id)
			if op.err != nil && l != nil { // pending again
				ob.add(l.dev, 1, l.size)
			}
			if op.err == nil {
				ob.ended.Add(1)
			}
		}
		if op.err != nil {
			errs[i] = fmt.Errorf("offline: resolve %s: %w", ackID(acks[i]), op.err)
		}
	}
	ob.cmu.Unlock()
	if len(ob.later) == 0 && ob.armed {
		// Nothing waits: the next verdict gets a full delay to find
		// a commit to ride on.
		ob.timer.Stop()
		ob.armed = false
	}
	ob.lmu.Unlock()
	done(errs)
}

// deferVerdicts checks and encodes the acks, ends their entries in the
// views (ob.later, the pending counts) and parks the calls that record
// them in the group committer, recorded to get their errors; the refused
// ones get their op.err. It reports whether it parked any (false: none
// was, and recorded is never called). It arms the flush timer. ob.mu is
// read-locked.
func (ob *Outbox) deferVerdicts(acks []*fence.Ack, ops []resolveOp, now time.Time, recorded func([]error)) bool {
	calls := make([]groupcommit.Call, 0, len(acks))
	ob.lmu.Lock()
	defer ob.lmu.Unlock()
	if ob.later == nil {
		ob.later = make(map[string]*later)
	}
	var ls []*later
	_ = ob.db.View(func(tx *bbolt.Tx) error {
		for i, a := range acks {
			op := &ops[i]
			if op.err = op.prepare(a); op.err != nil {
				continue
			}
			if _, ok := ob.later[op.id]; ok {
				op.err = fmt.Errorf("%w: %v (not yet recorded)", ErrResolved, ob.later[op.id].ack.Verdict)
				continue
			}
			l, err := pendingLater(tx, op, now)
			if op.err = err; err != nil {
				continue
			}
			ob.later[op.id] = l
			ls = append(ls, l)
			calls = append(calls, op.call(now.UnixMilli()))
		}
		return nil
	})
	if len(ls) == 0 {
		return false
	}
	ob.cmu.Lock()
	for _, l := range ls {
		ob.add(l.dev, -1, -l.size)
	}
	ob.cmu.Unlock()
	// Parked under lmu: a flushSoon pass that begins after this (see
	// there) commits them.
	ob.group.Ride(calls, recorded)
	if !ob.armed {
		ob.armed = true
		ob.gen++
		gen := ob.gen
		ob.timer = time.AfterFunc(ob.opts.VerdictDelay, func() { ob.commitLater(gen) })
	}
	return true
}

// CommitSoon starts a commit of the verdicts left waiting by ResolveLater
// now, without waiting for it: their done callbacks come about one commit
// later, not VerdictDelay. For verdicts someone waits to hear only once
// they are durable. Calls that come while such a commit runs share the
// next one (and any group forming meanwhile: Appends, resolves).
func (ob *Outbox) CommitSoon() {
	ob.lmu.Lock()
	defer ob.lmu.Unlock()
	if len(ob.later) == 0 {
		return // nothing waits
	}
	ob.again = true
	if !ob.flushing {
		ob.flushing = true
		ob.flushers.Add(1)
		go ob.flushSoon()
	}
}

// flushSoon is CommitSoon's goroutine (one at a time: ob.flushing): a
// pass commits the verdicts parked before it began, and passes follow
// each other while CommitSoon was called during the one before. A
// verdict is parked under lmu, before the CommitSoon that asks for it,
// so it is parked before the pass that clears ob.again after it.
func (ob *Outbox) flushSoon() {
	defer ob.flushers.Done()
	for {
		ob.lmu.Lock()
		ob.again = false
		ob.lmu.Unlock()
		ob.mu.RLock()
		closed := ob.closed
		if !closed {
			ob.group.CommitRiders()
		}
		ob.mu.RUnlock()
		ob.lmu.Lock()
		more := !closed && ob.again
		if !more {
			ob.flushing = false
		}
		ob.lmu.Unlock()
		if !more {
			return
		}
	}
}

// pendingLater checks in tx that op's entry is pending (and the ack's
// device its own) and returns its deferred verdict.
func pendingLater(tx *bbolt.Tx, op *resolveOp, now time.Time) (*later, error) {
	r, err := getRecord(tx, []byte(op.id))
	if err != nil {
		return nil, err
	}
	if r.state != 0 {
		return nil, fmt.Errorf("%w: %v", ErrResolved, r.state)
	}
	env, err := fence.UnmarshalEnvelope(r.env)
	if err != nil {
		return nil, corruptf("envelope of %s: %v", op.id, err)
	}
	if op.ack.Device != "" && op.ack.Device != env.Device {
		return nil, fmt.Errorf("%w: ack from device %s for a command to %s", fence.ErrInvalid, op.ack.Device, env.Device)
	}
	return &later{dev: env.Device, size: int64(len(r.env)), ack: op.ack, resolved: now}, nil
}

// commitLater is the flush timer of generation gen: it commits the
// verdicts still waiting.
func (ob *Outbox) commitLater(gen uint64) {
	ob.lmu.Lock()
	if gen != ob.gen {
		ob.lmu.Unlock()
		return // stopped too late: a newer timer is armed, or none is needed
	}
	ob.armed = false
	ob.lmu.Unlock()
	ob.mu.RLock()
	defer ob.mu.RUnlock()
	if !ob.closed {
		ob.group.CommitRiders()
	}
}

// Flush commits the verdicts left waiting by ResolveLater now, and
// returns once their done callbacks have run.
func (ob *Outbox) Flush() {
	ob.mu.RLock()
	defer ob.mu.RUnlock()
	if !ob.closed {
		ob.group.CommitRiders()
	}
}

// Waiting returns how many entries have a verdict waiting for its commit.
func (ob *Outbox) Waiting() int {
	ob.lmu.RLock()
	defer ob.lmu.RUnlock()
	return len(ob.later)
}

// waitingVerdict returns id's deferred verdict, if it has one (ob.lmu
// held).
func (ob *Outbox) waitingVerdict(id []byte) *later {
	return ob.later[string(id)]
}

// overlay shows rec as its deferred verdict ended it, if it has one
// (ob.lmu held).
func (ob *Outbox) overlay(rec *Record) {
	l := ob.later[rec.ID]
	if l == nil || rec.State != 0 {
		return
	}
	rec.State, rec.Resolved, rec.Ack = l.ack.Verdict, time.UnixMilli(l.resolved.UnixMilli()), l.ack
}
