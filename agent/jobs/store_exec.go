package jobs

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The holder's writes of an execution. Each is one transaction:
//
//	If(CreateRevision(h.LockKey) == h.Token, ModRevision(execution) == e.Rev
//	   [, ModRevision(rollout) == r.Rev])
//	Then(put execution, put its index copy [, put rollout])
//
// so a deposed holder writes nothing (ErrFenced), two writers of one
// execution cannot lose each other's updates (ErrConflict), and a start or
// finish is decided against the rollout state it is written with (a
// conflict on the rollout alone is read again and decided again).

// Queue creates dev's execution of job, queued, if it does not exist
// (counting it in the rollout in the same transaction), and returns the
// existing one, in whatever status, if it does. ErrNoJob if the job has
// no rollout.
func (s *Store) Queue(ctx context.Context, dev, job string, h Holder) (Execution, error) {
	if err := s.checkHolder(dev, job, h); err != nil {
		return Execution{}, err
	}
	cur, _, r, err := s.readAll(ctx, dev, job)
	if err != nil {
		return Execution{}, err
	}
	for attempt := 0; ; attempt++ {
		if cur.Rev != 0 {
			return cur, nil
		}
		if err := s.retry(ctx, attempt, job); err != nil {
			return Execution{}, err
		}
		now := s.now().UTC()
		e := Execution{Job: job, Device: dev, Status: Queued, Gateway: h.Gateway, Token: h.Token, Version: 1, Queued: now, Updated: now}
		next := r
		next.Counts = cloneCounts(r.Counts)
		move(&next, "", Queued)
		next.Updated = now
		out, err := s.commit(ctx, h, e, 0, &next)
		if err != nil {
			return Execution{}, err
		}
		if out.ok {
			e.Rev = out.rev
			return e, nil
		}
		cur, r = out.exec, out.rollout
	}
}

// Start moves a queued execution to in_progress if the rollout allows a
// start now (see decideStart), writing the execution and the rollout in
// one transaction. Errors: *NotYetError (ErrNotYet), ErrStopped,
// ErrFenced, ErrConflict (e is not the execution as stored: read it
// again), ErrTransition (e is not queued).
func (s *Store) Start(ctx context.Context, e Execution, h Holder) (Execution, error) {
	if err := s.checkHolder(e.Device, e.Job, h); err != nil {
		return Execution{}, err
	}
	if e.Status != Queued || e.Rev == 0 {
		return Execution{}, fmt.Errorf("%w: start of %s's execution of %s in status %q (want queued)", ErrTransition, e.Device, e.Job, e.Status)
	}
	j, r, err := s.jobAndRollout(ctx, e.Job)
	if err != nil {
		return Execution{}, err
	}
	for attempt := 0; ; attempt++ {
		if err := s.retry(ctx, attempt, e.Job); err != nil {
			return Execution{}, err
		}
		now := s.now().UTC()
		canary, err := decideStart(&j, &r, now)
		if err != nil {
			return Execution{}, fmt.Errorf("jobs: start %s on %s: %w", e.Job, e.Device, err)
		}
		next := r
		next.Counts = cloneCounts(r.Counts)
		applyStart(&j, &next, canary, now)
		ne := e
		ne.Status, ne.Canary, ne.Started, ne.Updated = InProgress, canary, now, now
		ne.Gateway, ne.Token, ne.Version = h.Gateway, h.Token, e.Version+1
		out, err := s.commit(ctx, h, ne, e.Rev, &next)
		if err != nil {
			return Execution{}, err
		}
		if out.ok {
			ne.Rev = out.rev
			return ne, nil
		}
		if out.execChanged {
			return Execution{}, conflictf(e, out.exec)
		}
		r = out.rollout
	}
}

// Update writes the progress of an in-progress execution (Step, Bytes,
// Size, Reason as e carries them) under h: fenced, and only if the
// execution is still at e.Rev. It does not touch the rollout, so devices'
// updates do not contend. ErrTransition if e is not in progress.
func (s *Store) Update(ctx context.Context, e Execution, h Holder) (Execution, error) {
	if err := s.checkHolder(e.Device, e.Job, h); err != nil {
		return Execution{}, err
	}
	if e.Status != InProgress || e.Rev == 0 {
		return Execution{}, fmt.Errorf("%w: update of %s's execution of %s in status %q (want in_progress)", ErrTransition, e.Device, e.Job, e.Status)
	}
	ne := e
	ne.Gateway, ne.Token, ne.Version, ne.Updated = h.Gateway, h.Token, e.Version+1, s.now().UTC()
	out, err := s.commit(ctx, h, ne, e.Rev, nil)
	if err != nil {
		return Execution{}, err
	}
	if !out.ok {
		return Execution{}, conflictf(e, out.exec)
	}
	ne.Rev = out.rev
	return ne, nil
}

