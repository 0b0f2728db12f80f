package fence

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/bbolt"

	"github.com/edgefence/edgefence/fence/history"
	"github.com/edgefence/edgefence/internal/groupcommit"
	bberrors "go.etcd.io/bbolt/errors"
)

// TableFile is the fence table's file name in the agent's state directory.
const TableFile = "fence.db"

// Defaults of TableOptions.
const (
	// DefaultTableTimeout bounds the wait for the table file's lock.
	DefaultTableTimeout = time.Second
	// DefaultMaxGroup caps the admits decided and committed in one
	// transaction (TableOptions.MaxGroup).
	//
	// Group commit uses no timer: an admit that finds no commit in progress
	// commits at once (alone, if no one else is admitting); admits that
	// arrive while a commit runs form the next group, which commits as soon
	// as the one before it returned. Every group thus waits at most one
	// commit, and a group's size follows the load: about the number of
	// admits that arrived during the commit before it. The cap bounds one
	// transaction's work (and the wait of its last member); beyond it the
	// next group forms behind it. See docs/BENCHMARKS.md §5 for rates and
	// §24 for why not bbolt's Batch.
	DefaultMaxGroup = 256
)

// Errors of the fence table. Callers test them with errors.Is.
var (
	// ErrTableLocked means another process (normally a second edgefence
	// agent on the same gateway) holds the table file and it did not come
	// free within TableOptions.Timeout.
	ErrTableLocked = errors.New("fence: another edgefence process holds the fence table")
	// ErrTableCorrupt means a stored record or the file itself is not
	// readable. The table fails closed: no command for the device is
	// admitted until an operator repairs it. A mark record that fails its
	// checksum or does not parse also wraps ErrMarkRecordCorrupt.
	ErrTableCorrupt = errors.New("fence: fence table corrupt")
	// ErrTableClosed means the Table was closed.
	ErrTableClosed = errors.New("fence: fence table closed")
	// ErrTableReadOnly means Admit was called on a table opened ReadOnly.
	ErrTableReadOnly = errors.New("fence: fence table opened read-only")
)

// tableBucket holds one record per device id.
var tableBucket = []byte("fence.marks")

// pendingBucket holds the accepted commands not yet applied (see
// tablepending.go).
var pendingBucket = []byte("fence.unapplied")

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

	// MaxGroup caps the number of admits decided and committed in one
	// transaction (default DefaultMaxGroup). There is no delay to tune: a
	// group commits as soon as the commit before it returned.
	MaxGroup int

	// Now is the clock stamped on records (information only, never used for
	// a decision); nil means time.Now.
	Now func() time.Time

	// History, if not nil, gets one history.OpVerdict "accepted" event per
	// accept, recorded inside the write transaction before the commit that
	// makes it durable, as the device shim records its own: a SIGKILL after
	// the commit (even inside its fsync, once the commit is in the page
	// cache) cannot lose the line. OpenTable, and every failed commit,
	// call History.Recover, so that the checker discards the accepts that
	// never became durable. Refusals are the caller's to record. The
	// history is a record of decisions, not part of them: a write error
	// leaves the decision standing. The Table does not close it.
	History *history.Writer
}

