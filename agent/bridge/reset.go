package bridge

import (
	"context"
	"errors"
	"fmt"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
)

// resetter is what a reset needs of the table; *fence.Table has it (the
// unsafe NoTable has not: resets are refused there).
type resetter interface {
	Reset(ctx context.Context, device string, to fence.Mark, r fence.ResetRecord, floor uint64) (fence.State, error)
}

// resetVerifier is what checks resets here: Config.Root, else Keys if it
// is the whole trust chain (an *auth.Trust), else nothing.
func (b *Bridge) resetVerifier() auth.ResetVerifier {
	if b.cfg.Root != nil {
		return b.cfg.Root
	}
	if v, ok := b.cfg.Keys.(auth.ResetVerifier); ok {
		return v
	}
	return nil
}

// onReset applies an operator's reset statement that arrived on dev's
// command topic: verified against the root, then set in the fence table
// (the mark in the reset's epoch and the reset's record in one fsynced
// transaction; a counter not above the last one, or an epoch not above
// the device's, is a replay) before the ack says accepted. From then on
// the device's commands of earlier epochs are stale at the table, and
// those admitted before and still queued are not written to it (send).
// Every refusal is invalid with the mark unchanged, counted and logged.
// It runs on the MQTT delivery goroutine, like onCommand, so before the
// PUBACK.
func (b *Bridge) onReset(p *port, raw []byte) {
	dev := p.dev.ID
	r, st, err := b.applyReset(p, raw)
	if r == nil {
		r, _ = auth.PeekReset(raw) // unverified: only to name the reset in the refusal
	}
	a := auth.ResetAck(dev, r, st, err)
	if err != nil {
		b.invalid.Add(1)
		b.resetsRefused.Add(1)
		b.log.Warn("reset refused", "device", dev, "id", a.ID, "fence_token", st.Mark.Token, "fence_epoch", st.Epoch, "err", err, "by", "fence table")
	} else {
		b.resets.Add(1)
		p.closed.Store(max(p.closed.Load(), r.Epoch))
		b.log.Warn("fence reset by the operator", "device", dev, "mark", st.Mark.String(), "epoch", st.Epoch, "counter", r.Counter, "id", r.ID, "by", "fence table")
	}
	b.ack(dev, &fence.Envelope{Device: dev, ID: a.ID, Token: a.Token, Seq: a.Seq}, a.Verdict, a.State(), a.Reason)
}

// applyReset verifies and applies; st is the device's state afterwards
// (as far as the table knows it, on a refusal).
func (b *Bridge) applyReset(p *port, raw []byte) (*auth.Reset, fence.State, error) {
	dev := p.dev.ID
	v := b.resetVerifier()
	if v == nil {
		return nil, b.state(p), fmt.Errorf("%w: %w: this gateway's fence table cannot check a reset", fence.ErrInvalid, auth.ErrNoRoot)
	}
	r, err := v.VerifyReset(raw, dev)
	if err != nil {
		return nil, b.state(p), err
	}
	t, ok := b.cfg.Table.(resetter)
	if !ok {
		return r, fence.State{}, fmt.Errorf("%w: no fence table to reset", fence.ErrInvalid)
	}
	st, err := t.Reset(context.Background(), dev, r.Mark(), r.Record(), b.floor(p))
	if err != nil && !errors.Is(err, fence.ErrInvalid) {
		b.tableErr.Add(1)
	}
	return r, st, err
}

// state is the device's state at the table, as far as it knows it (the
// zero State if it cannot say).
func (b *Bridge) state(p *port) fence.State {
	if t, ok := b.cfg.Table.(*fence.Table); ok {
		if rec, _, err := t.Get(p.dev.ID); err == nil {
			return fence.State{Epoch: rec.Epoch, Mark: rec.Mark}.At(max(b.floor(p), p.closed.Load()))
		}
	}
	return fence.State{Epoch: max(b.floor(p), p.closed.Load())}
}
