package jobs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fxamacker/cbor/v2"

	"github.com/edgefence/edgefence/devices/fwjob"
	"github.com/edgefence/edgefence/fence"
)

// body is a firmware command body (fwjob.BeginBody, ChunkBody, JobBody).
type body interface {
	Encode() (cbor.RawMessage, error)
}

// send issues one firmware step through the host's fenced path and waits
// for its verdict (verdict). seq is the report count before the send (for
// "a newer report").
func (x *xrun) send(ctx context.Context, kind string, b body, n int) (*fence.Ack, uint64, error) {
	seq := x.w.r.reportSeq()
	p, err := x.issue(ctx, kind, b)
	if err != nil {
		return nil, seq, err
	}
	defer p.Close()
	ack, err := x.verdict(ctx, kind, p, n)
	return ack, seq, err
}

// issue issues one firmware step through the host's fenced path (stored
// in the outbox, in order) without waiting for it. Not holding the device
// is errDeposed.
func (x *xrun) issue(ctx context.Context, kind string, b body) (Pending, error) {
	ps, err := x.issueAll(ctx, kind, []body{b})
	if err != nil {
		return nil, err
	}
	return ps[0], nil
}

// issueAll issues several steps of one kind in one commit (IssueAll), as
// issue does one.
func (x *xrun) issueAll(ctx context.Context, kind string, bs []body) ([]Pending, error) {
	raws := make([][]byte, len(bs))
	for i, b := range bs {
		raw, err := b.Encode()
		if err != nil {
			return nil, fmt.Errorf("jobs: %s body: %w", kind, err)
		}
		raws[i] = raw
	}
	ps, err := x.w.r.host.IssueAll(ctx, x.w.dev, kind, raws)
	if err != nil {
		x.w.r.stats.step(kind, "none", 0)
		if errors.Is(err, ErrFenced) {
			return nil, asDeposed(err)
		}
		return nil, fmt.Errorf("jobs: %s: %w", kind, err)
	}
	return ps, nil
}

// verdict waits for an issued step's ack. It returns the ack when the
// device decided accepted, duplicate or invalid; a stale ack (or the
// host's ErrFenced) is errDeposed; no ack is the host's error. n is the
// chunk's bytes (counted if applied).
func (x *xrun) verdict(ctx context.Context, kind string, p Pending, n int) (*fence.Ack, error) {
	ack, err := p.Wait(ctx)
	verdict := "none"
	if ack != nil {
		verdict = ack.Verdict.String()
	}
	applied := ack != nil && (ack.Verdict == fence.Accepted || ack.Verdict == fence.Duplicate)
	if !applied || kind != fwjob.KindChunk {
		n = 0
	}
	x.w.r.stats.step(kind, verdict, n)
	switch {
	case ack != nil && ack.Verdict == fence.Stale:
		return ack, fmt.Errorf("%w: %s refused stale: %s", errDeposed, kind, ack.Reason)
	case errors.Is(err, ErrFenced):
		return ack, asDeposed(err)
	case applied:
		clear(x.invalid)
		return ack, nil
	case ack != nil && ack.Verdict == fence.Invalid:
		return ack, nil
	case err == nil:
		return ack, fmt.Errorf("jobs: %s: verdict %s", kind, verdict)
	}
	return ack, fmt.Errorf("jobs: %s: %w", kind, err)
}

// reportSeq is the number of firmware reports taken so far.
func (r *Runner) reportSeq() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seq
}

// noAck: a step got no verdict (it may still be delivered from the
// outbox): wait for the device's next report, then plan again.
func (x *xrun) noAck(ctx context.Context, kind string, seq uint64, err error) error {
	if errors.Is(err, errDeposed) || ctx.Err() != nil {
		return err
	}
	x.w.log.Warn("firmware step without a verdict; waiting for the device's report", "job", x.job.ID, "kind", kind, "err", err)
	return x.await(ctx, kind+" without a verdict: the device's report", x.step(), newer(seq))
}

// refused: the device refused a step (other than fw.begin) as invalid:
// the report it was planned from was older than the device. Wait for a
// newer report (after seq, at most a step timeout) and plan again; the
// same step refused again fails the execution.
func (x *xrun) refused(ctx context.Context, kind string, seq uint64, reason string) error {
	return x.replan(ctx, kind, reason, newer(seq))
}