// Record is one device's stored high-water mark and who moved it there, when.
type Record struct {
	Device string    `json:"device"`
	Epoch  uint64    `json:"epoch,omitempty"`  // the epoch the mark was accepted in
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

	group *groupcommit.Committer // admits share commits (internal/groupcommit)

	// cache holds each device's state as of a commit that returned: marks
	// known durable, each with the epoch the table holds for the device
	// (the higher of its mark's and its last reset's). A read transaction
	// would not do: bbolt publishes a commit to readers before its fsync
	// returns, and a Duplicate must never vouch for a command whose commit
	// could still be lost.
	cacheMu sync.Mutex
	cache   map[string]State

	// Commands marked applied (MarkApplied) whose removal from the
	// unapplied bucket rides along with the next commit: deferred is the
	// queue the next transaction takes, outstanding every ticket not yet
	// committed.
	deferMu     sync.Mutex
	deferred    []deferredDelete
	ticket      uint64
	outstanding map[uint64]struct{}
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
	if o.MaxGroup <= 0 {
		o.MaxGroup = DefaultMaxGroup
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: o.Timeout, ReadOnly: o.ReadOnly})
	if err != nil {
		return nil, openErr(path, &o, err)
	}
	t := &Table{db: db, path: path, opts: o, cache: make(map[string]State), outstanding: make(map[uint64]struct{})}
	t.group = groupcommit.New(t.update, o.MaxGroup)
	if o.ReadOnly {
		return t, nil
	}
	// This commit's fdatasync also flushes whatever a previous process left
	// in the page cache: from here on every stored mark is durable, and the
	// cache starts from them. Unreadable records stay out of the cache;
	// admits for their devices fail in the write transaction (fail closed)
	// while the other devices are served.
	if err := db.Update(func(tx *bbolt.Tx) error {
		if _, err := tx.CreateBucketIfNotExists(pendingBucket); err != nil {
			return err
		}
		b, err := tx.CreateBucketIfNotExists(tableBucket)
		if err != nil {
			return err
		}
		return b.ForEach(func(k, v []byte) error {
			st, _, _, _, err := parseMarkRecord(v)
			if err != nil {
				return nil
			}
			if e, err := resetEpoch(tx, k); err == nil {
				t.cache[string(k)] = st.At(e)
			}
			return nil
		})
	}); err != nil {
		db.Close()
		return nil, fmt.Errorf("fence: init table %s: %w", path, err)
	}
	// Accepts a previous process recorded but never committed.
	t.recordDurable()
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
	if !t.opts.ReadOnly {
		// Commands marked applied whose removal no commit has carried yet.
		_ = t.update(func(*bbolt.Tx) error { return nil })
	}
	if err := t.db.Close(); err != nil {
		return fmt.Errorf("fence: close table %s: %w", t.path, err)
	}
	return nil
}

// Path returns the table file's path.
func (t *Table) Path() string { return t.path }

// Admit is AdmitAt with no epoch of the fence point's own beyond the
// device's stored ones (floor 0), returning the mark.
func (t *Table) Admit(ctx context.Context, env *Envelope) (Verdict, Mark, error) {
	v, st, err := t.AdmitAt(ctx, env, 0)
	return v, st.Mark, err
}

