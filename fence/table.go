package fence

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/bbolt"
	bberrors "go.etcd.io/bbolt/errors"
)

// TableFile is the fence table's file name in the agent's state directory.
const TableFile = "fence.db"

// Defaults of TableOptions.
const (
	// DefaultTableTimeout bounds the wait for the table file's lock.
	DefaultTableTimeout = time.Second
	// DefaultMaxBatchSize commits a group as soon as this many admits are
	// waiting, and DefaultMaxBatchDelay after its first admit otherwise.
	//
	// bbolt groups by size or by timer only, so with fewer concurrent
	// admits than MaxBatchSize every group waits the delay: throughput is
	// about concurrency / (delay + one commit). Measured on the reference
	// disk (a commit, two fdatasyncs, ≈ 0.13 ms; medians of 3), admits/s by
	// number of devices admitting at once:
	//
	//	size  delay  1     2     8     16    32    64     256
	//	16    1ms    7.4k  1.5k  5.9k  76k   49k   72k    41k
	//	64    1ms    7.4k  1.5k  5.8k  11k   19k   160k   180k
	//
	// A gateway's concurrency is its devices with a command in flight, a
	// few to a few dozen: 16 serves 16 and more at 40–80k/s, where 64 drops
	// to 11–19k/s until 64 admits are in flight. A delay below 1 ms is not
	// honoured (an idle Go runtime's timers wake after about 1 ms: 500µs
	// measured as 1.3 ms per group), and 2 ms halves every rate below the
	// size. On storage that commits slower than 1 ms (SD cards, eMMC), set
	// MaxBatchDelay to about one commit. An admit that finds no other admit
	// in flight commits alone at once (the 7.4k at 1).
	DefaultMaxBatchSize  = 16
	DefaultMaxBatchDelay = time.Millisecond
)

// Errors of the fence table. Callers test them with errors.Is.
var (
	// ErrTableLocked means another process (normally a second edgefence
	// agent on the same gateway) holds the table file and it did not come
	// free within TableOptions.Timeout.
	ErrTableLocked = errors.New("fence: another edgefence process holds the fence table")
	// ErrTableCorrupt means a stored record or the file itself is not
	// readable. The table fails closed: no command for the device is
	// admitted until an operator repairs it.
	ErrTableCorrupt = errors.New("fence: fence table corrupt")
	// ErrTableClosed means the Table was closed.
	ErrTableClosed = errors.New("fence: fence table closed")
	// ErrTableReadOnly means Admit was called on a table opened ReadOnly.
	ErrTableReadOnly = errors.New("fence: fence table opened read-only")
)

// tableBucket holds one record per device id.
var tableBucket = []byte("fence.marks")

// TableOptions configure a Table. A nil *TableOptions, and the zero value of
// each field, mean the defaults.
type TableOptions struct {
	// Timeout bounds the wait for the file lock (default
	// DefaultTableTimeout). A second process opening the same file gets an
	// error wrapping ErrTableLocked instead of hanging.
	Timeout time.Duration

	// ReadOnly opens the file for inspection: Get and List work, Admit
	// returns ErrTableReadOnly. The file must exist. A read-only open takes
	// a shared lock, which cannot be had while an agent holds the file: it
	// times out with ErrTableLocked, and the running agent is the one to
	// ask.
	ReadOnly bool

	// NoGroupCommit commits every admit in its own transaction, with its
	// own fsyncs, instead of grouping concurrent admits.
	NoGroupCommit bool

	// MaxBatchSize and MaxBatchDelay tune group commit (bbolt's
	// DB.MaxBatchSize and DB.MaxBatchDelay): a group commits when it holds
	// MaxBatchSize admits or MaxBatchDelay after its first one, whichever
	// comes first. Defaults DefaultMaxBatchSize and DefaultMaxBatchDelay.
	MaxBatchSize  int
	MaxBatchDelay time.Duration

	// Now is the clock stamped on records (information only, never used for
	// a decision); nil means time.Now.
	Now func() time.Time
}

// Record is one device's stored high-water mark and who moved it there, when.
type Record struct {
	Device string    `json:"device"`
	Mark   Mark      `json:"mark"`             // highest token accepted, last seq under it
	At     time.Time `json:"at"`               // table's clock when the mark was written (information only)
	Holder string    `json:"holder,omitempty"` // holder named by the command that set the mark
	ID     string    `json:"id,omitempty"`     // id of the command that set the mark
}

