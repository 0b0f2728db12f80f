package jobs

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/edgefence/edgefence/devices/fwjob"
	"github.com/edgefence/edgefence/fence"
)

// The download's window: up to RunnerConfig.Window fw.chunk commands are
// issued (seq, durable append to the outbox) ahead of the device's acks,
// so that the outbox's appends overlap the device's work on the chunks
// before; they are issued in batches of half the window (one commit, one
// fsync, a batch), as the acks make room. The agent's worker still
// delivers them one at a time in queue order, each resent as the same
// envelope until it has a verdict: the device sees the chunks at its
// offset, in order. The runner waits for the acks in the order it issued
// the chunks:
//
//	accepted, duplicate   the next chunk (a batch more issued once half
//	                      the window is free)
//	invalid               drain: wait for the acks of the chunks behind,
//	                      then plan again from a report that accounts
//	                      for them (refused, as with one in flight)
//	stale, ErrFenced      deposed: the chunks behind end stale at the
//	                      agent or the device, never applied
//	none                  the device's next report, then plan again (noAck)

// flight is one chunk issued and not yet acked.
type flight struct {
	p   Pending
	off uint64
	n   uint64
	seq uint64 // the report count before it was issued
}

// window is the chunks of one download in flight, oldest first.
type window struct {
	x    *xrun
	img  Image
	next uint64 // the offset of the next chunk to issue
	q    []flight

	failed    error  // an issue failed: no more are issued
	failedSeq uint64 // the report count before it
}

// download sends the image from off in chunks, keeping a window of them
// issued ahead of the device's acks and counting the accepted ones itself
// (no wait for reports between chunks), then installs it.
func (x *xrun) download(ctx context.Context, off uint64) error {
	img, err := x.image(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return x.finish(ctx, Failed, "image: "+err.Error())
	}
	win := &window{x: x, img: img, next: off}
	defer win.close()
	size := x.job.Image.Size
	for off < size {
		if err := win.fill(ctx); err != nil || x.done || len(win.q) == 0 {
			return err // nil: ended, or plan again
		}
		c, ack, err := win.next1(ctx)
		if ack == nil {
			return err
		}
		if ack.Verdict == fence.Invalid {
			return win.drain(ctx, c, ack.Reason)
		}
		off += c.n
		step := string(fwjob.Downloading)
		if off == size {
			step = string(fwjob.Downloaded)
		}
		if err := x.update(ctx, step, off, false); err != nil {
			if !errors.Is(err, errDeposed) || len(win.q) == 0 {
				return err
			}
			// Deposed (etcd says): issue no more, but take the verdicts
			// of the chunks in flight, as after a failed issue.
			win.stop(err, x.w.r.reportSeq())
		}
	}
	if win.failed != nil {
		return x.noAck(ctx, fwjob.KindChunk, win.failedSeq, win.failed)
	}
	return x.install(ctx)
}

// fill issues chunks while the window has room for a batch of them
// (refill: half the window, or what is left of the image), each batch in
// one IssueAll (one commit in the outbox). A failed issue (the lease lost,
// the outbox full) ends the filling: the chunks in flight are still
// waited for, each to its verdict, and then the failure is the
// download's (noAck).
func (win *window) fill(ctx context.Context) error {
	x := win.x
	size, chunk, w := x.job.Image.Size, uint64(x.job.Chunk), x.w.r.cfg.Window
	for win.failed == nil && win.next < size {
		left := int((size - win.next + chunk - 1) / chunk)
		n := min(w-len(win.q), left, max(1, w/2))
		if n <= 0 || n < max(1, w/2) && n < left {
			break // wait for more acks: a fuller batch
		}
		if err := x.checkStop(ctx); err != nil {
			return err
		}
		if err := x.checkTotal(); err != nil {
			return err
		}
		if err := win.issue(ctx, n); err != nil {
			return err
		}
	}
	if win.failed != nil && len(win.q) == 0 {
		return x.noAck(ctx, fwjob.KindChunk, win.failedSeq, win.failed)
	}
	return nil
}

