package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgefence/edgefence/fence"
)

// maxAttempts bounds the retries of a write that lost the rollout key to
// another writer (every start and finish of the job writes it); past
// quickAttempts a retry waits a few milliseconds, jittered, first.
const (
	maxAttempts   = 200
	quickAttempts = 3
)

// Store keeps job documents, rollouts and executions in etcd under a
// prefix (the agent's etcd.prefix). It keeps no state of its own: every
// call reads or writes etcd, and every write of an execution is fenced by
// the writer's lock key (I5). It is safe for concurrent use.
type Store struct {
	kv     clientv3.KV
	prefix string
	now    func() time.Time
}

// NewStore returns a store on kv under prefix (e.g. /edgefence/v1). Watch
// needs kv to be a clientv3.Watcher too (a *clientv3.Client is).
func NewStore(kv clientv3.KV, prefix string) *Store {
	return &Store{kv: kv, prefix: strings.TrimRight(prefix, "/"), now: time.Now}
}

// WithClock sets the clock of the timestamps and the rate decisions
// (tests); it returns s.
func (s *Store) WithClock(now func() time.Time) *Store {
	s.now = now
	return s
}

// JobKey is the key of job id's document, P/jobs/<id>.
func (s *Store) JobKey(id string) string { return s.prefix + "/jobs/" + id }

// RolloutKey is the key of job id's rollout, P/rollouts/<id>.
func (s *Store) RolloutKey(id string) string { return s.prefix + "/rollouts/" + id }

// ExecutionKey is the key of dev's execution of job, P/devices/<dev>/jobs/<job>.
func (s *Store) ExecutionKey(dev, job string) string {
	return s.prefix + "/devices/" + dev + "/jobs/" + job
}

// IndexKey is the key of the copy of dev's execution of job listed under
// the job, P/executions/<job>/<dev>.
func (s *Store) IndexKey(job, dev string) string { return s.prefix + "/executions/" + job + "/" + dev }

// LockPrefix is the prefix of dev's lock keys, P/devices/<dev>/lock (as
// the agent's leases): a holder's lock key is under it.
func (s *Store) LockPrefix(dev string) string { return s.prefix + "/devices/" + dev + "/lock" }

// Create stores a new job (defaults applied, validated) and its rollout,
// active with the policy's canaries to go, in one transaction. ErrExists
// if the job or its rollout exists.
func (s *Store) Create(ctx context.Context, j Job) (Job, Rollout, error) {
	j.ApplyDefaults()
	if err := j.Validate(); err != nil {
		return Job{}, Rollout{}, err
	}
	now := s.now().UTC()
	if j.Created.IsZero() {
		j.Created = now
	}
	r := Rollout{Job: j.ID, Status: RolloutActive, Counts: map[Status]int{}, CanaryLeft: j.Rollout.Canary, Updated: now}
	jb, err := json.Marshal(j)
	if err != nil {
		return Job{}, Rollout{}, fmt.Errorf("jobs: encode job %s: %w", j.ID, err)
	}
	rb, err := json.Marshal(r)
	if err != nil {
		return Job{}, Rollout{}, fmt.Errorf("jobs: encode rollout %s: %w", j.ID, err)
	}
	jk, rk := s.JobKey(j.ID), s.RolloutKey(j.ID)
	resp, err := s.kv.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(jk), "=", 0), clientv3.Compare(clientv3.CreateRevision(rk), "=", 0)).
		Then(clientv3.OpPut(jk, string(jb)), clientv3.OpPut(rk, string(rb))).
		Commit()
	if err != nil {
		return Job{}, Rollout{}, fmt.Errorf("jobs: create %s: %w", j.ID, err)
	}
	if !resp.Succeeded {
		return Job{}, Rollout{}, fmt.Errorf("%w: %s", ErrExists, j.ID)
	}
	r.Rev = resp.Header.Revision
	return j, r, nil
}

// Job reads job id's document. ErrNoJob if there is none.
func (s *Store) Job(ctx context.Context, id string) (Job, error) {
	if err := ValidateID(id); err != nil {
		return Job{}, err
	}
	resp, err := s.kv.Get(ctx, s.JobKey(id))
	if err != nil {
		return Job{}, fmt.Errorf("jobs: get job %s: %w", id, err)
	}
	if len(resp.Kvs) == 0 {
		return Job{}, fmt.Errorf("%w: %s", ErrNoJob, id)
	}
	return decodeJob(string(resp.Kvs[0].Key), resp.Kvs[0].Value)
}

// Jobs lists the job documents, sorted by id. A document that does not
// decode is left out and named in the error (wrapping ErrInvalidJob),
// returned with the jobs that do.
func (s *Store) Jobs(ctx context.Context) ([]Job, error) {
	resp, err := s.kv.Get(ctx, s.JobKey(""), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return nil, fmt.Errorf("jobs: list jobs: %w", err)
	}
	out := make([]Job, 0, len(resp.Kvs))
	var errs []error
	for _, kv := range resp.Kvs {
		j, err := decodeJob(string(kv.Key), kv.Value)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, j)
	}
	return out, errors.Join(errs...)
}

// Rollout reads job id's rollout, with Rev. ErrNoJob if there is none.
func (s *Store) Rollout(ctx context.Context, id string) (Rollout, error) {
	if err := ValidateID(id); err != nil {
		return Rollout{}, err
	}
	resp, err := s.kv.Get(ctx, s.RolloutKey(id))
	if err != nil {
		return Rollout{}, fmt.Errorf("jobs: get rollout %s: %w", id, err)
	}
	return s.rolloutFrom(id, resp.Kvs)
}

