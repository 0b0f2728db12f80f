package jobs

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The holder's writes of an execution. Each is one transaction:
//
//	If(CreateRevision(h.LockKey) == h.Token, ModRevision(execution) == e.Rev
//	   [, ModRevision(job) == as read, ModRevision(rollout) == as read])
//	Then(put execution, put its index copy [, put rollout])
//
// so a deposed holder writes nothing (ErrFenced), two writers of one
// execution cannot lose each other's updates (ErrConflict), and a start or
// finish is decided against the rollout state it is written with: a
// conflict on the rollout alone (another gateway's start or finish, the
// operator's pause) decides again on the rollout the failed transaction
// returned. The rollout a store wrote last is kept (jobState) and decided
// on without reading it first: if another gateway wrote it since, the
// transaction fails and returns it; a refusal (not yet, stopped) is never
// answered from it but from a fresh read.

// Queue creates dev's execution of job, queued, if it does not exist
// (counting it in the rollout in the same transaction), and returns the
// existing one, in whatever status, if it does. ErrNoJob if the job has
// no rollout.
func (s *Store) Queue(ctx context.Context, dev, job string, h Holder) (Execution, error) {
	if err := s.checkHolder(dev, job, h); err != nil {
		return Execution{}, err
	}
	release, err := s.take(ctx, job)
	if err != nil {
		return Execution{}, err
	}
	defer release()
	st, _, err := s.state(ctx, job, false)
	for attempt := 0; err == nil; attempt++ {
		if err = retry(ctx, attempt, job); err != nil {
			break
		}
		now := s.now().UTC()
		e := Execution{Job: job, Device: dev, Status: Queued, Gateway: h.Gateway, Token: h.Token, Version: 1, Queued: now, Updated: now}
		next := st.clone()
		move(&next.r, "", Queued)
		next.r.Updated = now
		out, err := s.commit(ctx, h, e, 0, &next)
		switch {
		case err != nil:
			return Execution{}, err
		case out.ok:
			e.Rev = out.rev
			return e, nil
		case out.execChanged:
			return out.exec, nil // it exists
		}
		st = out.state
	}
	return Execution{}, err
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
	release, err := s.take(ctx, e.Job)
	if err != nil {
		return Execution{}, err
	}
	defer release()
	st, cached, err := s.state(ctx, e.Job, false)
	for attempt := 0; err == nil; attempt++ {
		if err = retry(ctx, attempt, e.Job); err != nil {
			break
		}
		now := s.now().UTC()
		canary, no := decideStart(&st.job, &st.r, now)
		if no != nil && cached {
			// Refuse on the rollout as it is now, not as this store last
			// wrote it.
			st, cached, err = s.state(ctx, e.Job, true)
			continue
		}
		if no != nil {
			return Execution{}, fmt.Errorf("jobs: start %s on %s: %w", e.Job, e.Device, no)
		}
		next := st.clone()
		applyStart(&next.job, &next.r, canary, now)
		ne := e
		ne.Status, ne.Canary, ne.Started, ne.Updated = InProgress, canary, now, now
		ne.Gateway, ne.Token, ne.Version = h.Gateway, h.Token, e.Version+1
		out, err := s.commit(ctx, h, ne, e.Rev, &next)
		switch {
		case err != nil:
			return Execution{}, err
		case out.ok:
			ne.Rev = out.rev
			return ne, nil
		case out.execChanged:
			return Execution{}, conflictf(e, out.exec)
		}
		st, cached = out.state, false
	}
	return Execution{}, err
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
	release, err := s.take(ctx, e.Job)
	if err != nil {
		return Execution{}, Rollout{}, err
	}
	defer release()
	st, _, err := s.state(ctx, e.Job, false)
	for attempt := 0; err == nil; attempt++ {
		if err = retry(ctx, attempt, e.Job); err != nil {
			break
		}
		now := s.now().UTC()
		next := st.clone()
		applyFinish(&next.job, &next.r, &e, to, reason, now)
		ne := e
		ne.Status, ne.Reason, ne.Finished, ne.Updated = to, reason, now, now
		ne.Gateway, ne.Token, ne.Version = h.Gateway, h.Token, e.Version+1
		out, err := s.commit(ctx, h, ne, e.Rev, &next)
		switch {
		case err != nil:
			return Execution{}, Rollout{}, err
		case out.ok:
			ne.Rev = out.rev
			return ne, out.state.clone().r, nil
		case out.execChanged:
			return Execution{}, Rollout{}, conflictf(e, out.exec)
		}
		st = out.state
	}
	return Execution{}, Rollout{}, err
}

