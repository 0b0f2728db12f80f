package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgefence/edgefence/fence"
)

// maxAttempts bounds the attempts of a write that keeps losing the
// rollout key to other gateways' writes (each retry decides again on the
// rollout the failed transaction returned; see retry).
const maxAttempts = 1000

// Store keeps job documents, rollouts and executions in etcd under a
// prefix (the agent's etcd.prefix). Every write of an execution is fenced
// by the writer's lock key (I5). The writes of one job's rollout through
// one Store take turns (turns), so that a gateway's own writers queue in
// memory instead of losing the rollout key to each other in etcd, and
// decide on the rollout the Store last wrote or read (known): the
// transaction checks it is still the one in etcd, and a refusal (not yet,
// stopped) is decided again on a fresh read. Gateways still contend with
// each other in etcd. It is safe for concurrent use.
type Store struct {
	kv     clientv3.KV
	prefix string
	now    func() time.Time

	mu    sync.Mutex
	turns map[string]*turn    // by job
	known map[string]jobState // by job: the rollout as this store last wrote or read it
}

// turn is a job's rollout writers' token: one at a time per Store.
type turn struct {
	ch    chan struct{} // holds a value while a writer has the turn
	users int           // writers holding or waiting; the entry goes at 0
}

// NewStore returns a store on kv under prefix (e.g. /edgefence/v1). Watch
// needs kv to be a clientv3.Watcher too (a *clientv3.Client is).
func NewStore(kv clientv3.KV, prefix string) *Store {
	return &Store{kv: kv, prefix: strings.TrimRight(prefix, "/"), now: time.Now, turns: map[string]*turn{}, known: map[string]jobState{}}
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
	release, err := s.take(ctx, id)
	if err != nil {
		return Rollout{}, err
	}
	defer release()
	for range maxAttempts {
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
			s.forget(id)
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

// take waits for job's turn (or ctx) and returns its release.
func (s *Store) take(ctx context.Context, job string) (func(), error) {
	s.mu.Lock()
	t := s.turns[job]
	if t == nil {
		t = &turn{ch: make(chan struct{}, 1)}
		s.turns[job] = t
	}
	t.users++
	s.mu.Unlock()
	leave := func() {
		s.mu.Lock()
		if t.users--; t.users == 0 {
			delete(s.turns, job)
		}
		s.mu.Unlock()
	}
	select {
	case t.ch <- struct{}{}:
		return func() { <-t.ch; leave() }, nil
	case <-ctx.Done():
		leave()
		return nil, ctx.Err()
	}
}

// jobState is a job and its rollout as read (or written) at their
// revisions.
type jobState struct {
	job    Job
	jobRev int64 // the job document's ModRevision
	r      Rollout
}

// clone is st with its own counts, to change.
func (st jobState) clone() jobState {
	st.r.Counts = cloneCounts(st.r.Counts)
	return st
}

// state returns job's state as this store last knew it (cached) or, if it
// knows none or fresh is set, as read now.
func (s *Store) state(ctx context.Context, job string, fresh bool) (jobState, bool, error) {
	if !fresh {
		s.mu.Lock()
		st, ok := s.known[job]
		s.mu.Unlock()
		if ok {
			return st, true, nil
		}
	}
	resp, err := s.kv.Txn(ctx).Then(clientv3.OpGet(s.JobKey(job)), clientv3.OpGet(s.RolloutKey(job))).Commit()
	if err != nil {
		return jobState{}, false, fmt.Errorf("jobs: read job %s: %w", job, err)
	}
	st, err := s.stateFrom(job, resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs)
	return st, false, err
}

// stateFrom decodes job's document and rollout as read and keeps them.
func (s *Store) stateFrom(job string, jkvs, rkvs []*mvccpb.KeyValue) (jobState, error) {
	if len(jkvs) == 0 {
		s.forget(job)
		return jobState{}, fmt.Errorf("%w: %s", ErrNoJob, job)
	}
	j, err := decodeJob(string(jkvs[0].Key), jkvs[0].Value)
	if err != nil {
		s.forget(job)
		return jobState{}, err
	}
	r, err := s.rolloutFrom(job, rkvs)
	if err != nil {
		s.forget(job)
		return jobState{}, err
	}
	st := jobState{job: j, jobRev: jkvs[0].ModRevision, r: r}
	s.remember(job, st)
	return st, nil
}

func (s *Store) remember(job string, st jobState) {
	s.mu.Lock()
	s.known[job] = st
	s.mu.Unlock()
}

func (s *Store) forget(job string) {
	s.mu.Lock()
	delete(s.known, job)
	s.mu.Unlock()
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