// Finish ends a queued or in-progress execution in the terminal status to
// with reason, and records it in the rollout in the same transaction: the
// counts, a canary's success (CanaryLeft) or failure (the rollout
// aborts), the abort ratio (see abortRatio) and completion (a job that
// lists its devices, every one of them ended). Errors as Start's;
// ErrTransition if to is not terminal or e is not live.
func (s *Store) Finish(ctx context.Context, e Execution, to Status, reason string, h Holder) (Execution, Rollout, error) {
	if err := s.checkHolder(e.Device, e.Job, h); err != nil {
		return Execution{}, Rollout{}, err
	}
	if !to.Terminal() || (e.Status != Queued && e.Status != InProgress) || e.Rev == 0 {
		return Execution{}, Rollout{}, fmt.Errorf("%w: %s's execution of %s: %q → %q", ErrTransition, e.Device, e.Job, e.Status, to)
	}
	j, r, err := s.jobAndRollout(ctx, e.Job)
	if err != nil {
		return Execution{}, Rollout{}, err
	}
	for attempt := 0; ; attempt++ {
		if err := s.retry(ctx, attempt, e.Job); err != nil {
			return Execution{}, Rollout{}, err
		}
		now := s.now().UTC()
		next := r
		next.Counts = cloneCounts(r.Counts)
		applyFinish(&j, &next, &e, to, reason, now)
		ne := e
		ne.Status, ne.Reason, ne.Finished, ne.Updated = to, reason, now, now
		ne.Gateway, ne.Token, ne.Version = h.Gateway, h.Token, e.Version+1
		out, err := s.commit(ctx, h, ne, e.Rev, &next)
		if err != nil {
			return Execution{}, Rollout{}, err
		}
		if out.ok {
			ne.Rev, next.Rev = out.rev, out.rev
			return ne, next, nil
		}
		if out.execChanged {
			return Execution{}, Rollout{}, conflictf(e, out.exec)
		}
		r = out.rollout
	}
}

// outcome is what a fenced write's transaction found.
type outcome struct {
	ok          bool
	rev         int64     // the write's revision, if ok
	execChanged bool      // not ok: the execution was not at the revision read
	exec        Execution // the execution as it is now, if not ok
	rollout     Rollout   // the rollout as it is now, if not ok and a rollout was written
}

// commit writes e (read at rev; 0: absent) and, if r is not nil, the
// rollout r (read at r.Rev), fenced by h. A failed fence is ErrFenced.
func (s *Store) commit(ctx context.Context, h Holder, e Execution, rev int64, r *Rollout) (outcome, error) {
	eb, err := json.Marshal(e)
	if err != nil {
		return outcome{}, fmt.Errorf("jobs: encode execution %s/%s: %w", e.Device, e.Job, err)
	}
	ek, ik := s.ExecutionKey(e.Device, e.Job), s.IndexKey(e.Job, e.Device)
	cmps := []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(h.LockKey), "=", int64(h.Token)),
		clientv3.Compare(clientv3.ModRevision(ek), "=", rev),
	}
	then := []clientv3.Op{clientv3.OpPut(ek, string(eb)), clientv3.OpPut(ik, string(eb))}
	els := []clientv3.Op{clientv3.OpGet(h.LockKey), clientv3.OpGet(ek)}
	if r != nil {
		rb, err := json.Marshal(r)
		if err != nil {
			return outcome{}, fmt.Errorf("jobs: encode rollout %s: %w", e.Job, err)
		}
		rk := s.RolloutKey(e.Job)
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(rk), "=", r.Rev))
		then = append(then, clientv3.OpPut(rk, string(rb)))
		els = append(els, clientv3.OpGet(rk))
	}
	resp, err := s.kv.Txn(ctx).If(cmps...).Then(then...).Else(els...).Commit()
	if err != nil {
		return outcome{}, fmt.Errorf("jobs: write execution %s/%s: %w", e.Device, e.Job, err)
	}
	if resp.Succeeded {
		return outcome{ok: true, rev: resp.Header.Revision}, nil
	}
	kvs := func(i int) []*mvccpb.KeyValue { return resp.Responses[i].GetResponseRange().Kvs }
	if lock := kvs(0); len(lock) == 0 || lock[0].CreateRevision != int64(h.Token) {
		if len(lock) == 0 {
			return outcome{}, fmt.Errorf("%w: device %s: lock key %s is gone (token %d)", ErrFenced, e.Device, h.LockKey, h.Token)
		}
		return outcome{}, fmt.Errorf("%w: device %s: lock key %s was recreated at revision %d, token %d",
			ErrFenced, e.Device, h.LockKey, lock[0].CreateRevision, h.Token)
	}
	var out outcome
	if out.exec, err = execFrom(e.Device, e.Job, kvs(1)); err != nil {
		return outcome{}, err
	}
	out.execChanged = out.exec.Rev != rev
	if r != nil {
		if out.rollout, err = s.rolloutFrom(e.Job, kvs(2)); err != nil {
			return outcome{}, err
		}
	}
	return out, nil
}

