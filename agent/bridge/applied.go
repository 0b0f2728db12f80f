package bridge

// Admitted, then applied: what the bridge does so that a crash between the
// fence table's commit and the device's answer loses no command and a
// Duplicate ack never vouches for a command no device has seen.
//
//  1. Table.AdmitAt stores an accepted command as unapplied in the same
//     fsynced commit as the device's new mark.
//  2. The device's worker sends it; once the device answered (or the bridge
//     gave up on it) the worker acks it and marks it applied
//     (Table.MarkApplied), which rides along with the table's next commit
//     — usually the admit of the device's next command — and waits until
//     that mark is durable (Table.AwaitApplied, committing it itself if no
//     commit did) before it sends the device's next command.
//     So when the process dies, at most the oldest of a device's unapplied
//     commands can have reached the device.
//  3. New reads each device's unapplied commands; the worker delivers them,
//     in order, before any new command. The oldest may already have been
//     applied (a crash after the device's answer and before step 2's
//     commit). For a register write the worker first reads the registers
//     back: if they hold the command's values, it counts as applied and is
//     not written again. (The Responder's memory of its last transaction
//     does not help here: a restarted Link starts from a random txid, so
//     the device would apply the repeat.) A read is simply run again, and
//     an MQTT-link device gets the JSON again (a value, not a delta).
//  4. A resend whose (token, seq) the table calls Duplicate while its
//     command is still unapplied (queued behind others, or being delivered
//     after a restart) is not answered at once: it waits, and is answered
//     Duplicate once the command was applied, or with the command's own
//     Invalid ack if the device refused it or never answered.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/history"
	"github.com/edgefence/edgefence/transport/modbus"
)

// maxFailed bounds how many failed commands per device are remembered for
// their resends.
const maxFailed = 64

// outcome is the answer a failed command got, kept for its resends.
type outcome struct {
	id     string // the command's id: only its resends get the outcome
	st     fence.State
	v      fence.Verdict // Invalid, Unknown, or Stale (its epoch closed before it was sent)
	reason string
}

// recover loads every device's unapplied commands (New, before any
// subscription can deliver a command).
func (b *Bridge) recover() error {
	for id, p := range b.devices {
		envs, err := b.cfg.Table.Unapplied(id)
		if err != nil {
			return fmt.Errorf("bridge: device %s: unapplied commands: %w", id, err)
		}
		for i, env := range envs {
			j := &job{env: env, m: fence.Mark{Token: env.Token, Seq: env.Seq}, verify: i == 0}
			j.err = p.prepare(j)
			p.recovered = append(p.recovered, j)
			p.pending[j.m] = j
		}
		if len(envs) > 0 {
			b.log.Info("delivering commands admitted before the restart first", "device", id, "commands", len(envs))
		}
	}
	return nil
}

// resent handles a command the table judged Duplicate. If it repeats a
// command still unapplied it waits for that command's outcome; if it
// repeats one that failed here (same id), it gets that failure again. It reports
// whether it took the command; if not, the Duplicate is true: the command
// was applied.
func (b *Bridge) resent(p *port, env *fence.Envelope) bool {
	key := fence.Mark{Token: env.Token, Seq: env.Seq}
	p.mu.Lock()
	if j := p.pending[key]; j != nil && !j.settled {
		j.waiters = append(j.waiters, env)
		p.mu.Unlock()
		b.log.Info("resend of a command not yet applied: answered once it is", "device", p.dev.ID, "id", env.ID, "token", env.Token, "seq", env.Seq)
		return true
	}
	o, failed := p.failed[key]
	p.mu.Unlock()
	if !failed || o.id != env.ID {
		return false
	}
	b.count(o.v)
	b.record(history.OpVerdict, env, o.v, o.reason)
	b.ack(p.dev.ID, env, o.v, o.st, o.reason)
	return true
}

// count counts a verdict given again, or one that is not the table's.
func (b *Bridge) count(v fence.Verdict) {
	switch v {
	case fence.Duplicate:
		b.duplicate.Add(1)
	case fence.Unknown:
		b.unknown.Add(1)
	case fence.Stale:
		b.stale.Add(1)
	default:
		b.invalid.Add(1)
	}
}

