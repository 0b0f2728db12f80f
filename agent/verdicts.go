package agent

import (
	"errors"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/history"
	"github.com/edgefence/edgefence/offline"
)

// Recording a device's verdicts: a device's worker settles a verdict and
// goes on to send the next entry at once; the verdicts are recorded in
// the outbox (ResolveAll: one commit, one fsync) in batches, by a
// goroutine of their own, at most one batch at a time:
//
//   - a batch starts when verdictBatch verdicts are waiting, or when the
//     worker has nothing more to send now (its queue is empty, held back,
//     or the device gave no answer): a lone command is recorded at once,
//     and a deep queue (a firmware download's chunks, a replay after an
//     outage) pays one fsync for up to verdictBatch commands;
//   - a command's waiter (Send, Pending.Wait) gets its ack, and the
//     history its terminal event, only once the verdict is recorded: a
//     kill -9 before leaves the command pending, to be resent (a duplicate
//     at the device) and ended then, once;
//   - a batch that fails leaves its commands pending, and the verdicts
//     waiting behind it are dropped (their commands stay pending too): the
//     worker resends from the oldest pending entry, and the device answers
//     each duplicate, never applying one twice;
//   - the entries whose verdicts are waiting or being recorded, or were
//     answered and could not be recorded, are never expired locally
//     (device.recording): the device has decided them, so their end is
//     the device's verdict, not expired.

// With outbox.verdict_delay (the default; 0s is the strict mode above), a
// device's verdict is settled at once instead: the outbox ends the entry
// in its views (offline's ResolveLater) and the record rides on the
// outbox's next commit — the next command's append, usually — or the
// outbox's own, verdict_delay later:
//
//   - one commit per command, not two, for commands nobody waits for
//     (Enqueue, a fan-out without wait, a caller that stopped waiting):
//     the append's, fsynced before the first send, carries the verdict
//     of the command before;
//   - a command's waiter (Send, Pending.Wait, a fan-out) gets its ack only
//     once the record is durable (invariant I9), so a caller is never told
//     a verdict a crash could undo: the worker asks the outbox for a
//     commit at once (CommitSoon, shared with whatever commits meanwhile)
//     when it leaves such a verdict waiting and its next entry has no
//     waiter (or it has none: a lone Send), or when verdictBatch of them
//     wait (waitedLater);
//   - the history gets the terminal event once the record is durable
//     (recorded), so that it stays the outbox's record: a kill -9 before
//     leaves the entry pending, resent after the restart and answered
//     duplicate by the device (which applied it once), ended then, once;
//   - until then the entry is in the recording set (never expired
//     locally), and the outbox never hands it out again (NextAfter skips
//     it); a record that fails puts it back pending, in the recording
//     set still, and kicks its worker, which resends it (a duplicate).

// verdictBatch is the most verdicts of one device recorded in one commit.
const verdictBatch = 8

// settled is a verdict the worker has settled, to be recorded.
type settled struct {
	env fence.Envelope
	pos uint64 // the entry's queue position
	ack *fence.Ack
}

// recordOp is one batch of verdicts being recorded by its own goroutine.
type recordOp struct {
	batch []settled
	done  chan struct{}
	errs  []error // the outbox's, per verdict
}

// settledThrough is the queue position of the last entry the worker has a
// verdict for that is waiting or being recorded (0: none): the worker's
// next entry is the one after it.
func (w *worker) settledThrough() uint64 {
	if n := len(w.unrecorded); n > 0 {
		return w.unrecorded[n-1].pos
	}
	if r := w.recording; r != nil {
		return r.batch[len(r.batch)-1].pos
	}
	return 0
}

// queueVerdict adds ack, e's verdict, to those waiting to be recorded, and
// starts a batch when verdictBatch are waiting. It returns false, having
// added nothing, if the batch before failed: the caller records ack at
// once (the failed entries are resent).
func (q *delivery) queueVerdict(w *worker, e *offline.Entry, ack *fence.Ack) bool {
	if len(w.unrecorded)+1 >= verdictBatch && !q.awaitRecord(w) {
		return false
	}
	w.d.mu.Lock()
	if w.d.recording == nil {
		w.d.recording = make(map[string]struct{})
	}
	w.d.recording[ack.ID] = struct{}{}
	w.d.mu.Unlock()
	env := e.Envelope
	env.Body = nil // for the history; a firmware chunk's data is not kept waiting
	w.unrecorded = append(w.unrecorded, settled{env: env, pos: e.Pos, ack: ack})
	if len(w.unrecorded) >= verdictBatch {
		q.startRecord(w)
	}
	return true
}