// AdmitAt decides env at this fence point with the admit rule (AdmitEpoch)
// and, if the verdict is Accepted, stores the device's new mark with its
// epoch. floor is the fence point's own epoch for the device beyond what
// the table stores (the operator's fleet epoch its trust holds, for a
// device whose commands must be signed; 0 otherwise): the device's epoch is
// the highest of floor, its stored mark's and its last reset's. AdmitAt
// returns only after the transaction holding the decision was committed
// with fsync, so the caller may send an Accepted command to the device as
// soon as it returns, and must not send it before (durable before effect).
//
// The transaction that accepts env also stores env itself as admitted but
// not yet applied (Unapplied lists it) until Applied is called for it: a
// process that dies between the admit and the device's answer finds the
// command there when it restarts, instead of a mark that calls it a
// duplicate.
//
// The results are:
//   - Accepted or Duplicate with a nil error, and the device's state after
//     the decision (for the Ack). Only Accepted writes.
//   - Stale with a nil error (a token below the mark), or with an
//     *EpochError wrapping ErrEpochClosed (a command of an earlier epoch).
//   - Invalid with an error wrapping ErrInvalid saying why, when env fails
//     validation or names an epoch the fence point does not hold (an
//     *EpochError wrapping ErrUnknownEpoch), and the device's state if the
//     table knows it.
//   - the zero Verdict and an error when no decision was made: the table is
//     closed or read-only, a record is corrupt (ErrTableCorrupt), the disk
//     failed, or ctx was done before the decision. The command must not be
//     sent; answering it Invalid fails closed.
//
// Refusals of a device whose state is known are answered from an in-memory
// copy of the states whose commits have returned, without a write.
// Everything else is decided inside a write transaction; concurrent admits
// share one (see TableOptions.NoGroupCommit). ctx is checked before the
// decision only: once a decision is submitted, AdmitAt waits for its
// commit, because a caller that gave up on an admit whose commit lands
// would later see its redelivery answered Duplicate without ever having
// sent the command.
func (t *Table) AdmitAt(ctx context.Context, env *Envelope, floor uint64) (Verdict, State, error) {
	if env == nil {
		return Invalid, State{}, invalidf("nil envelope")
	}
	if err := env.Validate(); err != nil {
		st, _ := t.cached(env.Device)
		return Invalid, st.At(floor), err
	}
	if err := ctx.Err(); err != nil {
		return 0, State{}, err
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	switch {
	case t.closed:
		return 0, State{}, ErrTableClosed
	case t.opts.ReadOnly:
		return 0, State{}, ErrTableReadOnly
	}
	// Refusals need no write: answer them from the states known durable.
	// The decision that accepts is made in the write transaction only.
	if cur, ok := t.cached(env.Device); ok {
		if v, st, err := AdmitEpoch(floor, cur, env.Epoch, env.Token, env.Seq); v != Accepted {
			return v, st, err
		}
	}

	c := newAdmitCall(env, floor, t.opts.Now().UnixMilli())
	c.hist = t.opts.History
	if err := t.commit(c); err != nil {
		return 0, State{}, t.storageErr(env.Device, err)
	}
	if c.v == Accepted {
		t.raise(env.Device, c.st)
	}
	return c.v, c.st, c.err
}

// commit runs c in a write transaction committed with fsync: its own, or
// the one of its group.
func (t *Table) commit(c groupCall) error {
	if t.opts.NoGroupCommit {
		return t.update(c.run)
	}
	return t.group.Commit(c.run)
}

// cached returns the device's last state known durable.
func (t *Table) cached(device string) (State, bool) {
	t.cacheMu.Lock()
	defer t.cacheMu.Unlock()
	m, ok := t.cache[device]
	return m, ok
}

// raise records st, an accept's, as durable for device, unless a later
// state already is (admits for one device may return out of order).
func (t *Table) raise(device string, st State) {
	t.cacheMu.Lock()
	defer t.cacheMu.Unlock()
	if cur, ok := t.cache[device]; !ok || StateLess(cur, st) {
		t.cache[device] = st
	}
}

// StateLess orders a device's states as the admit rule moves them: by
// epoch, then by mark.
func StateLess(a, b State) bool {
	if a.Epoch != b.Epoch {
		return a.Epoch < b.Epoch
	}
	return a.Mark.Token < b.Mark.Token || a.Mark.Token == b.Mark.Token && a.Mark.Seq < b.Mark.Seq
}

// groupCall is one operation committed by a group: an admit, or the
// removal of applied commands. run must decide again from scratch in a new
// transaction (a failed group's calls are rerun alone).
type groupCall interface {
	run(tx *bbolt.Tx) error
}

// admitCall is one admit's decision inside a write transaction. It may run
// more than once (a group whose transaction failed is rerun one call at a
// time), each time in a fresh transaction after a rollback: every run
// decides again from what that transaction holds and overwrites the outcome, so the outcome kept is the
// one of the transaction that committed. A second run inside the same
// transaction returns the recorded decision without deciding again.
type admitCall struct {
	key   []byte // device id
	rec   []byte // the record stored if accepted
	pkey  []byte // the command's key in the unapplied bucket
	pval  []byte // and its value there
	perr  error  // encoding rec or pval failed (Envelope.Validate prevents it)
	tok   Token
	seq   uint64
	epoch uint64          // the command's
	floor uint64          // the fence point's own epoch for the device (AdmitAt)
	env   *Envelope       // for the history event
	hist  *history.Writer // nil: no history

	// Outcome of the latest run.
	tx  *bbolt.Tx
	v   Verdict
	st  State
	err error // a refusal by epoch
}

func newAdmitCall(env *Envelope, floor uint64, at int64) *admitCall {
	// One pointer-free allocation holds the key and the record.
	buf := make([]byte, 0, len(env.Device)+markRecordMin+8+len(env.Holder)+len(env.ID))
	key := append(buf, env.Device...)
	// Accepted always leaves the mark (token, seq) in the command's epoch:
	// the record is known now.
	m := Mark{Token: env.Token, Seq: env.Seq}
	rec, rerr := MarkRecord{Epoch: env.Epoch, Mark: m, At: time.UnixMilli(at), Holder: env.Holder, ID: env.ID}.AppendBinary(key[len(key):])
	pval, perr := encodePending(env)
	return &admitCall{key: key, rec: rec, pkey: pendingKey(env.Device, m), pval: pval, perr: errors.Join(rerr, perr),
		tok: env.Token, seq: env.Seq, epoch: env.Epoch, floor: floor, env: env}
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
	e, err := resetEpoch(tx, c.key)
	if err != nil {
		return err
	}
	v, st, verr := AdmitEpoch(max(c.floor, e), cur, c.epoch, c.tok, c.seq)
	if v == Accepted {
		if st != (State{Epoch: c.epoch, Mark: Mark{Token: c.tok, Seq: c.seq}}) { // cannot happen: AdmitEpoch's contract
			return fmt.Errorf("fence: admit rule accepted %d/%d/%d as %v", c.epoch, c.tok, c.seq, st)
		}
		if c.perr != nil {
			return c.perr
		}
		// bbolt keeps the value until the commit; rec is only ever
		// written by newAdmitCall, so a rerun stores the same bytes.
		if err := b.Put(c.key, c.rec); err != nil {
			return err
		}
		// The command itself, unapplied, in the same commit as its mark.
		p := tx.Bucket(pendingBucket)
		if p == nil {
			return fmt.Errorf("%w: bucket %s missing", ErrTableCorrupt, pendingBucket)
		}
		if err := p.Put(c.pkey, c.pval); err != nil {
			return err
		}
		c.record()
	}
	c.tx, c.v, c.st, c.err = tx, v, st, verr
	return nil
}

// record writes the accept to the history, if any: before the commit
// (TableOptions.History).
func (c *admitCall) record() {
	if c.hist == nil {
		return
	}
	_ = c.hist.Record(history.Event{Op: history.OpVerdict, Device: c.env.Device, ID: c.env.ID, Token: uint64(c.tok), Seq: c.seq,
		Kind: c.env.Kind, Verdict: Accepted.String()})
}

// recordDurable records which recorded accepts did not become durable
// (history.Writer.Recover): at open, and after a failed commit.
func (t *Table) recordDurable() {
	if t.opts.History == nil {
		return
	}
	_ = t.opts.History.Recover(func(device string) (uint64, uint64, error) {
		var st State
		err := t.db.View(func(tx *bbolt.Tx) error {
			var err error
			st, err = getMark(tx.Bucket(tableBucket), []byte(device))
			return err
		})
		return uint64(st.Mark.Token), st.Mark.Seq, err
	})
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
		r, err = decodeTableRecord(device, v)
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
			r, err := decodeTableRecord(dev, v)
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

// getMark reads the device's stored mark and its epoch from b; the zero
// State if it has none.
func getMark(b *bbolt.Bucket, key []byte) (State, error) {
	if b == nil {
		return State{}, fmt.Errorf("%w: bucket %s missing", ErrTableCorrupt, tableBucket)
	}
	v := b.Get(key)
	if v == nil {
		return State{}, nil
	}
	st, _, _, _, err := parseMarkRecord(v)
	if err != nil {
		return State{}, fmt.Errorf("%w: %w", ErrTableCorrupt, err)
	}
	return st, nil
}

// resetEpoch reads the epoch of the device's last reset (0: none). An
// unreadable reset record fails the device closed, as a mark record does.
func resetEpoch(tx *bbolt.Tx, key []byte) (uint64, error) {
	rb := tx.Bucket(resetBucket)
	if rb == nil {
		return 0, nil
	}
	v := rb.Get(key)
	if v == nil {
		return 0, nil
	}
	var r ResetRecord
	if err := r.UnmarshalBinary(v); err != nil {
		return 0, fmt.Errorf("%w: %w", ErrTableCorrupt, err)
	}
	return r.Epoch, nil
}

// decodeTableRecord decodes device's stored record. A failure wraps both
// ErrTableCorrupt and ErrMarkRecordCorrupt.
func decodeTableRecord(device string, v []byte) (Record, error) {
	var r MarkRecord
	if err := r.UnmarshalBinary(v); err != nil {
		return Record{}, fmt.Errorf("%w: %w", ErrTableCorrupt, err)
	}
	return Record{Device: device, Epoch: r.Epoch, Mark: r.Mark, At: r.At, Holder: r.Holder, ID: r.ID}, nil
}
