package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/history"
	"github.com/edgefence/edgefence/offline"
)

// The front door of delivery: a command is issued under the device's
// controller (its token, the next seq), stored in the outbox and handed to
// the device's worker (outbox.go).

// submit issues one command to dev under the current token and stores it
// (enqueue); with wait it returns a Pending whose ack the caller waits for
// (Agent.Send, Agent.Issue), else nil once the command is stored
// (Agent.Enqueue).
func (q *delivery) submit(ctx context.Context, dev, kind string, body []byte, wait bool) (*Pending, *fence.Envelope, error) {
	ps, envs, err := q.submitAll(ctx, dev, kind, [][]byte{body}, wait)
	if err != nil {
		return nil, nil, err
	}
	return ps[0], envs[0], nil
}

// submitAll is submit of several commands of one kind to dev: consecutive
// seqs under one token, stored in one commit (the outbox's AppendAll), all
// or none.
func (q *delivery) submitAll(ctx context.Context, dev, kind string, bodies [][]byte, wait bool) ([]*Pending, []*fence.Envelope, error) {
	d, ctl, err := q.hold(ctx, dev)
	if err != nil {
		return nil, nil, err
	}
	envs := make([]*fence.Envelope, 0, len(bodies))
	for _, body := range bodies {
		env, err := q.envelope(ctl, dev, kind, body)
		if err != nil {
			ctl.seq -= uint64(len(envs)) // nothing left the agent
			<-d.sem
			return nil, nil, fmt.Errorf("send to %s: %w", dev, err)
		}
		envs = append(envs, env)
	}
	ps := make([]*Pending, len(envs))
	if wait {
		for i, env := range envs {
			ps[i] = &Pending{Envelope: env, q: q, ch: make(chan *fence.Ack, 1)}
		}
	}
	if err := q.enqueue(ctx, d, ctl, envs, ps); err != nil { // releases d.sem
		return nil, nil, err
	}
	for i, p := range ps {
		if p != nil && len(envs[i].Body) > 0 {
			// The body is the outbox's now: a window of firmware chunks
			// waited for does not keep their data in memory too.
			c := *envs[i]
			c.Body = nil
			p.Envelope = &c
		}
	}
	return ps, envs, nil
}

// hold takes dev's seq order (d.sem) under its controller. On success the
// caller holds d.sem and must release it.
func (q *delivery) hold(ctx context.Context, dev string) (*device, *controller, error) {
	d, ok := q.devices[dev]
	if !ok {
		return nil, nil, fmt.Errorf("send to %q: %w", dev, ErrUnknownDevice)
	}
	select {
	case d.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, nil, fmt.Errorf("send to %s: %w", dev, ctx.Err())
	}
	d.mu.Lock()
	ctl := d.ctl
	d.mu.Unlock()
	if !q.usable(ctl) {
		<-d.sem
		return nil, nil, fmt.Errorf("send to %s: %w", dev, ErrNotHolder)
	}
	return d, ctl, nil
}

// envelope makes the next envelope for dev under ctl (whose seq order the
// caller holds).
func (q *delivery) envelope(ctl *controller, dev, kind string, body []byte) (*fence.Envelope, error) {
	ctl.seq++
	now := q.now()
	env := &fence.Envelope{
		V:        fence.Version,
		Device:   dev,
		Epoch:    q.devices[dev].epochOf(),
		Token:    ctl.token,
		Seq:      ctl.seq,
		ID:       offline.NewCommandID(now),
		Kind:     kind,
		Body:     body,
		IssuedAt: now.UnixMilli(),
		Holder:   q.gateway,
	}
	if err := env.Validate(); err != nil {
		ctl.seq--
		return nil, err
	}
	return env, nil
}

// enqueue appends envs durably (one commit) and hands them to the
// device's worker; ps[i], if not nil, is registered for envs[i]'s ack
// before the append (a running worker may deliver an entry the moment it
// is stored). The caller holds d.sem and enqueue releases it once the
// entries are stored (or not).
func (q *delivery) enqueue(ctx context.Context, d *device, ctl *controller, envs []*fence.Envelope, ps []*Pending) error {
	q.mu.Lock()
	for i, p := range ps {
		if p != nil {
			q.waiters[envs[i].ID] = p.ch
		}
	}
	q.mu.Unlock()
	es := make([]*offline.Entry, len(envs))
	for i, env := range envs {
		es[i] = &offline.Entry{Envelope: *env}
	}
	if err := q.outbox.AppendAll(ctx, es); err != nil {
		ctl.seq -= uint64(len(envs)) // nothing was created
		<-d.sem
		for _, p := range ps {
			if p != nil {
				p.Close()
			}
		}
		if errors.Is(err, offline.ErrFull) {
			q.stats.full.Add(1)
		}
		return fmt.Errorf("send to %s: %w", d.id, err)
	}
	q.stats.queued.Add(uint64(len(envs)))
	for _, env := range envs {
		q.record(history.OpCreated, env, "", "")
	}
	<-d.sem
	q.kick(d)
	return nil
}

