package agent

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// The resend policy: a worker sends its command again when no ack came
// within the ack deadline. The deadline is resendAfter's (1 s, 2 s, 4 s …
// per try, at most the command timeout) stretched by the link's backlog:
// the commands in flight on the link ahead of this one, each worth twice
// the link's recent interval between acks (linkPace). A command sent
// behind 10,000 others that the devices answer at 400 a second waits
// ≈ 1 s + 50 s, not 1 s, so that a fan-out does not resend most of its
// commands (a duplicate is safe — the fence point answers it duplicate,
// never applies it twice — but it costs the device and the agent a round
// trip and an fsync each). A lone command keeps the 1 s first resend that
// matters after an outage (a command published before the device
// resubscribed is lost). The deadline is checked again when it passes,
// with the pace measured meanwhile: the first commands of a burst are sent
// before any ack has been seen.

// defaultAckPace is the interval between acks assumed before one is
// measured.
const defaultAckPace = time.Millisecond

// maxAckGap bounds one interval between acks in the pace: a device that
// takes long once does not make every command wait.
const maxAckGap = time.Second

// errAckDeadline ends a Send whose ack deadline passed.
var errAckDeadline = fmt.Errorf("no ack within the ack deadline: %w", context.DeadlineExceeded)

// paceWindow is the busy time over which the acks' mean interval is
// taken before it enters the link's pace: devices that answer in bursts
// (a batch of commits, many acks at once, then a pause) are measured at
// their rate, not at the last gap's.
const paceWindow = 25 * time.Millisecond

// linkPace is what the resend policy knows of the link: the commands in
// flight (sent, no ack or error yet) and the recent interval between acks
// while others were in flight: the mean over the last two windows of at
// least paceWindow of busy time each (busy time ÷ acks).
type linkPace struct {
	inflight atomic.Int64

	mu       sync.Mutex
	last     time.Time     // the last ack
	per      time.Duration // 0: not measured yet (defaultAckPace)
	window   time.Duration // busy time since the last window closed
	acks     int64         // acks in it
	prevTime time.Duration // the window before: its busy time
	prevAcks int64         // and its acks
}

// ackInterval is the link's recent interval between acks.
func (p *linkPace) ackInterval() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.per <= 0 {
		return defaultAckPace
	}
	return p.per
}

// acked notes an ack at now; busy: other commands were in flight as well
// (the interval since the last ack was spent answering, not idle).
func (p *linkPace) acked(now time.Time, busy bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if busy && !p.last.IsZero() {
		p.window += min(max(now.Sub(p.last), 0), maxAckGap)
		p.acks++
		if p.window >= paceWindow {
			p.per = (p.prevTime + p.window) / time.Duration(p.prevAcks+p.acks)
			p.prevTime, p.prevAcks = p.window, p.acks
			p.window, p.acks = 0, 0
		}
	}
	p.last = now
}

// ackWait is the ack deadline of a command's tries+1-th send with ahead
// commands in flight before it on a link answering one every per: at most
// timeout.
func ackWait(tries int, timeout time.Duration, ahead int64, per time.Duration) time.Duration {
	backlog := time.Duration(min(ahead, int64(timeout/max(per, time.Microsecond)))) * 2 * per
	return min(timeout, resendAfter(tries, timeout)+backlog)
}

// ackContext is ctx for one send of the worker's command, ended when its
// ack deadline passes (errAckDeadline as its cause); done must be called
// once the send returned, acked telling whether an ack came.
func (q *delivery) ackContext(ctx context.Context, tries int) (sctx context.Context, done func(acked bool)) {
	p := &q.pace
	ahead := p.inflight.Add(1) - 1
	sent := time.Now()
	sctx, cancel := context.WithCancelCause(ctx)
	deadline := func() time.Duration { return ackWait(tries, q.timeout, ahead, p.ackInterval()) - time.Since(sent) }
	var mu sync.Mutex
	var t *time.Timer
	stopped := false
	mu.Lock()
	t = time.AfterFunc(deadline(), func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		if left := deadline(); left > 0 { // the pace measured meanwhile says wait on
			t.Reset(left)
			return
		}
		cancel(errAckDeadline)
	})
	mu.Unlock()
	return sctx, func(acked bool) {
		mu.Lock()
		stopped = true
		t.Stop()
		mu.Unlock()
		cancel(nil)
		busy := p.inflight.Add(-1) > 0
		if acked {
			p.acked(time.Now(), busy)
		}
	}
}