// Table is the gateway's durable fence table: the fence point for devices
// that cannot check tokens themselves. It keeps each device's high-water mark
// in one bbolt file and admits a command only through the admit rule, with
// the check and the update in one transaction that is committed with fsync
// before Admit returns.
//
// Its methods are safe for concurrent use. Concurrent admits share commits
// (group commit); admits for the same device are decided one after the other
// and each caller gets the verdict that was committed. The table also keeps
// every device's mark in memory (tens of bytes per device), to answer stale
// and duplicate commands without a write.
//
// The file is locked while a Table has it open: one agent per file, and no
// read-only inspection while the agent runs.
type Table struct {
	db   *bbolt.DB
	path string
	opts TableOptions

	mu     sync.RWMutex // shared by operations, exclusive in Close
	closed bool

	inflight atomic.Int64 // admits in their write path

	// cache holds each device's mark as of a commit that returned: marks
	// known durable. A read transaction would not do: bbolt publishes a
	// commit to readers before its fsync returns, and a Duplicate must never
	// vouch for a command whose commit could still be lost.
	cacheMu sync.Mutex
	cache   map[string]Mark
}

// OpenTable opens the fence table at path, creating it if needed (the
// directory must exist), or opens an existing one for inspection with
// TableOptions.ReadOnly.
func OpenTable(path string, opts *TableOptions) (*Table, error) {
	var o TableOptions
	if opts != nil {
		o = *opts
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTableTimeout
	}
	if o.MaxBatchSize <= 0 {
		o.MaxBatchSize = DefaultMaxBatchSize
	}
	if o.MaxBatchDelay <= 0 {
		o.MaxBatchDelay = DefaultMaxBatchDelay
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: o.Timeout, ReadOnly: o.ReadOnly})
	if err != nil {
		return nil, openErr(path, &o, err)
	}
	db.MaxBatchSize = o.MaxBatchSize
	db.MaxBatchDelay = o.MaxBatchDelay
	t := &Table{db: db, path: path, opts: o, cache: make(map[string]Mark)}
	if o.ReadOnly {
		return t, nil
	}
	// This commit's fdatasync also flushes whatever a previous process left
	// in the page cache: from here on every stored mark is durable, and the
	// cache starts from them. Unreadable records stay out of the cache;
	// admits for their devices fail in the write transaction (fail closed)
	// while the other devices are served.
	if err := db.Update(func(tx *bbolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(tableBucket)
		if err != nil {
			return err
		}
		return b.ForEach(func(k, v []byte) error {
			if m, _, _, _, err := parseRecord(v); err == nil {
				t.cache[string(k)] = m
			}
			return nil
		})
	}); err != nil {
		db.Close()
		return nil, fmt.Errorf("fence: init table %s: %w", path, err)
	}
	return t, nil
}

func openErr(path string, o *TableOptions, err error) error {
	switch {
	case errors.Is(err, bberrors.ErrTimeout) && o.ReadOnly:
		return fmt.Errorf("%w: %s: no shared lock within %v; while the agent runs, ask the agent instead of reading its file: %w",
			ErrTableLocked, path, o.Timeout, err)
	case errors.Is(err, bberrors.ErrTimeout):
		return fmt.Errorf("%w: %s: no lock within %v; is another agent running on this gateway?: %w",
			ErrTableLocked, path, o.Timeout, err)
	case errors.Is(err, bberrors.ErrInvalid), errors.Is(err, bberrors.ErrChecksum), errors.Is(err, bberrors.ErrVersionMismatch):
		return fmt.Errorf("%w: %s: %w", ErrTableCorrupt, path, err)
	}
	return fmt.Errorf("fence: open table %s: %w", path, err)
}

// Close waits for admits in progress, then closes the file. Calling Close
// again returns nil.
func (t *Table) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	t.closed = true
	if err := t.db.Close(); err != nil {
		return fmt.Errorf("fence: close table %s: %w", t.path, err)
	}
	return nil
}

// Path returns the table file's path.
func (t *Table) Path() string { return t.path }

