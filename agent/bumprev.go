package agent

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgefence/edgefence/internal/backoff"
)

// Raising etcd's revision past the tokens devices have accepted, on any
// etcd version: the recovery from a token regression (README, "Token
// regression: recovery runbook") when `etcdutl snapshot restore
// --bump-revision` is not available (etcd < 3.5.10, such as Debian's 3.4).
//
// Every write to etcd is one revision, whatever it carries: a txn with many
// puts is still one. So the only way up over the API is many single Puts;
// BumpRevision runs them concurrently on a scratch key under the prefix,
// which etcd batches into few fsyncs.

// Bump defaults.
const (
	DefaultBumpWriters       = 64
	DefaultBumpProgressEvery = time.Second
	// DefaultBumpCompactEvery is how many revisions BumpConfig.Compact lets
	// pass between compactions on the way: each revision of the scratch
	// key is a record in etcd's database until compacted (~100 bytes), so
	// 10⁷ of them uncompacted would take a GB of a 2 GB quota.
	DefaultBumpCompactEvery = 1_000_000
)

// BumpScratchKey is the key, under the etcd prefix, that BumpRevision
// writes and deletes at the end.
const BumpScratchKey = "/recovery/bump-revision"

// ErrBumpNoTarget means BumpConfig.To is not positive.
var ErrBumpNoTarget = errors.New("agent: bump revision: no target revision")

// BumpConfig configures BumpRevision. The zero value of each optional
// field means its default.
type BumpConfig struct {
	// Prefix is the etcd key prefix (default DefaultEtcdPrefix); the
	// scratch key is Prefix + BumpScratchKey.
	Prefix string
	// To is the target: once BumpRevision returns with Done, etcd's
	// revision is at least To, so every key written afterwards — every new
	// lock key, hence every token — is above To. Required.
	To int64
	// Writers is how many Puts are in flight at once (default 64: etcd
	// commits concurrent writes together, so more in flight is faster, up
	// to where the client's own CPU is the limit; docs/BENCHMARKS.md §20).
	Writers int
	// For stops the writes after this long even short of To (a sample to
	// measure the rate: the writes done count towards To). 0: until To.
	For time.Duration
	// Compact compacts etcd's history to the final revision at the end,
	// and every CompactEvery revisions on the way. Compaction keeps the
	// latest version of every live key — lock keys, twins — and removes
	// only older versions and deleted keys: here the scratch key's.
	Compact      bool
	CompactEvery int64 // default DefaultBumpCompactEvery
	// Progress, if set, is called every ProgressEvery (default 1 s) from
	// one goroutine while the writes run.
	Progress      func(BumpProgress)
	ProgressEvery time.Duration
}

// BumpProgress is how far a bump is.
type BumpProgress struct {
	From     int64         // etcd's revision when the bump started
	Revision int64         // the highest revision a write returned
	To       int64         // the target
	Writes   int64         // Puts done
	Elapsed  time.Duration // since the first write
}

// Rate is the writes per second so far.
func (p BumpProgress) Rate() float64 {
	if p.Elapsed <= 0 {
		return 0
	}
	return float64(p.Writes) / p.Elapsed.Seconds()
}

// Remaining is how many revisions are left to the target.
func (p BumpProgress) Remaining() int64 { return max(0, p.To-p.Revision) }

// ETA is how long the remaining writes take at the rate so far (0 without
// a rate; at most math.MaxInt64 ns, some 292 years, where a slow rate and a
// far target would overflow a Duration).
func (p BumpProgress) ETA() time.Duration {
	r := p.Rate()
	if r <= 0 {
		return 0
	}
	ns := float64(p.Remaining()) / r * float64(time.Second)
	if ns >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(ns)
}

// BumpResult is the outcome of BumpRevision.
type BumpResult struct {
	BumpProgress
	// Done: the revision reached To.
	Done bool
	// Final is etcd's revision after the cleanup (the scratch key's
	// deletion), 0 if the cleanup failed.
	Final int64
	// Compacted is the revision compacted to at the end, 0 if none.
	Compacted int64
}

// BumpRevision raises etcd's revision to at least cfg.To by writing a
// scratch key under the prefix, cfg.Writers Puts at a time, then deletes the
// key and, with cfg.Compact, compacts to the final revision. A revision
// already at To needs no write. Writes only ever raise the revision, which
// never harms a fencing token, so it is safe with agents running, and safe to
// interrupt and run again: when ctx ends it stops, cleans up (with a fresh
// 10 s context) and returns how far it got with the context's error.
func BumpRevision(ctx context.Context, cli *clientv3.Client, cfg BumpConfig) (BumpResult, error) {
	if cfg.To <= 0 {
		return BumpResult{}, ErrBumpNoTarget
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultEtcdPrefix
	}
	if cfg.Writers <= 0 {
		cfg.Writers = DefaultBumpWriters
	}
	if cfg.ProgressEvery <= 0 {
		cfg.ProgressEvery = DefaultBumpProgressEvery
	}
	if cfg.CompactEvery <= 0 {
		cfg.CompactEvery = DefaultBumpCompactEvery
	}
	key := cfg.Prefix + BumpScratchKey
	start, err := cli.Get(ctx, key, clientv3.WithCountOnly())
	if err != nil {
		return BumpResult{}, fmt.Errorf("bump revision: read the revision: %w", err)
	}
	b := &bumper{cli: cli, cfg: cfg, key: key, from: start.Header.Revision}
	b.rev.Store(b.from)
	res := BumpResult{BumpProgress: b.progress()}
	if b.from < cfg.To {
		err = b.write(ctx)
		res.BumpProgress = b.progress()
	}
	res.Done = res.Revision >= cfg.To
	// Clean up even when interrupted: ctx may be done.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if cerr := b.cleanup(cctx, &res); cerr != nil {
		err = errors.Join(err, cerr)
	}
	if err != nil {
		return res, fmt.Errorf("bump revision: at %d of %d: %w", res.Revision, cfg.To, err)
	}
	return res, nil
}

