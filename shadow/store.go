package shadow

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/internal/backoff"
)

// DefaultMaxRetries bounds the read-merge-write rounds of UpdateDesiredAny
// and UpdateReported when other writers keep winning.
const DefaultMaxRetries = 32

// StoreConfig configures a Store. The zero value of each field means its
// default.
type StoreConfig struct {
	// Prefix is the etcd prefix shared with the agent (etcd.prefix in its
	// config, e.g. "/edgefence"); twins live under Prefix+"/devices/".
	Prefix string
	// Writer identifies this writer in field metadata (FieldMeta.By): an
	// agent name, "cli:user@host", an application id.
	Writer string
	// Limits bound patches and documents.
	Limits Limits
	// KnownDevice, if set, must accept a device id before anything is read
	// or written for it; refused ids give ErrUnknownDevice. Ids are always
	// checked with fence.ValidateDeviceID.
	KnownDevice func(dev string) bool
	// Now is the clock for metadata (default time.Now).
	Now func() time.Time
	// MaxRetries bounds conflict retries (default DefaultMaxRetries).
	MaxRetries int
}

// Store keeps twins in etcd. It remembers the last reported state it wrote
// or read per device, so that a reported update costs one etcd request
// unless another writer got there first. A Store is safe for concurrent
// use and starts no goroutines.
type Store struct {
	kv  clientv3.KV
	w   clientv3.Watcher
	cfg StoreConfig

	mu       sync.Mutex
	reported map[string]State // last known reported per device, with its ModRevision
}

// NewStore returns a Store using cli, which the caller keeps and closes.
func NewStore(cli *clientv3.Client, cfg StoreConfig) *Store {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.MaxRetries <= 0 {
		cfg.MaxRetries = DefaultMaxRetries
	}
	cfg.Prefix = strings.TrimSuffix(cfg.Prefix, "/")
	cfg.Limits = cfg.Limits.withDefaults()
	return &Store{kv: cli.KV, w: cli.Watcher, cfg: cfg, reported: make(map[string]State)}
}

// DesiredKey is the etcd key of dev's desired state.
func (s *Store) DesiredKey(dev string) string { return s.devPrefix(dev) + "/twin/desired" }

// ReportedKey is the etcd key of dev's reported state.
func (s *Store) ReportedKey(dev string) string { return s.devPrefix(dev) + "/twin/reported" }

// LockPrefix is the prefix of dev's lock keys, as the agent makes them.
func (s *Store) LockPrefix(dev string) string { return s.devPrefix(dev) + "/lock" }

func (s *Store) devPrefix(dev string) string { return s.cfg.Prefix + "/devices/" + dev }

func (s *Store) checkDevice(dev string) error {
	if err := fence.ValidateDeviceID(dev); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if s.cfg.KnownDevice != nil && !s.cfg.KnownDevice(dev) {
		return fmt.Errorf("%w: %q", ErrUnknownDevice, dev)
	}
	return nil
}

// record is a side's value in etcd: readable JSON.
type record struct {
	State map[string]any       `json:"state"`
	Meta  map[string]FieldMeta `json:"meta,omitempty"`
}

func encodeRecord(st State) (string, error) {
	b, err := json.Marshal(record{State: st.Fields, Meta: st.Meta})
	if err != nil {
		return "", invalidf("encode: %v", err)
	}
	return string(b), nil
}

// decodeKV decodes a side from the value of key at revision modRev; a
// missing key (ok false) is the empty, unwritten state.
func (s *Store) decodeKV(key string, value []byte, modRev int64, ok bool) (State, error) {
	if !ok {
		return emptyState(), nil
	}
	var r record
	if err := json.Unmarshal(value, &r); err != nil {
		return State{}, invalidf("stored %s at revision %d: %v", key, modRev, err)
	}
	// Stored values are ours, but etcdctl can write anything: check them
	// like input, with a generous size limit (the patch limits applied
	// when they were written).
	lim := s.cfg.Limits
	lim.MaxSize = max(lim.MaxSize, len(value))
	fields, err := Normalize(r.State, lim)
	if err != nil {
		return State{}, fmt.Errorf("stored %s at revision %d: %w", key, modRev, err)
	}
	if r.Meta == nil {
		r.Meta = map[string]FieldMeta{}
	}
	return State{Fields: fields, Meta: r.Meta, Version: modRev}, nil
}