// outcome is what a fenced write's transaction found.
type outcome struct {
	ok          bool
	rev         int64     // the write's revision, if ok
	execChanged bool      // not ok: the execution was not at the revision read
	exec        Execution // the execution as it is now, if not ok
	// state is the job and rollout as written (ok) or as they are now
	// (not ok), if a rollout was written.
	state jobState
}

// commit writes e (read at rev; 0: absent) and, if st is not nil, the
// rollout st.r (st read at st.jobRev and st.r.Rev), fenced by h. A failed
// fence is ErrFenced. It keeps the rollout it wrote or found.
func (s *Store) commit(ctx context.Context, h Holder, e Execution, rev int64, st *jobState) (outcome, error) {
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
	if st != nil {
		rb, err := json.Marshal(st.r)
		if err != nil {
			return outcome{}, fmt.Errorf("jobs: encode rollout %s: %w", e.Job, err)
		}
		jk, rk := s.JobKey(e.Job), s.RolloutKey(e.Job)
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(jk), "=", st.jobRev), clientv3.Compare(clientv3.ModRevision(rk), "=", st.r.Rev))
		then = append(then, clientv3.OpPut(rk, string(rb)))
		els = append(els, clientv3.OpGet(jk), clientv3.OpGet(rk))
	}
	resp, err := s.kv.Txn(ctx).If(cmps...).Then(then...).Else(els...).Commit()
	if err != nil {
		s.forget(e.Job) // written or not: unknown
		return outcome{}, fmt.Errorf("jobs: write execution %s/%s: %w", e.Device, e.Job, err)
	}
	if resp.Succeeded {
		out := outcome{ok: true, rev: resp.Header.Revision}
		if st != nil {
			out.state = *st
			out.state.r.Rev = out.rev
			s.remember(e.Job, out.state)
		}
		return out, nil
	}
	kvs := func(i int) []*mvccpb.KeyValue { return resp.Responses[i].GetResponseRange().Kvs }
	if err := fenced(e.Device, h, kvs(0)); err != nil {
		return outcome{}, err
	}
	var out outcome
	if out.exec, err = execFrom(e.Device, e.Job, kvs(1)); err != nil {
		return outcome{}, err
	}
	out.execChanged = out.exec.Rev != rev
	if st != nil {
		if out.state, err = s.stateFrom(e.Job, kvs(2), kvs(3)); err != nil {
			return outcome{}, err
		}
	}
	return out, nil
}

// fenced is ErrFenced, naming the lock key, if lock (the holder's lock key
// as read) is not h's.
func fenced(dev string, h Holder, lock []*mvccpb.KeyValue) error {
	switch {
	case len(lock) == 0:
		return fmt.Errorf("%w: device %s: lock key %s is gone (token %d)", ErrFenced, dev, h.LockKey, h.Token)
	case lock[0].CreateRevision != int64(h.Token):
		return fmt.Errorf("%w: device %s: lock key %s was recreated at revision %d, token %d",
			ErrFenced, dev, h.LockKey, lock[0].CreateRevision, h.Token)
	}
	return nil
}

// retry bounds the attempts of a write that lost the rollout key, and
// spreads the writers of several gateways that keep losing it to each
// other: from the second retry on it waits up to a few milliseconds,
// at random.
func retry(ctx context.Context, attempt int, job string) error {
	if attempt >= maxAttempts {
		return fmt.Errorf("%w: rollout %s changed %d times in a row", ErrConflict, job, maxAttempts)
	}
	if attempt < 2 {
		return ctx.Err()
	}
	t := time.NewTimer(time.Duration(rand.Int64N(int64(min(attempt, 8)) * int64(time.Millisecond))))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
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