// settle finishes a command once the device answered (or the bridge gave
// up on it): acks it and marks it applied in the table. The mark rides
// along with the table's next commit — usually the admit of the device's
// next command — and the worker waits for it to be durable (finish)
// before it writes the device's next command, or after idleFlush without
// one. Only then are the resends that waited answered. A command interrupted by Close is left unapplied and
// unanswered: the next start delivers it.
//
// The ack does not wait for the mark's commit: a crash before that commit
// makes the next start deliver the command again, and its read-back finds
// it applied (a second, identical ack; the agent ignores it). OpApplied is
// recorded here, as soon as the device answered, and not by a redelivery
// whose read-back finds the command applied, so never twice; a SIGKILL
// between the device applying a write and the bridge reading its answer
// leaves the command without one.
func (b *Bridge) settle(p *port, j *job, res result, reason string, r *modbus.Response) {
	if res == resStopped {
		return
	}
	u := &unsynced{j: j, res: res, v: fence.Invalid, reason: reason, st: fence.State{Epoch: j.env.Epoch, Mark: j.m}}
	switch res {
	case resUnknown:
		u.v = fence.Unknown // terminal: never sent again (fence.Unknown)
		b.unknown.Add(1)
	case resClosed:
		u.v = fence.Stale
		b.stale.Add(1)
		u.st = b.state(p)
	}
	if res == resApplied {
		b.record(history.OpApplied, j.env, fence.Accepted, "")
	}
	if res == resApplied || res == resFound {
		u.v, u.reason = fence.Accepted, ""
		b.accepted.Add(1)
		if r != nil && r.Func == modbus.FuncReadHolding {
			b.publishRead(p.dev.ID, j.env, r)
		}
	}
	b.ack(p.dev.ID, j.env, u.v, u.st, u.reason)
	ticket, err := b.cfg.Table.MarkApplied(p.dev.ID, j.m)
	if err != nil {
		b.tableErr.Add(1)
		b.log.Error("fence table: cannot mark a command applied", "device", p.dev.ID, "id", j.env.ID, "err", err)
		return // still unapplied in the table: delivered again on the next start
	}
	u.ticket = ticket
	p.unsynced = u
}

// unsynced is a settled command whose applied-mark is not yet known
// durable.
type unsynced struct {
	j      *job
	res    result
	v      fence.Verdict
	st     fence.State // the ack's
	reason string      // the ack's
	ticket uint64
}

// idleFlush is how long a worker with nothing to send leaves its last
// applied-mark to ride along with another commit before committing it.
const idleFlush = 5 * time.Millisecond

// finish waits until the last settled command's applied-mark is durable
// (committing it if no commit carried it yet), then completes it. It
// retries while the table fails — the device's next command waits: sending
// it first could reorder the device's commands after a crash — and reports
// false if the bridge closed first.
func (b *Bridge) finish(p *port) bool {
	u := p.unsynced
	if u == nil {
		return true
	}
	delay := 10 * time.Millisecond
	for {
		err := b.cfg.Table.AwaitApplied(context.Background(), u.ticket)
		if err == nil {
			break
		}
		b.tableErr.Add(1)
		b.log.Error("fence table: cannot commit an applied-mark; the device's next command waits", "device", p.dev.ID, "id", u.j.env.ID, "err", err)
		if errors.Is(err, fence.ErrTableClosed) {
			return false
		}
		select {
		case <-b.ctx.Done():
			return false
		case <-time.After(delay):
		}
		delay = min(2*delay, 5*time.Second)
	}
	p.unsynced = nil
	b.complete(p, u)
	return true
}

// complete forgets a command whose applied-mark is durable and answers the
// resends that waited for it.
func (b *Bridge) complete(p *port, u *unsynced) {
	j := u.j
	p.mu.Lock()
	j.settled = true
	waiters := j.waiters
	j.waiters = nil
	if p.pending[j.m] == j {
		delete(p.pending, j.m)
	}
	if u.v != fence.Accepted {
		if _, ok := p.failed[j.m]; !ok {
			p.failed[j.m] = outcome{id: j.env.ID, st: u.st, v: u.v, reason: u.reason}
			p.failedList = append(p.failedList, j.m)
			if len(p.failedList) > maxFailed {
				delete(p.failed, p.failedList[0])
				p.failedList = slices.Delete(p.failedList, 0, 1)
			}
		}
	}
	p.mu.Unlock()
	for _, w := range waiters {
		wv, wreason := fence.Duplicate, ""
		if u.v != fence.Accepted {
			wv, wreason = u.v, u.reason
		}
		b.count(wv)
		b.record(history.OpVerdict, w, wv, wreason)
		b.ack(p.dev.ID, w, wv, u.st, wreason)
	}
}

// holds reports whether the device's registers already hold what the write
// q would put there: the read-back of a write that may have been applied
// just before a crash.
func (b *Bridge) holds(ctx context.Context, p *port, q *modbus.Request) (bool, error) {
	rq := &modbus.Request{Func: modbus.FuncReadHolding, Addr: q.Addr, Count: uint16(len(q.Values))}
	pdu, err := rq.Encode()
	if err != nil {
		return false, err
	}
	resp, err := p.link.Do(ctx, pdu)
	if err != nil {
		return false, err
	}
	r, err := modbus.DecodeResponse(rq, resp)
	if err == nil {
		err = r.Err()
	}
	if err != nil {
		return false, err
	}
	return slices.Equal(r.Values, q.Values), nil
}

// record appends an event to the history, if one is configured.
func (b *Bridge) record(op string, env *fence.Envelope, v fence.Verdict, reason string) {
	if b.cfg.History == nil {
		return
	}
	e := history.Event{Op: op, Device: env.Device, ID: env.ID, Token: uint64(env.Token), Seq: env.Seq, Kind: env.Kind, Reason: reason}
	if op == history.OpVerdict {
		e.Verdict = v.String()
	}
	if err := b.cfg.History.Record(e); err != nil {
		b.log.Warn("history", "err", err)
	}
}