// startRecord starts recording the waiting verdicts (none may be in
// flight).
func (q *delivery) startRecord(w *worker) {
	r := &recordOp{batch: w.unrecorded, done: make(chan struct{})}
	w.unrecorded, w.recording = nil, r
	go func() {
		defer close(r.done)
		acks := make([]*fence.Ack, len(r.batch))
		for i := range r.batch {
			acks[i] = r.batch[i].ack
		}
		r.errs = q.outbox.ResolveAll(acks)
		for i, err := range r.errs {
			s := &r.batch[i]
			if err != nil && !errors.Is(err, offline.ErrResolved) {
				continue
			}
			q.record(history.OpTerminal, &s.env, s.ack.Verdict.String(), s.ack.Reason)
			q.notify(s.ack.ID, s.ack)
		}
	}()
}

// awaitRecord waits for the batch being recorded, if there is one. It
// returns false if the outbox did not record all of it: those entries are
// pending again, and the verdicts waiting behind them are dropped (their
// entries stay pending), so that the worker resends from the oldest.
func (q *delivery) awaitRecord(w *worker) bool {
	r := w.recording
	if r == nil {
		return true
	}
	<-r.done
	w.recording = nil
	ok := true
	recorded := make([]settled, 0, len(r.batch))
	for i, err := range r.errs {
		if err != nil && !q.resolveFailed(w.d, r.batch[i].ack, err) {
			ok = false
			continue // pending again, answered by the device: stays in the recording set
		}
		recorded = append(recorded, r.batch[i])
	}
	if !ok {
		// The verdicts behind them are dropped unrecorded; their entries
		// stay in the recording set as well (the device answered them):
		// resent, they are never expired locally meanwhile.
		w.unrecorded = nil
	}
	q.forget(w, recorded)
	return ok
}

// forget drops the batch's ids from the device's recording set.
func (q *delivery) forget(w *worker, batch []settled) {
	w.d.mu.Lock()
	for _, s := range batch {
		delete(w.d.recording, s.ack.ID)
	}
	w.d.mu.Unlock()
}

// flush records the waiting verdicts and waits until every verdict of the
// worker is recorded. It returns false if one was not: its entry is
// pending again, to be resent. With outbox.verdict_delay it asks for the
// commit of the verdicts with a waiter and does not wait for it.
func (q *delivery) flush(w *worker) bool {
	q.waitedLater(w, nil)
	if !q.awaitRecord(w) {
		return false
	}
	if len(w.unrecorded) == 0 {
		return true
	}
	q.startRecord(w)
	return q.awaitRecord(w)
}

// resolveLater settles ack, e's verdict, and hands its record to the
// outbox to ride on its next commit (outbox.verdict_delay); the waiter, if
// any, is told in recorded, once it is durable. It reports whether the
// command has a waiter: the worker then asks for a commit soon (waited).
func (q *delivery) resolveLater(d *device, e *offline.Entry, ack *fence.Ack) bool {
	d.mu.Lock()
	if d.recording == nil {
		d.recording = make(map[string]struct{})
	}
	d.recording[ack.ID] = struct{}{}
	d.mu.Unlock()
	env := e.Envelope
	env.Body = nil // for the history; a firmware chunk's data is not kept waiting
	q.outbox.ResolveLater([]*fence.Ack{ack}, func(errs []error) { q.recorded(d, &env, ack, errs[0]) })
	return q.waited(ack.ID)
}

// waitedLater asks the outbox for the commit of the verdicts with a
// waiter the worker left to ride on its next commit (w.waited), if it left
// any and next, the entry it takes next (nil: none), has no waiter, or if
// verdictBatch such verdicts wait — as strict mode starts a batch: a
// waiter is told after about one commit (shared with other devices' and
// callers'), not verdict_delay, and a deep queue whose every command is
// waited for (a firmware download's window) pays one commit for up to
// verdictBatch verdicts.
func (q *delivery) waitedLater(w *worker, next *offline.Entry) {
	if w.waited == 0 {
		return
	}
	if next != nil && w.waited < verdictBatch && q.waited(next.Envelope.ID) {
		return
	}
	w.waited = 0
	q.outbox.CommitSoon()
}

// recorded is the outcome of resolveLater's record, on the goroutine of
// the commit that carried it (or at once if the outbox refused it): once
// the verdict is durable, the history and the waiter learn it.
func (q *delivery) recorded(d *device, env *fence.Envelope, ack *fence.Ack, err error) {
	if err != nil && !q.resolveFailed(d, ack, err) {
		q.kick(d) // pending again: resent, answered duplicate; in the recording set until then
		return
	}
	d.mu.Lock()
	delete(d.recording, ack.ID)
	d.mu.Unlock()
	if err == nil {
		q.record(history.OpTerminal, env, ack.Verdict.String(), ack.Reason)
		q.notify(ack.ID, ack)
	}
}