// decodeResp decodes the side key from a Get (or a txn's get) response.
func (s *Store) decodeResp(key string, r *clientv3.GetResponse) (State, error) {
	if r == nil || len(r.Kvs) == 0 {
		return s.decodeKV(key, nil, 0, false)
	}
	kv := r.Kvs[0]
	return s.decodeKV(key, kv.Value, kv.ModRevision, true)
}

// txnGet returns the i-th response of a txn as a GetResponse.
func txnGet(resp *clientv3.TxnResponse, i int) *clientv3.GetResponse {
	return (*clientv3.GetResponse)(resp.Responses[i].GetResponseRange())
}

func (s *Store) getSide(ctx context.Context, dev, key string) (State, error) {
	if err := s.checkDevice(dev); err != nil {
		return State{}, err
	}
	r, err := s.kv.Get(ctx, key)
	if err != nil {
		return State{}, fmt.Errorf("shadow: get %s: %w", key, err)
	}
	return s.decodeResp(key, r)
}

// GetDesired reads dev's desired state; Version is its ModRevision (0 if
// never written).
func (s *Store) GetDesired(ctx context.Context, dev string) (State, error) {
	return s.getSide(ctx, dev, s.DesiredKey(dev))
}

// GetReported reads dev's reported state; Version is its ModRevision (0 if
// never written).
func (s *Store) GetReported(ctx context.Context, dev string) (State, error) {
	st, err := s.getSide(ctx, dev, s.ReportedKey(dev))
	if err == nil {
		s.remember(dev, cloneState(st))
	}
	return st, err
}

// Get reads both sides of dev's twin at one revision (one etcd request)
// and computes the delta.
func (s *Store) Get(ctx context.Context, dev string) (*Document, error) {
	if err := s.checkDevice(dev); err != nil {
		return nil, err
	}
	dk, rk := s.DesiredKey(dev), s.ReportedKey(dev)
	resp, err := s.kv.Txn(ctx).Then(clientv3.OpGet(dk), clientv3.OpGet(rk)).Commit()
	if err != nil {
		return nil, fmt.Errorf("shadow: get twin %s: %w", dev, err)
	}
	des, err := s.decodeResp(dk, txnGet(resp, 0))
	if err != nil {
		return nil, err
	}
	rep, err := s.decodeResp(rk, txnGet(resp, 1))
	if err != nil {
		return nil, err
	}
	s.remember(dev, cloneState(rep))
	doc := NewDocument(dev, des, rep)
	doc.Revision = resp.Header.Revision
	return doc, nil
}

// UpdateDesired merges patch into dev's desired state if its version is
// still ifVersion (0: the desired key must not exist yet), in one etcd
// transaction. If another write came first it returns a *ConflictError
// (errors.Is ErrConflict) carrying the current version, and writes nothing.
// Metadata of the fields set records StoreConfig.Writer. It returns the
// new state.
func (s *Store) UpdateDesired(ctx context.Context, dev string, patch map[string]any, ifVersion int64) (State, error) {
	if err := s.checkDevice(dev); err != nil {
		return State{}, err
	}
	if ifVersion < 0 {
		return State{}, invalidf("version %d", ifVersion)
	}
	key := s.DesiredKey(dev)
	p, err := Normalize(patch, s.cfg.Limits)
	if err != nil {
		return State{}, err
	}
	r, err := s.kv.Get(ctx, key)
	if err != nil {
		return State{}, fmt.Errorf("shadow: get %s: %w", key, err)
	}
	base, err := s.decodeResp(key, r)
	if err != nil {
		return State{}, err
	}
	if base.Version != ifVersion {
		return State{}, &ConflictError{Device: dev, Key: key, Want: ifVersion, Current: base.Version}
	}
	st, cur, err := s.casDesired(ctx, dev, key, base, p)
	if err != nil {
		return State{}, err
	}
	if cur != nil {
		return State{}, &ConflictError{Device: dev, Key: key, Want: ifVersion, Current: cur.Version}
	}
	return st, nil
}