// Admit decides env at this fence point with the admit rule and, if the
// verdict is Accepted, stores the device's new mark. It returns only after
// the transaction holding the decision was committed with fsync, so the
// caller may send an Accepted command to the device as soon as Admit
// returns, and must not send it before (durable before effect).
//
// The results are:
//   - Accepted, Duplicate or Stale with a nil error, and the device's mark
//     after the decision (for the Ack). Only Accepted writes.
//   - Invalid with an error wrapping ErrInvalid saying why, when env fails
//     validation, and the device's mark if the table knows it.
//   - the zero Verdict and an error when no decision was made: the table is
//     closed or read-only, a record is corrupt (ErrTableCorrupt), the disk
//     failed, or ctx was done before the decision. The command must not be
//     sent; answering it Invalid fails closed.
//
// Stale and duplicate commands are answered from an in-memory copy of the
// marks whose commits have returned, without a write. Everything else is
// decided inside a write transaction; concurrent admits share one (see
// TableOptions.NoGroupCommit). ctx is checked before the decision only: once
// a decision is submitted, Admit waits for its commit, because a caller that
// gave up on an admit whose commit lands would later see its redelivery
// answered Duplicate without ever having sent the command.
func (t *Table) Admit(ctx context.Context, env *Envelope) (Verdict, Mark, error) {
	if env == nil {
		return Invalid, Mark{}, invalidf("nil envelope")
	}
	if err := env.Validate(); err != nil {
		m, _ := t.cached(env.Device)
		return Invalid, m, err
	}
	if err := ctx.Err(); err != nil {
		return 0, Mark{}, err
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	switch {
	case t.closed:
		return 0, Mark{}, ErrTableClosed
	case t.opts.ReadOnly:
		return 0, Mark{}, ErrTableReadOnly
	}
	// Stale and duplicate commands need no write: answer them from the
	// marks known durable. The decision that accepts is made in the write
	// transaction only.
	if cur, ok := t.cached(env.Device); ok {
		if v, m := Admit(cur, env.Token, env.Seq); v != Accepted {
			return v, m, nil
		}
	}

	c := newAdmitCall(env, t.opts.Now().UnixMilli())
	// Group only when others are admitting: alone, a group would wait
	// MaxBatchDelay for company that is not coming.
	var err error
	if t.inflight.Add(1) == 1 || t.opts.NoGroupCommit {
		err = t.db.Update(c.run)
	} else {
		err = t.db.Batch(c.run)
	}
	t.inflight.Add(-1)
	if err != nil {
		return 0, Mark{}, t.storageErr(env.Device, err)
	}
	t.raise(env.Device, c.m)
	return c.v, c.m, nil
}

// cached returns the device's last mark known durable.
func (t *Table) cached(device string) (Mark, bool) {
	t.cacheMu.Lock()
	defer t.cacheMu.Unlock()
	m, ok := t.cache[device]
	return m, ok
}

// raise records m as durable for device, unless a higher mark already is
// (admits for one device may return out of order).
func (t *Table) raise(device string, m Mark) {
	if m == (Mark{}) {
		return
	}
	t.cacheMu.Lock()
	defer t.cacheMu.Unlock()
	if cur, ok := t.cache[device]; !ok || markLess(cur, m) {
		t.cache[device] = m
	}
}

// markLess orders marks as the admit rule does.
func markLess(a, b Mark) bool {
	return a.Token < b.Token || a.Token == b.Token && a.Seq < b.Seq
}

// admitCall is one admit's decision inside a write transaction. bbolt may
// run it more than once (Batch retries a group without a member whose
// function failed, and reruns that member alone), each time in a fresh
// transaction after a rollback: every run decides again from what that
// transaction holds and overwrites the outcome, so the outcome kept is the
// one of the transaction that committed. A second run inside the same
// transaction returns the recorded decision without deciding again.
type admitCall struct {
	key []byte // device id
	rec []byte // the record stored if accepted
	tok Token
	seq uint64

	// Outcome of the latest run.
	tx *bbolt.Tx
	v  Verdict
	m  Mark
}

func newAdmitCall(env *Envelope, at int64) *admitCall {
	// One pointer-free allocation holds the key and the record.
	buf := make([]byte, 0, len(env.Device)+recordMin+len(env.Holder)+len(env.ID))
	key := append(buf, env.Device...)
	// Accepted always leaves the mark (token, seq): the record is known now.
	rec := appendRecord(key[len(key):], Mark{Token: env.Token, Seq: env.Seq}, at, env.Holder, env.ID)
	return &admitCall{key: key, rec: rec, tok: env.Token, seq: env.Seq}
}

func (c *admitCall) run(tx *bbolt.Tx) error {
	if c.tx == tx {
		return nil
	}
	b := tx.Bucket(tableBucket)
	cur, err := getMark(b, c.key)
	if err != nil {
		return err
	}
	v, m := Admit(cur, c.tok, c.seq)
	if v == Accepted {
		if m != (Mark{Token: c.tok, Seq: c.seq}) { // cannot happen: Admit's contract
			return fmt.Errorf("fence: admit rule accepted %d/%d as %v", c.tok, c.seq, m)
		}
		// bbolt keeps the value until the commit; rec is only ever
		// written by newAdmitCall, so a rerun stores the same bytes.
		if err := b.Put(c.key, c.rec); err != nil {
			return err
		}
	}
	c.tx, c.v, c.m = tx, v, m
	return nil
}

func (t *Table) storageErr(device string, err error) error {
	switch {
	case errors.Is(err, ErrTableCorrupt):
		return fmt.Errorf("%w (device %s, table %s)", err, device, t.path)
	case errors.Is(err, bberrors.ErrDatabaseNotOpen):
		return ErrTableClosed
	}
	return fmt.Errorf("fence: table %s: device %s: %w", t.path, device, err)
}

// Get returns the device's record; found is false if the table has never
// accepted a command for it. It reads the latest commit, which may still be
// in its fsync.
func (t *Table) Get(device string) (r Record, found bool, err error) {
	if err := ValidateDeviceID(device); err != nil {
		return Record{}, false, err
	}
	err = t.view(func(b *bbolt.Bucket) error {
		v := b.Get([]byte(device))
		if v == nil {
			return nil
		}
		found = true
		r, err = decodeRecord(device, v)
		return err
	})
	if err != nil {
		return Record{}, false, t.storageErr(device, err)
	}
	return r, found, nil
}

// List returns the records of all devices, ordered by device id. Records
// that cannot be read are left out and reported in the error (wrapping
// ErrTableCorrupt), together with the readable ones.
func (t *Table) List() ([]Record, error) {
	var recs []Record
	var bad []error
	err := t.view(func(b *bbolt.Bucket) error {
		return b.ForEach(func(k, v []byte) error {
			dev := string(k)
			if err := ValidateDeviceID(dev); err != nil {
				bad = append(bad, fmt.Errorf("%w: key %q is not a device id", ErrTableCorrupt, k))
				return nil
			}
			r, err := decodeRecord(dev, v)
			if err != nil {
				bad = append(bad, fmt.Errorf("%w (device %s)", err, dev))
				return nil
			}
			recs = append(recs, r)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("fence: table %s: %w", t.path, err)
	}
	if len(bad) > 0 {
		return recs, fmt.Errorf("fence: table %s: %d unreadable records: %w", t.path, len(bad), errors.Join(bad...))
	}
	return recs, nil
}

// view runs fn on the marks bucket in a read transaction. A read-only table
// whose file has no bucket yet reads as empty.
func (t *Table) view(fn func(b *bbolt.Bucket) error) error {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.closed {
		return ErrTableClosed
	}
	return t.db.View(func(tx *bbolt.Tx) error {
		b := tx.Bucket(tableBucket)
		if b == nil {
			if t.opts.ReadOnly {
				return nil
			}
			return fmt.Errorf("%w: bucket %s missing", ErrTableCorrupt, tableBucket)
		}
		return fn(b)
	})
}

// getMark reads the device's mark from b; the zero Mark if it has none.
func getMark(b *bbolt.Bucket, key []byte) (Mark, error) {
	if b == nil {
		return Mark{}, fmt.Errorf("%w: bucket %s missing", ErrTableCorrupt, tableBucket)
	}
	v := b.Get(key)
	if v == nil {
		return Mark{}, nil
	}
	m, _, _, _, err := parseRecord(v)
	return m, err
}