// replan is refused with the report to wait for: current.
func (x *xrun) replan(ctx context.Context, kind, reason string, current func(fwReport) bool) error {
	x.invalid[kind]++
	if x.invalid[kind] > 1 {
		return x.finish(ctx, Failed, kind+" refused: "+reason)
	}
	x.w.log.Info("firmware step refused; planning again from a newer report", "job", x.job.ID, "kind", kind, "reason", reason)
	err := x.await(ctx, "a report newer than the refusal", x.step(), current)
	if _, ok := errors.AsType[*timeoutError](err); ok {
		return nil
	}
	return err
}

// command sends a step with a JobBody and waits for the report done
// accepts, within timeout.
func (x *xrun) command(ctx context.Context, kind string, timeout time.Duration, done func(fwReport) bool) error {
	ack, seq, err := x.send(ctx, kind, fwjob.JobBody{Job: x.job.ID}, 0)
	switch {
	case err != nil:
		return x.noAck(ctx, kind, seq, err)
	case ack.Verdict == fence.Invalid:
		return x.refused(ctx, kind, seq, ack.Reason)
	}
	return x.await(ctx, "the device's report after "+kind, timeout, done)
}

func (x *xrun) install(ctx context.Context) error {
	return x.command(ctx, fwjob.KindInstall, x.step(), x.reached(fwjob.Installed))
}

func (x *xrun) activate(ctx context.Context) error {
	return x.command(ctx, fwjob.KindActivate, x.reboot(), x.reached(fwjob.Confirming))
}

func (x *xrun) commit(ctx context.Context) error {
	return x.command(ctx, fwjob.KindCommit, x.step(), x.reached(fwjob.Committed))
}

// await waits until the device's report satisfies done, at most timeout
// (and the execution's total). The rollout stopping is a stopError, the
// end of the wait a timeoutError naming what.
func (x *xrun) await(ctx context.Context, what string, timeout time.Duration, done func(fwReport) bool) error {
	now := x.w.r.cfg.Now
	deadline := now().Add(timeout)
	if !x.deadline.IsZero() && x.deadline.Before(deadline) {
		deadline = x.deadline
	}
	for {
		if p, ok := x.w.r.report(x.w.dev); ok && done(p) {
			return nil
		}
		if h, ok := x.w.r.host.Holding(x.w.dev); !ok || h.Token != x.h.Token {
			return fmt.Errorf("%w: lease lost while waiting for %s", errDeposed, what)
		}
		if err := x.checkStop(ctx); err != nil {
			return err
		}
		left := deadline.Sub(now())
		if left <= 0 {
			return &timeoutError{fmt.Sprintf("%s: none within %v", what, timeout)}
		}
		x.w.sleep(ctx, left)
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// begin starts the job at the device, with the operator's signed manifest
// if the job has one; a refusal (anti-rollback, another job, a missing or
// bad manifest) rejects the execution.
func (x *xrun) begin(ctx context.Context) error {
	im := x.job.Image
	sum, err := im.Hash()
	if err != nil {
		return x.finish(ctx, Failed, err.Error())
	}
	b := fwjob.BeginBody{Job: x.job.ID, Image: sum, Size: im.Size, Version: im.Version, Chunk: uint64(x.job.Chunk),
		Manifest: im.Manifest}
	ack, seq, err := x.send(ctx, fwjob.KindBegin, b, 0)
	switch {
	case err != nil:
		return x.noAck(ctx, fwjob.KindBegin, seq, err)
	case ack.Verdict == fence.Invalid:
		if p, ok := x.w.r.report(x.w.dev); ok && p.Job == x.job.ID {
			return nil // begun already: the report was older than the device
		}
		return x.finish(ctx, Rejected, ack.Reason)
	}
	if err := x.update(ctx, string(fwjob.Downloading), 0, true); err != nil {
		return err
	}
	return x.download(ctx, 0)
}

// image opens the job's image once per drive.
func (x *xrun) image(ctx context.Context) (Image, error) {
	if x.img != nil {
		return x.img, nil
	}
	img, err := x.w.r.images.Get(ctx, x.job.Image)
	if err != nil {
		return nil, err
	}
	if img.Size() != x.job.Image.Size {
		_ = img.Close()
		return nil, fmt.Errorf("%d bytes, the job says %d", img.Size(), x.job.Image.Size)
	}
	x.img = img
	return img, nil
}