type bumper struct {
	cli  *clientv3.Client
	cfg  BumpConfig
	key  string
	from int64

	rev       atomic.Int64 // highest revision a Put returned
	writes    atomic.Int64
	began     time.Time
	elapsed   atomic.Int64 // nanoseconds, frozen when the writes stop
	compacted int64        // last compaction on the way; the progress goroutine's
}

func (b *bumper) progress() BumpProgress {
	el := time.Duration(b.elapsed.Load())
	if el == 0 && !b.began.IsZero() {
		el = time.Since(b.began)
	}
	return BumpProgress{From: b.from, Revision: b.rev.Load(), To: b.cfg.To, Writes: b.writes.Load(), Elapsed: el}
}

// write runs the writers until the target, cfg.For, ctx or the first error.
func (b *bumper) write(ctx context.Context) error {
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if b.cfg.For > 0 {
		var stop context.CancelFunc
		wctx, stop = context.WithTimeoutCause(wctx, b.cfg.For, errSampleDone)
		defer stop()
	}
	b.began = time.Now()
	var wg sync.WaitGroup
	for range b.cfg.Writers {
		wg.Go(func() {
			if err := b.writer(wctx); err != nil {
				cancel(err)
			}
		})
	}
	done := make(chan struct{})
	var perr error
	go func() {
		defer close(done)
		perr = b.report(wctx)
	}()
	wg.Wait()
	b.elapsed.Store(int64(time.Since(b.began)))
	cancel(nil)
	<-done
	if err := context.Cause(wctx); err != nil && !errors.Is(err, errSampleDone) && (b.rev.Load() < b.cfg.To || ctx.Err() != nil) {
		return err
	}
	return perr
}

// bumpPutTimeout bounds one Put: etcd out of reach stops the bump with an
// error instead of a hang.
const bumpPutTimeout = 10 * time.Second

// errSampleDone ends the writes of a bump with BumpConfig.For.
var errSampleDone = errors.New("sample done")

// writer puts the scratch key until the revision reaches the target or
// ctx ends. A Put is never cancelled half-way: etcd may apply a Put whose
// caller gave up, after the cleanup's Delete, and leave the scratch key.
func (b *bumper) writer(ctx context.Context) error {
	for b.rev.Load() < b.cfg.To && ctx.Err() == nil {
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), bumpPutTimeout)
		resp, err := b.cli.Put(pctx, b.key, "")
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil // the cause is the context's
			}
			if errors.Is(err, rpctypes.ErrTooManyRequests) {
				// etcd's apply lags its commits: let it catch up.
				if !backoff.Sleep(ctx, 50*time.Millisecond) {
					return nil
				}
				continue
			}
			return fmt.Errorf("put %s: %w", b.key, err)
		}
		b.writes.Add(1)
		for r := resp.Header.Revision; ; {
			cur := b.rev.Load()
			if r <= cur || b.rev.CompareAndSwap(cur, r) {
				break
			}
		}
	}
	return nil
}

// report calls Progress and compacts on the way, until ctx is done.
func (b *bumper) report(ctx context.Context) error {
	t := time.NewTicker(b.cfg.ProgressEvery)
	defer t.Stop()
	b.compacted = b.from
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		p := b.progress()
		if b.cfg.Progress != nil {
			b.cfg.Progress(p)
		}
		if b.cfg.Compact && p.Revision-b.compacted >= b.cfg.CompactEvery {
			if _, err := b.cli.Compact(ctx, p.Revision); err != nil && ctx.Err() == nil {
				return fmt.Errorf("compact to %d: %w", p.Revision, err)
			}
			b.compacted = p.Revision
		}
	}
}

// cleanup deletes the scratch key and compacts to the final revision.
func (b *bumper) cleanup(ctx context.Context, res *BumpResult) error {
	del, err := b.cli.Delete(ctx, b.key)
	if err != nil {
		return fmt.Errorf("delete the scratch key %s: %w", b.key, err)
	}
	res.Final = del.Header.Revision
	if !b.cfg.Compact || res.Final <= b.from {
		return nil
	}
	if _, err := b.cli.Compact(ctx, res.Final); err != nil && !errors.Is(err, rpctypes.ErrCompacted) {
		return fmt.Errorf("compact to %d: %w", res.Final, err)
	}
	res.Compacted = res.Final
	return nil
}