// readAll reads dev's execution of job (none if dev is ""), the job and
// its rollout in one request.
func (s *Store) readAll(ctx context.Context, dev, job string) (Execution, Job, Rollout, error) {
	ops := []clientv3.Op{clientv3.OpGet(s.JobKey(job)), clientv3.OpGet(s.RolloutKey(job))}
	if dev != "" {
		ops = append(ops, clientv3.OpGet(s.ExecutionKey(dev, job)))
	}
	resp, err := s.kv.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return Execution{}, Job{}, Rollout{}, fmt.Errorf("jobs: read job %s: %w", job, err)
	}
	kvs := func(i int) []*mvccpb.KeyValue { return resp.Responses[i].GetResponseRange().Kvs }
	if len(kvs(0)) == 0 {
		return Execution{}, Job{}, Rollout{}, fmt.Errorf("%w: %s", ErrNoJob, job)
	}
	j, err := decodeJob(string(kvs(0)[0].Key), kvs(0)[0].Value)
	if err != nil {
		return Execution{}, Job{}, Rollout{}, err
	}
	r, err := s.rolloutFrom(job, kvs(1))
	if err != nil || dev == "" {
		return Execution{}, j, r, err
	}
	e, err := execFrom(dev, job, kvs(2))
	return e, j, r, err
}

// jobAndRollout reads job's document and rollout in one request.
func (s *Store) jobAndRollout(ctx context.Context, job string) (Job, Rollout, error) {
	_, j, r, err := s.readAll(ctx, "", job)
	return j, r, err
}

// retry is the wait before attempt (none for the first ones) and the
// bound on attempts of a write that lost the rollout key.
func (s *Store) retry(ctx context.Context, attempt int, job string) error {
	if attempt >= maxAttempts {
		return fmt.Errorf("%w: rollout %s changed %d times in a row", ErrConflict, job, maxAttempts)
	}
	return s.pause(ctx, attempt)
}

// checkHolder refuses a write whose holder cannot be dev's: a lock key
// not under LockPrefix(dev), a token 0 (CreateRevision 0 would match a
// lock key that does not exist) or beyond an etcd revision.
func (s *Store) checkHolder(dev, job string, h Holder) error {
	if err := checkIDs(dev, job); err != nil {
		return err
	}
	if h.Token == 0 || h.Token > math.MaxInt64 {
		return invalidf("token %d: want 1 to %d (a lock key's CreateRevision)", h.Token, int64(math.MaxInt64))
	}
	if !strings.HasPrefix(h.LockKey, s.LockPrefix(dev)+"/") {
		return invalidf("lock key %q is not under %s/", h.LockKey, s.LockPrefix(dev))
	}
	return nil
}

func conflictf(read, now Execution) error {
	return fmt.Errorf("%w: %s's execution of %s is at revision %d (%s, version %d), not %d as read",
		ErrConflict, read.Device, read.Job, now.Rev, orNone(string(now.Status)), now.Version, read.Rev)
}

func cloneCounts(c map[Status]int) map[Status]int {
	out := make(map[Status]int, len(c)+1)
	for k, v := range c {
		out[k] = v
	}
	return out
}