// issue issues the next n chunks in one IssueAll.
func (win *window) issue(ctx context.Context, n int) error {
	x := win.x
	size, chunk := x.job.Image.Size, uint64(x.job.Chunk)
	bodies := make([]body, 0, n)
	fl := make([]flight, 0, n)
	seq := x.w.r.reportSeq()
	for off := win.next; len(bodies) < n && off < size; {
		m := min(chunk, size-off)
		buf := make([]byte, m)
		if _, err := win.img.ReadAt(buf, int64(off)); err != nil {
			return x.finish(ctx, Failed, fmt.Sprintf("image read at %d: %v", off, err))
		}
		bodies = append(bodies, fwjob.ChunkBody{Job: x.job.ID, Off: off, Data: buf})
		fl = append(fl, flight{off: off, n: m, seq: seq})
		off += m
	}
	ps, err := x.issueAll(ctx, fwjob.KindChunk, bodies)
	if err != nil {
		win.stop(err, seq)
		return nil
	}
	for i := range fl {
		fl[i].p = ps[i]
		win.next += fl[i].n
	}
	win.q = append(win.q, fl...)
	return nil
}

// stop ends the issuing of chunks after err (seq: the report count
// before it): the chunks in flight are still waited for, then err is the
// download's.
func (win *window) stop(err error, seq uint64) {
	win.failed, win.failedSeq = err, seq
	if len(win.q) > 0 {
		win.x.w.log.Warn("firmware download: no more chunks issued; waiting for the ones in flight", "job", win.x.job.ID,
			"in_flight", len(win.q), "err", err)
	}
}

// next1 takes the oldest chunk in flight off the window and waits for its
// verdict (accepted, duplicate or invalid). Without one the ack is nil and
// the error noAck's (nil: plan again from the device's newer report).
func (win *window) next1(ctx context.Context) (flight, *fence.Ack, error) {
	c := win.q[0]
	win.q = win.q[1:]
	defer c.p.Close()
	ack, err := win.x.verdict(ctx, fwjob.KindChunk, c.p, int(c.n))
	if err != nil {
		return c, nil, win.x.noAck(ctx, fwjob.KindChunk, c.seq, err)
	}
	return c, ack, nil
}

// close stops waiting for the chunks still in flight; they stay queued at
// the agent and are delivered (or ended) in order.
func (win *window) close() {
	for _, c := range win.q {
		c.p.Close()
	}
	win.q = nil
}

// drain: the device refused chunk first as invalid (not at its offset:
// the report the download was planned from was older than the device).
// Wait for the verdicts of the chunks behind it, then plan again from a
// report at least as new as the last verdict says the device is
// (refused: the same refusal twice in a row fails the execution).
func (win *window) drain(ctx context.Context, first flight, reason string) error {
	x := win.x
	at, known := expectedOffset(reason)
	for len(win.q) > 0 {
		c, ack, err := win.next1(ctx)
		switch {
		case ack == nil:
			return err
		case ack.Verdict == fence.Invalid:
			if o, ok := expectedOffset(ack.Reason); ok {
				at, known = o, true
			}
		default:
			at, known = c.off+c.n, true
		}
	}
	current := newer(first.seq)
	if known {
		// The device had at bytes after the window's last chunk: a
		// report with fewer is older than that chunk.
		job, seq := x.job.ID, first.seq
		current = func(p fwReport) bool {
			return p.seq > seq && (p.Job != job || p.State != fwjob.Downloading || p.Bytes >= at)
		}
	}
	return x.replan(ctx, fwjob.KindChunk, reason, current)
}

// expectedOffset reads the device's bytes from an fw.chunk refusal's
// reason ("expected offset N", fwjob.ErrOffset).
func expectedOffset(reason string) (uint64, bool) {
	const tag = "expected offset "
	i := strings.Index(reason, tag)
	if i < 0 {
		return 0, false
	}
	var n uint64
	if _, err := fmt.Sscanf(reason[i+len(tag):], "%d", &n); err != nil {
		return 0, false
	}
	return n, true
}