// SetRollout is the operator's pause (to paused), resume (to active) and
// cancel (to canceled) of job id's rollout, with the reason to record.
// ErrTransition if the rollout's status does not allow it (aborted,
// completed and canceled are ends); a concurrent change of the rollout
// is read again and the change decided again.
func (s *Store) SetRollout(ctx context.Context, id string, to RolloutStatus, reason string) (Rollout, error) {
	r, err := s.Rollout(ctx, id)
	if err != nil {
		return Rollout{}, err
	}
	for attempt := range maxAttempts {
		if err := s.pause(ctx, attempt); err != nil {
			return Rollout{}, err
		}
		if err := rolloutTransition(r.Status, to); err != nil {
			return Rollout{}, fmt.Errorf("jobs: %s: %w", id, err)
		}
		next := r
		next.Status, next.Reason, next.Updated = to, reason, s.now().UTC()
		b, err := json.Marshal(next)
		if err != nil {
			return Rollout{}, fmt.Errorf("jobs: encode rollout %s: %w", id, err)
		}
		key := s.RolloutKey(id)
		resp, err := s.kv.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", r.Rev)).
			Then(clientv3.OpPut(key, string(b))).
			Else(clientv3.OpGet(key)).
			Commit()
		if err != nil {
			return Rollout{}, fmt.Errorf("jobs: set rollout %s: %w", id, err)
		}
		if resp.Succeeded {
			next.Rev = resp.Header.Revision
			return next, nil
		}
		if r, err = s.rolloutFrom(id, resp.Responses[0].GetResponseRange().Kvs); err != nil {
			return Rollout{}, err
		}
	}
	return Rollout{}, fmt.Errorf("%w: rollout %s changed %d times in a row", ErrConflict, id, maxAttempts)
}

// Execution reads dev's execution of job; Rev 0 and Status "" when it
// does not exist.
func (s *Store) Execution(ctx context.Context, dev, job string) (Execution, error) {
	if err := checkIDs(dev, job); err != nil {
		return Execution{}, err
	}
	resp, err := s.kv.Get(ctx, s.ExecutionKey(dev, job))
	if err != nil {
		return Execution{}, fmt.Errorf("jobs: get execution %s/%s: %w", dev, job, err)
	}
	return execFrom(dev, job, resp.Kvs)
}

// Executions lists job's executions (from P/executions/<job>/), sorted by
// device. An execution that does not decode is left out and named in the
// error (wrapping ErrInvalidJob), returned with those that do.
func (s *Store) Executions(ctx context.Context, job string) ([]Execution, error) {
	if err := ValidateID(job); err != nil {
		return nil, err
	}
	resp, err := s.kv.Get(ctx, s.IndexKey(job, ""), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return nil, fmt.Errorf("jobs: list executions of %s: %w", job, err)
	}
	out := make([]Execution, 0, len(resp.Kvs))
	var errs []error
	for _, kv := range resp.Kvs {
		var e Execution
		if err := json.Unmarshal(kv.Value, &e); err != nil {
			errs = append(errs, invalidf("execution %s: %v", kv.Key, err))
			continue
		}
		e.Rev = kv.ModRevision
		out = append(out, e)
	}
	return out, errors.Join(errs...)
}

// pause waits before a retry past the quick ones, jittered so that
// writers contending for the rollout key spread out.
func (s *Store) pause(ctx context.Context, attempt int) error {
	if attempt < quickAttempts {
		return ctx.Err()
	}
	d := time.Duration(1+rand.IntN(min(attempt, 20))) * time.Millisecond
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func decodeJob(key string, b []byte) (Job, error) {
	var j Job
	if err := json.Unmarshal(b, &j); err != nil {
		return Job{}, invalidf("job %s: %v", key, err)
	}
	return j, nil
}

// rolloutFrom decodes a rollout read as kvs (none: ErrNoJob).
func (s *Store) rolloutFrom(id string, kvs []*mvccpb.KeyValue) (Rollout, error) {
	if len(kvs) == 0 {
		return Rollout{}, fmt.Errorf("%w: %s (no rollout)", ErrNoJob, id)
	}
	return decodeRollout(kvs[0])
}

// decodeRollout decodes a stored rollout, with its Rev.
func decodeRollout(kv *mvccpb.KeyValue) (Rollout, error) {
	var r Rollout
	if err := json.Unmarshal(kv.Value, &r); err != nil {
		return Rollout{}, invalidf("rollout %s: %v", kv.Key, err)
	}
	if r.Counts == nil {
		r.Counts = make(map[Status]int)
	}
	r.Rev = kv.ModRevision
	return r, nil
}

// execFrom decodes an execution read as kvs (none: the absent one).
func execFrom(dev, job string, kvs []*mvccpb.KeyValue) (Execution, error) {
	if len(kvs) == 0 {
		return Execution{Job: job, Device: dev}, nil
	}
	var e Execution
	if err := json.Unmarshal(kvs[0].Value, &e); err != nil {
		return Execution{}, invalidf("execution %s: %v", kvs[0].Key, err)
	}
	e.Rev = kvs[0].ModRevision
	return e, nil
}

func checkIDs(dev, job string) error {
	if err := ValidateID(job); err != nil {
		return err
	}
	if err := fence.ValidateDeviceID(dev); err != nil {
		return invalidf("device %q: %v", dev, err)
	}
	return nil
}