// UpdateDesiredAny merges patch into dev's desired state whatever its
// version: it reads, merges and writes conditionally, and on a conflict
// merges again into the state the failed transaction returned, up to
// StoreConfig.MaxRetries times. Use it when the patch does not depend on
// what was there (a setpoint); use UpdateDesired when it does.
func (s *Store) UpdateDesiredAny(ctx context.Context, dev string, patch map[string]any) (State, error) {
	if err := s.checkDevice(dev); err != nil {
		return State{}, err
	}
	key := s.DesiredKey(dev)
	p, err := Normalize(patch, s.cfg.Limits)
	if err != nil {
		return State{}, err
	}
	r, err := s.kv.Get(ctx, key)
	if err != nil {
		return State{}, fmt.Errorf("shadow: get %s: %w", key, err)
	}
	base, err := s.decodeResp(key, r)
	if err != nil {
		return State{}, err
	}
	for attempt := range s.cfg.MaxRetries {
		st, cur, err := s.casDesired(ctx, dev, key, base, p)
		if err != nil || cur == nil {
			return st, err
		}
		base = *cur
		if attempt >= quickRetries {
			// Writers keep colliding: spread out, then start from a
			// fresh read (the state the failed txn returned is stale by
			// the end of the pause).
			if base, err = s.pauseAndRead(ctx, dev, key, attempt); err != nil {
				return State{}, err
			}
		}
	}
	return State{}, &ConflictError{Device: dev, Key: key, Want: base.Version, Current: base.Version, Attempts: s.cfg.MaxRetries}
}

// casDesired writes Merge(base, p) if the key is still at base.Version.
// On a conflict it returns the current state (cur != nil).
func (s *Store) casDesired(ctx context.Context, dev, key string, base State, p map[string]any) (st State, cur *State, err error) {
	st, err = ApplyPatch(base, p, FieldMeta{At: s.cfg.Now().UTC(), By: s.cfg.Writer}, s.cfg.Limits)
	if err != nil {
		return State{}, nil, err
	}
	val, err := encodeRecord(st)
	if err != nil {
		return State{}, nil, err
	}
	resp, err := s.kv.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(key), "=", base.Version)).
		Then(clientv3.OpPut(key, val)).
		Else(clientv3.OpGet(key)).
		Commit()
	if err != nil {
		return State{}, nil, fmt.Errorf("shadow: update desired %s: %w", dev, err)
	}
	if resp.Succeeded {
		st.Version = resp.Header.Revision
		return st, nil, nil
	}
	c, err := s.decodeResp(key, txnGet(resp, 0))
	if err != nil {
		return State{}, nil, err
	}
	return State{}, &c, nil
}

// UpdateReported merges patch into dev's reported state, fenced (invariant
// I5): the write happens only in an etcd transaction that also checks that
// lockKey — the writer's own lock key, under LockPrefix(dev) — still exists
// with CreateRevision == token. If it does not, UpdateReported returns an
// error wrapping ErrFenced and writes nothing; the caller is no longer the
// holder and must stop. The same transaction checks that the reported key
// is still at the version the merge started from, so two writers cannot
// lose each other's updates; on that conflict it merges again into the
// state the failed transaction returned and retries (never after a fence
// failure). In the common case — this Store wrote or read the device's
// reported state last — it costs one etcd request. Field metadata records
// StoreConfig.Writer and token. It returns the new state.
func (s *Store) UpdateReported(ctx context.Context, dev string, patch map[string]any, lockKey string, token int64) (State, error) {
	return s.updateReported(ctx, dev, patch, lockKey, token, time.Time{})
}

