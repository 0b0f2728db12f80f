package agent

import (
	"context"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/offline"
)

// TestAckWait: the ack deadline is resendAfter's alone with nothing ahead,
// grows with the commands in flight ahead (two ack intervals each), and
// never exceeds the command timeout.
func TestAckWait(t *testing.T) {
	ms := time.Millisecond
	for _, c := range []struct {
		tries   int
		timeout time.Duration
		ahead   int64
		per     time.Duration
		want    time.Duration
	}{
		{0, 10 * time.Second, 0, ms, time.Second},
		{1, 10 * time.Second, 0, ms, 2 * time.Second},
		{0, 10 * time.Second, 100, ms, 1200 * ms},
		{0, 120 * time.Second, 10_000, 2 * ms, 41 * time.Second},
		{2, 120 * time.Second, 10_000, 2 * ms, 44 * time.Second},
		{0, 10 * time.Second, 10_000, 2 * ms, 10 * time.Second},
		{0, 300 * ms, 5, ms, 300 * ms},
		{0, 10 * time.Second, 1 << 62, time.Second, 10 * time.Second}, // no overflow
	} {
		if got := ackWait(c.tries, c.timeout, c.ahead, c.per); got != c.want {
			t.Errorf("ackWait(%d, %v, %d, %v) = %v, want %v", c.tries, c.timeout, c.ahead, c.per, got, c.want)
		}
	}
}

// TestLinkPace: the interval between acks is measured only while other
// commands were in flight (an idle link's gap does not count), bounded by
// maxAckGap, and averaged over the last two windows.
func TestLinkPace(t *testing.T) {
	var p linkPace
	t0 := time.Unix(1000, 0)
	if got := p.ackInterval(); got != defaultAckPace {
		t.Fatalf("unmeasured %v, want %v", got, defaultAckPace)
	}
	p.acked(t0, true) // the first ack: nothing to measure from
	p.acked(t0.Add(time.Hour), false)
	if got := p.ackInterval(); got != defaultAckPace {
		t.Fatalf("after an idle gap %v, want %v", got, defaultAckPace)
	}
	now := t0.Add(time.Hour)
	now = now.Add(40 * time.Millisecond)
	p.acked(now, true)
	if got := p.ackInterval(); got != 40*time.Millisecond {
		t.Fatalf("first measure %v, want 40ms", got)
	}
	now = now.Add(time.Minute) // busy, but one slow answer
	p.acked(now, true)
	if got, want := p.ackInterval(), (40*time.Millisecond+maxAckGap)/2; got != want {
		t.Fatalf("after a long gap %v, want %v (bounded by maxAckGap)", got, want)
	}
}

// TestLinkPaceBursts: devices that answer in bursts (32 acks at once,
// then 32 ms until the next 32: one a millisecond) are measured at one a
// millisecond whenever the pace is read from the third burst on (the
// first window closes early), also right after a burst, when
// the last gaps were all zero (a mean of the last gaps alone would read
// far less, and the commands sent behind a backlog then would be resent
// too soon).
func TestLinkPaceBursts(t *testing.T) {
	var p linkPace
	now := time.Unix(1000, 0)
	p.acked(now, true)
	for burst := range 40 {
		now = now.Add(32 * time.Millisecond)
		for range 32 {
			p.acked(now, true)
		}
		if got := p.ackInterval(); burst > 1 && (got < 700*time.Microsecond || got > 1400*time.Microsecond) {
			t.Fatalf("after burst %d: pace %v, want about 1ms", burst, got)
		}
	}
}

// slowLink answers one command at a time, each after each: a link (or a
// device side) that takes longer than the first resend's second to answer
// a fan-out.
type slowLink struct {
	fp       *fencePoint
	turn     chan struct{}
	each     time.Duration
	attempts atomic.Int64
}

func (l *slowLink) Send(ctx context.Context, env *fence.Envelope) (*fence.Ack, error) {
	l.attempts.Add(1)
	select {
	case l.turn <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("in line: %w", ctx.Err())
	}
	defer func() { <-l.turn }()
	time.Sleep(l.each)
	return l.fp.Send(ctx, env)
}

// TestSlowLinkFewResends: one command each to 64 devices over a link that
// answers one every 40 ms (≈ 2.6 s in all, against the first resend's 1 s).
// The ack deadline grows with the commands in flight ahead, so almost none
// is sent twice; with a fixed 1 s first resend more than half were (each
// answered duplicate, applied once either way).
func TestSlowLinkFewResends(t *testing.T) {
	const n = 64
	l := &slowLink{fp: newFencePoint(), turn: make(chan struct{}, 1), each: 40 * time.Millisecond}
	ob, ids := enqueueOnEach(t, n, l, time.Minute)
	waitFor(t, "outbox drained", pendingZero(ob))
	for _, id := range ids {
		if got := len(l.fp.appliedOf(id)); got != 1 {
			t.Fatalf("%s applied %d times", id, got)
		}
	}
	resent := l.attempts.Load() - n
	t.Logf("%d commands over a link answering one per %v: %d sent again", n, l.each, resent)
	if resent > n/8 {
		t.Errorf("%d of %d commands sent again: the ack deadline does not wait for the link's backlog", resent, n)
	}
}

// enqueueOnEach starts an agent with an outbox, holding n devices d00…
// over s with command.timeout timeout, and enqueues one command for each
// (without waiting for it); it returns the outbox and the devices.
func enqueueOnEach(t *testing.T, n int, s Sender, timeout time.Duration) (*offline.Outbox, []string) {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("d%02d", i)
	}
	ob := openOutbox(t, filepath.Join(t.TempDir(), offline.File), nil)
	a := startOutboxAgentTimeout(t, testEtcd, 2*time.Second, timeout, "gw-a", "/t/"+t.Name(), devCfgs(ids...), s, ob)
	waitFor(t, "a holds", holdingAll(a, ids))
	for _, id := range ids {
		if _, err := a.Enqueue(context.Background(), id, "set", []byte{0x01}); err != nil {
			t.Fatal(err)
		}
	}
	return ob, ids
}