// Pending is a command issued and stored in the outbox (Agent.Issue)
// whose ack its caller may wait for. Its commands are delivered in the
// order they were issued, one at a time per device, like every command in
// the outbox; Pending only lets the caller issue the next ones while the
// first is at the device. One goroutine uses a Pending; Close it when done
// waiting (it is safe to Close twice, or after Wait returned the ack).
type Pending struct {
	// Envelope is the command as issued: its token, seq and id (its
	// body stays in the outbox).
	Envelope *fence.Envelope

	q   *delivery
	ch  chan *fence.Ack
	ack *fence.Ack // once it arrived
}

// Wait waits for the command's ack, up to the command timeout from the
// call (as Send does). When an ack arrived the error is ack.Err(); called
// again, Wait returns the same ack. Without an ack in time (or when ctx
// ends) the error is a *QueuedError: the command stays queued and will be
// delivered, and Wait may be called again.
func (p *Pending) Wait(ctx context.Context) (*fence.Ack, error) {
	if p.ack != nil {
		return p.ack, p.ack.Err()
	}
	env, q := p.Envelope, p.q
	t := time.NewTimer(q.timeout)
	defer t.Stop()
	queued := func(err error) error {
		return &QueuedError{Device: env.Device, ID: env.ID, Token: env.Token, Seq: env.Seq, Err: err}
	}
	select {
	case ack := <-p.ch:
		p.ack = ack
		p.Close()
		return ack, ack.Err()
	case <-t.C:
		return nil, queued(fmt.Errorf("%w within %v", ErrNoAck, q.timeout))
	case <-ctx.Done():
		return nil, queued(ctx.Err())
	}
}

// Close stops waiting for the command's ack; the command stays queued (its
// terminal state is recorded in the outbox).
func (p *Pending) Close() {
	p.q.mu.Lock()
	if p.q.waiters[p.Envelope.ID] == p.ch {
		delete(p.q.waiters, p.Envelope.ID)
	}
	p.q.mu.Unlock()
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

// countVerdict counts a verdict a fence point gave one of d's commands,
// in all and for d.
func (q *delivery) countVerdict(d *device, v fence.Verdict) {
	switch v {
	case fence.Accepted:
		q.stats.accepted.Add(1)
	case fence.Duplicate:
		q.stats.duplicate.Add(1)
	case fence.Stale:
		q.stats.stale.Add(1)
	case fence.Unknown:
		q.stats.unknown.Add(1)
	default:
		q.stats.inv.Add(1)
	}
	d.verdicts[verdictIndex(v)].Add(1)
}

// logVerdict logs the terminal verdict of one of d's commands: a refusal
// (stale, invalid, expired) is one Warn line with device, token, reason and
// verdict; accepted and duplicate are Debug only (one per command is too
// many lines for a gateway's journal). local means the agent decided the
// verdict itself, without sending the command.
func (q *delivery) logVerdict(d *device, env *fence.Envelope, ack *fence.Ack, local bool) {
	if ack.Verdict == fence.Accepted || ack.Verdict == fence.Duplicate {
		// Asked first: the line's values would be boxed (allocated)
		// for every command even with Debug off.
		if q.log.Enabled(context.Background(), slog.LevelDebug) {
			q.log.Debug("command verdict", "device", d.id, "token", env.Token, "seq", env.Seq, "id", env.ID, "verdict", ack.Verdict)
		}
		return
	}
	reason := ack.Reason
	if reason == "" {
		switch ack.Verdict {
		case fence.Stale:
			reason = fmt.Sprintf("token below the fence point's %d: a newer holder reached the device", ack.MaxToken)
		default:
			reason = "refused by the fence point"
		}
	}
	q.log.Warn("command refused", "device", d.id, "token", env.Token, "reason", reason, "verdict", ack.Verdict,
		"seq", env.Seq, "id", env.ID, "kind", env.Kind, "fence_token", ack.MaxToken, "sent", !local)
}