// updateReported is UpdateReported with the time to record in metadata
// (zero: now).
func (s *Store) updateReported(ctx context.Context, dev string, patch map[string]any, lockKey string, token int64, at time.Time) (State, error) {
	if err := s.checkDevice(dev); err != nil {
		return State{}, err
	}
	if token <= 0 {
		// CreateRevision == 0 would match a lock key that does not exist.
		return State{}, invalidf("token %d: must be positive", token)
	}
	if !strings.HasPrefix(lockKey, s.LockPrefix(dev)+"/") {
		return State{}, invalidf("lock key %q is not under %s/", lockKey, s.LockPrefix(dev))
	}
	p, err := Normalize(patch, s.cfg.Limits)
	if err != nil {
		return State{}, err
	}
	if at.IsZero() {
		at = s.cfg.Now()
	}
	meta := FieldMeta{At: at.UTC(), By: s.cfg.Writer, Token: token}
	key := s.ReportedKey(dev)
	base, ok := s.known(dev)
	if !ok {
		r, err := s.kv.Get(ctx, key)
		if err != nil {
			return State{}, fmt.Errorf("shadow: get %s: %w", key, err)
		}
		if base, err = s.decodeResp(key, r); err != nil {
			return State{}, err
		}
	}
	for attempt := range s.cfg.MaxRetries {
		if attempt > quickRetries {
			if base, err = s.pauseAndRead(ctx, dev, key, attempt); err != nil {
				return State{}, err
			}
		}
		st, err := ApplyPatch(base, p, meta, s.cfg.Limits)
		if err != nil {
			return State{}, err
		}
		val, err := encodeRecord(st)
		if err != nil {
			return State{}, err
		}
		resp, err := s.kv.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(lockKey), "=", token),
				clientv3.Compare(clientv3.ModRevision(key), "=", base.Version)).
			Then(clientv3.OpPut(key, val)).
			Else(clientv3.OpGet(lockKey), clientv3.OpGet(key)).
			Commit()
		if err != nil {
			s.forget(dev) // the write may or may not have happened
			return State{}, fmt.Errorf("shadow: update reported %s: %w", dev, err)
		}
		if resp.Succeeded {
			st.Version = resp.Header.Revision
			s.remember(dev, st)
			return cloneState(st), nil
		}
		lock := txnGet(resp, 0)
		if len(lock.Kvs) == 0 || lock.Kvs[0].CreateRevision != token {
			s.forget(dev)
			if len(lock.Kvs) == 0 {
				return State{}, fmt.Errorf("%w: device %s: lock key %s is gone (token %d)", ErrFenced, dev, lockKey, token)
			}
			return State{}, fmt.Errorf("%w: device %s: lock key %s was recreated at revision %d, token %d",
				ErrFenced, dev, lockKey, lock.Kvs[0].CreateRevision, token)
		}
		cur, err := s.decodeResp(key, txnGet(resp, 1))
		if err != nil {
			s.forget(dev)
			return State{}, err
		}
		s.remember(dev, cur)
		base = cur
	}
	return State{}, &ConflictError{Device: dev, Key: key, Want: base.Version, Current: base.Version, Attempts: s.cfg.MaxRetries}
}

// quickRetries is how many conflicts in a row a retrying update answers
// at once, merging into the state the failed txn returned; after that it
// pauses and reads again.
const quickRetries = 2

// pauseAndRead waits a random time that grows with the attempt, so that
// writers who keep colliding on one key spread out, then reads the key
// afresh. The pause after attempt n is drawn from [50 µs, min(100 µs·2ⁿ,
// 3.2 ms)].
func (s *Store) pauseAndRead(ctx context.Context, dev, key string, attempt int) (State, error) {
	pause := backoff.Backoff{Min: 50 * time.Microsecond, Max: 3200 * time.Microsecond}
	if !backoff.Sleep(ctx, pause.Delay(attempt)) {
		return State{}, fmt.Errorf("shadow: update %s: %w", key, ctx.Err())
	}
	r, err := s.kv.Get(ctx, key)
	if err != nil {
		return State{}, fmt.Errorf("shadow: get %s: %w", key, err)
	}
	return s.decodeResp(key, r)
}

func (s *Store) known(dev string) (State, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.reported[dev]
	return st, ok
}

func (s *Store) remember(dev string, st State) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur, ok := s.reported[dev]; ok && cur.Version > st.Version {
		return // a concurrent call saw a newer one
	}
	s.reported[dev] = st
}

// Forget drops what the Store remembers of dev's reported state; the next
// UpdateReported reads it first.
func (s *Store) Forget(dev string) { s.forget(dev) }

func (s *Store) forget(dev string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.reported, dev)
}

func cloneState(st State) State {
	meta := make(map[string]FieldMeta, len(st.Meta))
	for k, v := range st.Meta {
		meta[k] = v
	}
	return State{Fields: Clone(st.Fields), Meta: meta, Version: st.Version}
}
