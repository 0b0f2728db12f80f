package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/history"
	"github.com/edgefence/edgefence/offline"
)

// The front door of delivery: a command is issued under the device's
// controller (its token, the next seq), stored in the outbox and handed to
// the device's worker (outbox.go).

// submit issues one command to dev under the current token and stores it
// (sendQueued); with wait it waits for the device's ack (Agent.Send), else
// it returns once the command is stored (Agent.Enqueue).
func (q *delivery) submit(ctx context.Context, dev, kind string, body []byte, wait bool) (*fence.Ack, *fence.Envelope, error) {
	d, ctl, env, err := q.issue(ctx, dev, kind, body)
	if err != nil {
		return nil, nil, err
	}
	return q.sendQueued(ctx, d, ctl, env, wait) // releases d.sem
}

// issue makes the next envelope for dev under its controller's token. On
// success the caller holds d.sem (the seq order) and must release it.
func (q *delivery) issue(ctx context.Context, dev, kind string, body []byte) (*device, *controller, *fence.Envelope, error) {
	d, ok := q.devices[dev]
	if !ok {
		return nil, nil, nil, fmt.Errorf("send to %q: %w", dev, ErrUnknownDevice)
	}
	select {
	case d.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, nil, nil, fmt.Errorf("send to %s: %w", dev, ctx.Err())
	}
	d.mu.Lock()
	ctl := d.ctl
	d.mu.Unlock()
	if !q.usable(ctl) {
		<-d.sem
		return nil, nil, nil, fmt.Errorf("send to %s: %w", dev, ErrNotHolder)
	}
	ctl.seq++
	env := &fence.Envelope{
		V:        fence.Version,
		Device:   dev,
		Token:    ctl.token,
		Seq:      ctl.seq,
		ID:       newCommandID(),
		Kind:     kind,
		Body:     body,
		IssuedAt: q.now().UnixMilli(),
		Holder:   q.gateway,
	}
	if err := env.Validate(); err != nil {
		ctl.seq-- // nothing left the agent
		<-d.sem
		return nil, nil, nil, fmt.Errorf("send to %s: %w", dev, err)
	}
	return d, ctl, env, nil
}

// sendQueued appends env durably, hands it to the device's worker, and, if
// wait, waits up to the command timeout for its ack. The caller holds d.sem
// and sendQueued releases it once the entry is stored.
func (q *delivery) sendQueued(ctx context.Context, d *device, ctl *controller, env *fence.Envelope, wait bool) (*fence.Ack, *fence.Envelope, error) {
	// Wait for the ack from before the append: a running worker may
	// deliver the entry the moment it is stored.
	ch := make(chan *fence.Ack, 1)
	if wait {
		q.mu.Lock()
		q.waiters[env.ID] = ch
		q.mu.Unlock()
		defer func() {
			q.mu.Lock()
			delete(q.waiters, env.ID)
			q.mu.Unlock()
		}()
	}
	e := &offline.Entry{Envelope: *env}
	if err := q.outbox.Append(ctx, e); err != nil {
		ctl.seq-- // nothing was created
		<-d.sem
		if errors.Is(err, offline.ErrFull) {
			q.stats.full.Add(1)
		}
		return nil, nil, fmt.Errorf("send to %s: %w", d.id, err)
	}
	q.stats.queued.Add(1)
	q.record(history.OpCreated, env, "", "")
	<-d.sem
	q.kick(d)
	if !wait {
		return nil, env, nil
	}

	t := time.NewTimer(q.timeout)
	defer t.Stop()
	select {
	case ack := <-ch:
		return ack, env, ack.Err()
	case <-t.C:
		return nil, env, &QueuedError{Device: d.id, ID: env.ID, Token: env.Token, Seq: env.Seq,
			Err: fmt.Errorf("%w within %v", ErrNoAck, q.timeout)}
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
		q.log.Debug("command verdict", "device", d.id, "token", env.Token, "seq", env.Seq, "id", env.ID, "verdict", ack.Verdict)
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

func newCommandID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux (go1.24+)
	return hex.EncodeToString(b[:])
}
