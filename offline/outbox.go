package offline

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/bbolt"
	bberrors "go.etcd.io/bbolt/errors"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/internal/groupcommit"
)

// File is the outbox's file name in the agent's state directory.
const File = "outbox.db"

// Defaults of Options.
const (
	DefaultTimeout           = time.Second
	DefaultTTL               = time.Hour
	DefaultRetention         = 24 * time.Hour
	DefaultMaxEnded          = 100_000
	DefaultMaxPerDevice      = 10_000
	DefaultMaxBytesPerDevice = 16 << 20
	DefaultMaxTotal          = 100_000
	DefaultMaxTotalBytes     = 256 << 20
)

var (
	entriesBucket = []byte("outbox.entries") // command id → record
	queueBucket   = []byte("outbox.queue")   // device, 0, pos → command id; pending entries only
	doneBucket    = []byte("outbox.done")    // resolved time, id → nil; terminal entries only
	seqBucket     = []byte("outbox.seq")     // device → last queue position handed out
)

// Options configure an Outbox. A nil *Options, and the zero value (or a
// negative value) of each field, mean the defaults.
//
// The limits count pending entries and the bytes of their encoded
// envelopes; terminal entries are bounded by Retention and MaxEnded
// instead.
type Options struct {
	// Timeout bounds the wait for the file lock (default DefaultTimeout).
	// A second process gets an error wrapping ErrLocked.
	Timeout time.Duration
	// Now is the clock for creation, expiry and retention (default
	// time.Now).
	Now func() time.Time

	MaxPerDevice      int   // pending entries per device
	MaxBytesPerDevice int64 // pending envelope bytes per device
	MaxTotal          int   // pending entries in all
	MaxTotalBytes     int64 // pending envelope bytes in all

	// TTL is the time to live of an entry that does not set its own
	// (default DefaultTTL): ExpireDue ends it as fence.Expired after that.
	TTL time.Duration
	// Retention is how long a terminal entry is kept (without a body
	// over KeepBodyMax) before Compact deletes it (default
	// DefaultRetention).
	Retention time.Duration
	// MaxEnded is how many terminal entries are kept at most (default
	// DefaultMaxEnded): over it, Compact deletes the oldest before their
	// Retention. Without it a steady load keeps a day of ended commands
	// — ≈ 0.67 KiB of file each, 9.6 GB a day at 166 commands/s — and
	// the agent's reads map their pages (docs/BENCHMARKS.md §80).
	MaxEnded int
	// Logger, if set, receives a warning for every Append refused with
	// ErrFull and for unreadable records met by ExpireDue, and an info
	// record for every entry ExpireDue ends. The outbox logs nothing
	// without one.
	Logger *slog.Logger

	// VerdictDelay is how long a verdict handed to ResolveLater waits at
	// most for a commit to ride on before the outbox commits it itself
	// (default DefaultVerdictDelay).
	VerdictDelay time.Duration

	// ReadOnly opens an existing file for inspection (edgefence outbox
	// list|show): Next, Get, List, Summary, Stats and Held work, every
	// write (Append, Resolve, ExpireDue, Compact, SetHeld) returns an
	// error wrapping ErrReadOnly, and nothing is created — a file without
	// the outbox's buckets reads as an empty outbox. A read-only open
	// takes a shared lock, which cannot be had while an agent holds the
	// file: it waits Timeout and fails with ErrLocked, and the running
	// agent is the one to ask.
	ReadOnly bool
}

func (o *Options) withDefaults() Options {
	var r Options
	if o != nil {
		r = *o
	}
	if r.Timeout <= 0 {
		r.Timeout = DefaultTimeout
	}
	if r.Now == nil {
		r.Now = time.Now
	}
	if r.MaxPerDevice <= 0 {
		r.MaxPerDevice = DefaultMaxPerDevice
	}
	if r.MaxBytesPerDevice <= 0 {
		r.MaxBytesPerDevice = DefaultMaxBytesPerDevice
	}
	if r.MaxTotal <= 0 {
		r.MaxTotal = DefaultMaxTotal
	}
	if r.MaxTotalBytes <= 0 {
		r.MaxTotalBytes = DefaultMaxTotalBytes
	}
	if r.TTL <= 0 {
		r.TTL = DefaultTTL
	}
	if r.Retention <= 0 {
		r.Retention = DefaultRetention
	}
	if r.MaxEnded <= 0 {
		r.MaxEnded = DefaultMaxEnded
	}
	if r.VerdictDelay <= 0 {
		r.VerdictDelay = DefaultVerdictDelay
	}
	return r
}

// Entry is one command in the outbox. Append reads Envelope, Created and
// TTL, and sets Raw, Created, Deadline and Pos.
type Entry struct {
	// Envelope is the command as it will be sent, with its original token,
	// seq and id. Append validates and encodes it.
	Envelope fence.Envelope
	// Raw is the encoded envelope (fence.MarshalEnvelope), as stored: what
	// a transport sends. Set by Append and Next.
	Raw []byte
	// Created is when the command was created; zero means now (Options.Now)
	// at Append.
	Created time.Time
	// TTL overrides Options.TTL for this entry when positive.
	TTL time.Duration
	// Deadline is Created + TTL; set by Append and Next.
	Deadline time.Time
	// Pos is the entry's position in its device's queue, from 1; set by
	// Append and Next.
	Pos uint64
}

// usage is what the pending entries of a device (or all) take.
type usage struct {
	n     int
	bytes int64
}

// Outbox is a durable, bounded, per-device FIFO of fenced commands in which
// every entry ends in exactly one recorded terminal state (invariant I4).
// It is safe for concurrent use; writes are serialized, each durable
// (fsync) before it returns.
type Outbox struct {
	db   *bbolt.DB
	path string
	opts Options

	// mu keeps Close out of every operation (RLock across it, commits
	// included) and serializes the writers that do not go through the
	// group committer (Lock: ExpireEntries, Compact, SetLease, Close).
	// Append, Resolve and SetHeld hold only RLock across their commit, so
	// that concurrent callers join one group (one fsync); they never take
	// mu.Lock, which would wait for the group in progress and hold the
	// next callers back (§ "Group commit on the hot path" in
	// docs/BENCHMARKS.md).
	mu     sync.RWMutex
	closed bool

	// cmu guards the pending counts, held only for the counting: never
	// across a commit. Order: mu → cmu.
	cmu     sync.Mutex
	devs    map[string]usage // pending, per device
	total   usage            // pending, all devices
	refused uint64           // Appends refused with ErrFull since Open

	commits atomic.Pointer[func(time.Duration)] // ObserveCommits
	group   *groupcommit.Committer              // Resolve's and SetHeld's group commit

	// lmu guards the verdicts waiting for their commit (ResolveLater,
	// later.go): written when one is deferred and when its commit
	// returns, read-held by the views across their read transaction, so
	// that a view sees each entry either in later or in the file as
	// terminal. Order: mu → lmu → cmu.
	// due is a floor of the pending entries' deadlines (unix ms): no
	// pending entry expires before it, so an expiry pass before it needs
	// no scan (expired.go). Lowered by every append before its commit,
	// set by every scan from what stays pending, under mu.Lock.
	due atomic.Int64
	// ended counts the terminal entries: exact after Open and after a
	// Compact that found too many, raised by every resolve and expiry
	// that commits and lowered by Compact's deletions in between. It
	// may run high (an end counted whose commit a later rerun undid, a
	// deletion of a done key without its entry): it only makes Compact
	// look sooner, and Compact counts before it deletes for MaxEnded.
	ended atomic.Int64

	batchForTest int // Compact's batch, if set (tests)

	lmu   sync.RWMutex
	later map[string]*later // command id → its deferred verdict
	armed bool              // timer will commit them
	timer *time.Timer
	gen   uint64 // the armed timer's generation
	// again: CommitSoon was called since flushSoon's pass began;
	// flushing: flushSoon runs (flushers counts it, for Close).
	again    bool
	flushing bool
	flushers sync.WaitGroup
}

// ObserveCommits makes the outbox call fn after each write transaction it
// commits, with the time bbolt spent writing and syncing it (its fsyncs:
// bbolt's TxStats.WriteTime). fn runs on the writer's goroutine after the
// file lock is released; it must be quick. nil stops the calls.
func (ob *Outbox) ObserveCommits(fn func(write time.Duration)) {
	if fn == nil {
		ob.commits.Store(nil)
		return
	}
	ob.commits.Store(&fn)
}

// Open opens (creating if need be) the outbox file at path, or, with
// Options.ReadOnly, opens an existing one for inspection.
func Open(path string, opts *Options) (*Outbox, error) {
	o := opts.withDefaults()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: o.Timeout, ReadOnly: o.ReadOnly})
	if err != nil {
		return nil, openErr(path, &o, err)
	}
	ob := &Outbox{db: db, path: path, opts: o, devs: make(map[string]usage)}
	ob.due.Store(math.MaxInt64) // lowered by the count of the pending entries below
	ob.group = groupcommit.New(ob.observedUpdate, 0)
	// Create the buckets (unless read-only) and count the pending entries.
	// A write commit's fdatasync also flushes whatever a previous process
	// left in the page cache. An unreadable pending record counts as one
	// entry of 0 bytes; Next and Get report it.
	count := func(tx *bbolt.Tx) error {
		entries, queue := tx.Bucket(entriesBucket), tx.Bucket(queueBucket)
		if entries == nil || queue == nil {
			return nil // read-only and never initialized: empty
		}
		if done := tx.Bucket(doneBucket); done != nil {
			ob.ended.Store(int64(done.Stats().KeyN))
		}
		return queue.ForEach(func(k, id []byte) error {
			dev, _, ok := splitQueueKey(k)
			if !ok {
				return nil
			}
			var size int64
			if r, err := parseRecord(entries.Get(id)); err == nil {
				size = int64(len(r.env))
				ob.lowerDue(r.deadline)
			} else {
				ob.lowerDue(math.MinInt64) // each pass reports it
			}
			ob.cmu.Lock()
			ob.add(dev, 1, size)
			ob.cmu.Unlock()
			return nil
		})
	}
	if o.ReadOnly {
		err = db.View(count)
	} else {
		err = db.Update(func(tx *bbolt.Tx) error {
			for _, name := range [][]byte{entriesBucket, queueBucket, doneBucket, seqBucket} {
				if _, err := tx.CreateBucketIfNotExists(name); err != nil {
					return err
				}
			}
			return count(tx)
		})
	}
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("offline: init %s: %w", path, err)
	}
	return ob, nil
}

func openErr(path string, o *Options, err error) error {
	switch {
	case errors.Is(err, bberrors.ErrTimeout) && o.ReadOnly:
		return fmt.Errorf("%w: %s: no shared lock within %v; while the agent runs, ask the agent instead of reading its file: %w",
			ErrLocked, path, o.Timeout, err)
	case errors.Is(err, bberrors.ErrTimeout):
		return fmt.Errorf("%w: %s not free after %v: %w", ErrLocked, path, o.Timeout, err)
	case errors.Is(err, bberrors.ErrInvalid), errors.Is(err, bberrors.ErrChecksum), errors.Is(err, bberrors.ErrVersionMismatch):
		return fmt.Errorf("%w: %s: %w", ErrCorrupt, path, err)
	}
	return fmt.Errorf("offline: open %s: %w", path, err)
}

// Close closes the file. It waits for operations in progress.
func (ob *Outbox) Close() error {
	err := ob.close()
	ob.flushers.Wait() // a flushSoon waiting for mu sees closed and ends
	return err
}

// close is Close but for its wait for flushSoon.
func (ob *Outbox) close() error {
	ob.mu.Lock()
	defer ob.mu.Unlock()
	if ob.closed {
		return nil
	}
	ob.closed = true
	// The verdicts still waiting (ResolveLater): a clean shutdown leaves
	// none of them pending. No group is in progress (each holds mu.RLock).
	ob.group.CommitRiders()
	ob.lmu.Lock()
	if ob.timer != nil {
		ob.timer.Stop()
	}
	ob.lmu.Unlock()
	return ob.db.Close()
}

// Path returns the file's path.
func (ob *Outbox) Path() string { return ob.path }

// add counts n entries of bytes for dev (cmu held).
func (ob *Outbox) add(dev string, n int, bytes int64) {
	u := ob.devs[dev]
	u.n += n
	u.bytes += bytes
	if u.n <= 0 {
		delete(ob.devs, dev)
	} else {
		ob.devs[dev] = u
	}
	ob.total.n += n
	ob.total.bytes += bytes
}

// update runs fn in a write transaction with the outbox locked for writing.
func (ob *Outbox) update(fn func(tx *bbolt.Tx) error) error {
	switch {
	case ob.closed:
		return ErrClosed
	case ob.opts.ReadOnly:
		return ErrReadOnly
	}
	return ob.observedUpdate(fn)
}

// observedUpdate is db.Update, timed for ObserveCommits.
func (ob *Outbox) observedUpdate(fn func(tx *bbolt.Tx) error) error {
	obs := ob.commits.Load()
	if obs == nil {
		return ob.db.Update(fn)
	}
	return ob.db.Update(func(tx *bbolt.Tx) error {
		tx.OnCommit(func() {
			st := tx.Stats()
			(*obs)(st.GetWriteTime())
		})
		return fn(tx)
	})
}

// ReadOnly reports whether the outbox was opened with Options.ReadOnly.
func (ob *Outbox) ReadOnly() bool { return ob.opts.ReadOnly }

// Append stores e as the newest pending entry of its device, durably (the
// commit is fsynced) before it returns. It sets e.Raw, e.Created (if zero),
// e.Deadline and e.Pos. If a limit would be exceeded it returns an error
// wrapping ErrFull and appends nothing; an id already in the outbox gives
// ErrExists. Concurrent appends (and resolves) share commits: one fsync
// for a group (internal/groupcommit), each call returning once its own
// entry is durable.
func (ob *Outbox) Append(ctx context.Context, e *Entry) error {
	return ob.AppendAll(ctx, []*Entry{e})
}

// AppendAll is Append of several entries in one commit, all or none, in
// order (entries of one device take consecutive queue positions): a
// caller that has several commands for a device (a firmware download's
// chunks) pays one fsync for them. An error appends none of them.
func (ob *Outbox) AppendAll(ctx context.Context, es []*Entry) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(es) == 0 {
		return nil
	}
	first := es[0].Envelope.ID
	if ob.opts.ReadOnly {
		return fmt.Errorf("offline: append %s: %w", first, ErrReadOnly)
	}
	recs := make([]record, len(es))
	for i, e := range es {
		raw, err := fence.MarshalEnvelope(&e.Envelope)
		if err != nil {
			return fmt.Errorf("offline: append: %w", err)
		}
		recs[i].env = raw
	}
	// The read lock keeps Close out, and only Close out: concurrent
	// appends and resolves join one group commit.
	ob.mu.RLock()
	defer ob.mu.RUnlock()
	if ob.closed {
		return fmt.Errorf("offline: append %s: %w", first, ErrClosed)
	}
	if err := ob.reserveAll(es, recs); err != nil {
		return err
	}
	var refused error // refused before any write: the group goes on
	err := ob.group.Commit(func(tx *bbolt.Tx) error {
		refused = nil
		ids := make(map[string]bool, len(es))
		for _, e := range es {
			id := e.Envelope.ID
			if ids[id] || tx.Bucket(entriesBucket).Get([]byte(id)) != nil {
				refused = fmt.Errorf("%s: %w", id, ErrExists)
				return nil
			}
			ids[id] = true
			if _, err := nextPos(tx, e.Envelope.Device); err != nil {
				refused = err
				return nil
			}
		}
		for i, e := range es {
			if err := putEntry(tx, e, &recs[i]); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil {
		err = refused
	}
	if err != nil {
		ob.unreserve(es, recs)
		return fmt.Errorf("offline: append %s: %w", first, err)
	}
	for i, e := range es {
		r := &recs[i]
		e.Raw, e.Created, e.Deadline, e.Pos = r.env, time.UnixMilli(r.created), time.UnixMilli(r.deadline), r.pos
	}
	return nil
}

// reserveAll dates the records and counts the entries against the
// limits, all or none (ErrFull).
func (ob *Outbox) reserveAll(es []*Entry, recs []record) error {
	ob.cmu.Lock()
	defer ob.cmu.Unlock()
	now := ob.opts.Now()
	for i, e := range es {
		created := e.Created
		if created.IsZero() {
			created = now
		}
		ttl := e.TTL
		if ttl <= 0 {
			ttl = ob.opts.TTL
		}
		recs[i].created, recs[i].deadline = created.UnixMilli(), created.Add(ttl).UnixMilli()
		ob.lowerDue(recs[i].deadline) // before the commit: no pass can miss it
		if err := ob.reserveLocked(e.Envelope.Device, e.Envelope.ID, int64(len(recs[i].env))); err != nil {
			for j := range i {
				ob.add(es[j].Envelope.Device, -1, -int64(len(recs[j].env)))
			}
			return err
		}
	}
	return nil
}

// unreserve takes back what reserveAll counted.
func (ob *Outbox) unreserve(es []*Entry, recs []record) {
	ob.cmu.Lock()
	defer ob.cmu.Unlock()
	for i, e := range es {
		ob.add(e.Envelope.Device, -1, -int64(len(recs[i].env)))
	}
}

// nextPos is the queue position dev's next entry takes in tx.
func nextPos(tx *bbolt.Tx, dev string) (uint64, error) {
	v := tx.Bucket(seqBucket).Get([]byte(dev))
	if v == nil {
		return 1, nil
	}
	if len(v) != 8 {
		return 0, corruptf("queue position of device %s", dev)
	}
	return binary.BigEndian.Uint64(v) + 1, nil
}

// putEntry stores e (its record r, pos set here) as the newest pending
// entry of its device in tx.
func putEntry(tx *bbolt.Tx, e *Entry, r *record) error {
	dev, id := e.Envelope.Device, e.Envelope.ID
	pos, err := nextPos(tx, dev)
	if err != nil {
		return err
	}
	r.pos = pos
	if err := tx.Bucket(seqBucket).Put([]byte(dev), binary.BigEndian.AppendUint64(nil, pos)); err != nil {
		return err
	}
	if err := tx.Bucket(queueBucket).Put(queueKey(dev, pos), []byte(id)); err != nil {
		return err
	}
	if err := raiseIssued(tx, &e.Envelope); err != nil {
		return err
	}
	return tx.Bucket(entriesBucket).Put([]byte(id), r.encode())
}

// reserveLocked counts an entry of size bytes for dev against the limits
// (ob.cmu held), or returns an error wrapping ErrFull and counts nothing.
func (ob *Outbox) reserveLocked(dev, id string, size int64) error {
	var err error
	u := ob.devs[dev]
	switch {
	case u.n+1 > ob.opts.MaxPerDevice:
		err = fmt.Errorf("%d pending entries for device %s, limit %d", u.n, dev, ob.opts.MaxPerDevice)
	case u.bytes+size > ob.opts.MaxBytesPerDevice:
		err = fmt.Errorf("%d pending bytes for device %s, +%d over limit %d", u.bytes, dev, size, ob.opts.MaxBytesPerDevice)
	case ob.total.n+1 > ob.opts.MaxTotal:
		err = fmt.Errorf("%d pending entries, limit %d", ob.total.n, ob.opts.MaxTotal)
	case ob.total.bytes+size > ob.opts.MaxTotalBytes:
		err = fmt.Errorf("%d pending bytes, +%d over limit %d", ob.total.bytes, size, ob.opts.MaxTotalBytes)
	}
	if err != nil {
		ob.refused++
		if ob.opts.Logger != nil {
			ob.opts.Logger.Warn("outbox full: append refused", "device", dev, "id", id, "reason", err.Error())
		}
		return fmt.Errorf("offline: append %s: %w: %v", id, ErrFull, err)
	}
	// The entry counts against the limits from here; Append's commit
	// runs under the read lock only (which keeps Close out), so that
	// readers (Next, Pending), Resolve and other Appends are not held up
	// by its fsync: the other Appends join its group or the next.
	ob.add(dev, 1, size)
	return nil
}

// Next returns the oldest pending entry of device; ok is false if it has
// none. An unreadable record is an error wrapping ErrCorrupt: the device's
// queue stops there (fail closed) rather than skip a command.
func (ob *Outbox) Next(device string) (e *Entry, ok bool, err error) {
	return ob.NextAfter(device, 0)
}

// NextAfter is Next of the entries behind the one at queue position pos
// (Entry.Pos): the oldest pending entry of device with a greater Pos. A
// delivery worker uses it to send the next command while the verdict of
// the one at pos is still being recorded (Resolve). Entries whose verdict
// waits for its commit (ResolveLater) have ended: they are skipped.
func (ob *Outbox) NextAfter(device string, pos uint64) (e *Entry, ok bool, err error) {
	err = ob.view(func(tx *bbolt.Tx) error {
		queue := tx.Bucket(queueBucket)
		if queue == nil {
			return nil // read-only and never initialized
		}
		prefix := queuePrefix(device)
		c := queue.Cursor()
		k, id := c.Seek(queueKey(device, pos+1))
		for k != nil && ob.waitingVerdict(id) != nil { // ended; its record waits for a commit
			k, id = c.Next()
		}
		if k == nil || len(k) != len(prefix)+8 || string(k[:len(prefix)]) != string(prefix) {
			return nil
		}
		r, err := getRecord(tx, id)
		if err != nil {
			return err
		}
		env, err := fence.UnmarshalEnvelope(r.env)
		if err != nil {
			return corruptf("envelope of %s: %v", id, err)
		}
		ok = true
		e = &Entry{Envelope: *env, Raw: append([]byte(nil), r.env...), Created: time.UnixMilli(r.created),
			Deadline: time.UnixMilli(r.deadline), TTL: time.Duration(r.deadline-r.created) * time.Millisecond, Pos: r.pos}
		return nil
	})
	if err != nil {
		return nil, false, fmt.Errorf("offline: next of %s: %w", device, err)
	}
	return e, ok, nil
}

// Resolve records ack as the terminal state of the entry with command id
// id, durably. The ack's verdict must be one a fence point gives (accepted,
// duplicate, stale or invalid; expired is ExpireDue's) and its id, if set,
// must be id. An entry has exactly one terminal state: resolving it again
// returns an error wrapping ErrResolved and changes nothing. Concurrent
// calls (several devices' acks) share commits: one fsync for a group
// (internal/groupcommit), each call returning once its own is durable.
func (ob *Outbox) Resolve(id string, ack *fence.Ack) error {
	if ob.opts.ReadOnly {
		return fmt.Errorf("offline: resolve %s: %w", id, ErrReadOnly)
	}
	if ack != nil && ack.ID == "" {
		c := *ack
		c.ID = id
		ack = &c
	}
	if ack == nil || ack.ID != id {
		return fmt.Errorf("offline: resolve %s: %w: ack does not resolve this command", id, fence.ErrInvalid)
	}
	return ob.ResolveAll([]*fence.Ack{ack})[0]
}

// ResolveAll is Resolve of several acks, each of the command its ID
// names, in one commit: a device's worker records the verdicts of the
// commands it delivered meanwhile for one fsync. Each ack gets its own
// error, as from Resolve; one refused does not stop the others.
func (ob *Outbox) ResolveAll(acks []*fence.Ack) []error {
	errs := make([]error, len(acks))
	if ob.opts.ReadOnly {
		for i, a := range acks {
			errs[i] = fmt.Errorf("offline: resolve %s: %w", ackID(a), ErrReadOnly)
		}
		return errs
	}
	ops := make([]resolveOp, len(acks))
	calls := make([]groupcommit.Call, 0, len(acks))
	now := ob.opts.Now().UnixMilli()
	ob.lmu.RLock()
	for i, a := range acks {
		op := &ops[i]
		if op.err = op.prepare(a); op.err == nil && ob.waitingVerdict([]byte(op.id)) != nil {
			op.err = fmt.Errorf("%w (not yet recorded)", ErrResolved)
		}
		if op.err == nil {
			calls = append(calls, op.call(now))
		}
	}
	ob.lmu.RUnlock()
	// A read lock keeps Close out; the commit is shared with concurrent
	// Append, Resolve and SetHeld calls (group commit).
	ob.mu.RLock()
	if ob.closed {
		ob.mu.RUnlock()
		for i, a := range acks {
			errs[i] = fmt.Errorf("offline: resolve %s: %w", ackID(a), ErrClosed)
		}
		return errs
	}
	defer ob.mu.RUnlock()
	var cerrs []error
	if len(calls) > 0 {
		cerrs = ob.group.CommitMany(calls)
	}
	ob.cmu.Lock()
	defer ob.cmu.Unlock()
	for i, a := range acks {
		op := &ops[i]
		if op.err == nil {
			if err := cerrs[0]; err != nil {
				op.err = err
			} else {
				op.err = op.refused
			}
			cerrs = cerrs[1:]
		}
		if op.err != nil {
			errs[i] = fmt.Errorf("offline: resolve %s: %w", ackID(a), op.err)
			continue
		}
		ob.add(op.dev, -1, -op.size)
		ob.ended.Add(1)
	}
	return errs
}

func ackID(a *fence.Ack) string {
	if a == nil {
		return ""
	}
	return a.ID
}

// resolveOp is one ack of ResolveAll.
type resolveOp struct {
	id      string
	ack     *fence.Ack
	raw     []byte
	dev     string
	size    int64
	refused error // refused before terminate changed anything: the group goes on
	err     error
}

// prepare checks and encodes the ack.
func (op *resolveOp) prepare(a *fence.Ack) error {
	if a == nil || a.ID == "" || a.Verdict == fence.Expired {
		return fmt.Errorf("%w: ack does not resolve this command", fence.ErrInvalid)
	}
	raw, err := fence.MarshalAck(a)
	if err != nil {
		return err
	}
	op.id, op.ack, op.raw = a.ID, a, raw
	return nil
}

// call is op's write, for the group committer: it may run more than once.
func (op *resolveOp) call(now int64) groupcommit.Call {
	return func(tx *bbolt.Tx) error {
		var err error
		op.dev, op.size, err = terminate(tx, op.id, op.ack.Device, op.ack.Verdict, op.raw, now)
		op.refused = nil
		switch {
		case err == nil:
		case errors.Is(err, ErrNotFound), errors.Is(err, ErrResolved), errors.Is(err, ErrCorrupt), errors.Is(err, fence.ErrInvalid):
			op.refused, op.dev, op.size = err, "", 0
		default:
			return err // a write failed: the group is rolled back and rerun call by call
		}
		return nil
	}
}

// terminate gives the pending entry id its terminal state v in tx, and
// drops its envelope's body if larger than KeepBodyMax (dropBody). It
// returns the entry's device and the size of the envelope it had pending.
// ackDev, if set, must be the entry's device.
func terminate(tx *bbolt.Tx, id, ackDev string, v fence.Verdict, ack []byte, now int64) (string, int64, error) {
	r, err := getRecord(tx, []byte(id))
	if err != nil {
		return "", 0, err
	}
	env, err := fence.UnmarshalEnvelope(r.env)
	if err != nil {
		return "", 0, corruptf("envelope of %s: %v", id, err)
	}
	if ackDev != "" && ackDev != env.Device {
		return "", 0, fmt.Errorf("%w: ack from device %s for a command to %s", fence.ErrInvalid, ackDev, env.Device)
	}
	if r.state != 0 {
		return "", 0, fmt.Errorf("%w: %v", ErrResolved, r.state)
	}
	if now <= 0 {
		now = 1 // resolved 0 means pending
	}
	size := int64(len(r.env))
	r.state, r.resolved, r.ack = v, now, ack
	if !dropBody(&r, env) {
		r.env = append([]byte(nil), r.env...) // it aliases the page we overwrite
	}
	if err := tx.Bucket(queueBucket).Delete(queueKey(env.Device, r.pos)); err != nil {
		return "", 0, err
	}
	if err := tx.Bucket(doneBucket).Put(doneKey(r.resolved, id), nil); err != nil {
		return "", 0, err
	}
	if err := putTerminal(tx.Bucket(entriesBucket), []byte(id), &r); err != nil {
		return "", 0, err
	}
	return env.Device, size, nil
}

// ExpireDue ends every pending entry whose deadline has passed as
// fence.Expired, durably, in one transaction, and returns how many it
// ended; the caller logs and counts them. Unreadable records are left
// pending and reported in the error, together with the count of the rest.
// ExpireEntries does the same and returns the entries.
func (ob *Outbox) ExpireDue() (n int, err error) {
	ended, err := ob.ExpireEntries(nil)
	return len(ended), err
}

// Compact deletes the terminal entries resolved at least Retention ago
// and, while more than MaxEnded terminal entries are kept, the oldest of
// them, and returns how many it deleted. Pending entries are never
// deleted. It deletes compactBatch (10,000) entries a transaction and lets
// appends and resolves in between, so that a backlog does not hold them
// back behind one long commit.
func (ob *Outbox) Compact() (n int, err error) {
	if ob.opts.ReadOnly {
		return 0, fmt.Errorf("offline: compact: %w", ErrReadOnly)
	}
	for {
		entries, keys, err := ob.compactOnce()
		n += entries
		if err != nil || keys < ob.compactBatch() {
			return n, err
		}
	}
}

// compactOnce is one transaction of Compact: it deletes up to
// compactBatch done keys and their entries, and returns how many entries
// and keys.
func (ob *Outbox) compactOnce() (n, keys int, err error) {
	ob.mu.Lock()
	defer ob.mu.Unlock()
	cutoff := ob.opts.Now().Add(-ob.opts.Retention).UnixMilli()
	kept := int64(-1) // the exact count after, if counted
	err = ob.update(func(tx *bbolt.Tx) error {
		n, keys, kept = 0, 0, -1
		doneB, entries := tx.Bucket(doneBucket), tx.Bucket(entriesBucket)
		var excess int64
		if ob.ended.Load() > int64(ob.opts.MaxEnded) {
			total := int64(doneB.Stats().KeyN)
			excess, kept = total-int64(ob.opts.MaxEnded), total
		}
		var del [][]byte
		c := doneB.Cursor()
		for k, _ := c.First(); k != nil && len(del) < ob.compactBatch(); k, _ = c.Next() {
			old := len(k) >= 8 && int64(binary.BigEndian.Uint64(k)) <= cutoff
			if !old && excess <= 0 {
				break
			}
			excess--
			del = append(del, append([]byte(nil), k...))
		}
		for _, k := range del {
			if len(k) >= 8 { // a shorter key names no entry: only it goes
				id := k[8:]
				if r, err := parseRecord(entries.Get(id)); err == nil && r.state != 0 {
					if err := entries.Delete(id); err != nil {
						return err
					}
					n++
				}
			}
			if err := doneB.Delete(k); err != nil {
				return err
			}
		}
		keys = len(del)
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("offline: compact: %w", err)
	}
	if kept >= 0 {
		ob.ended.Store(kept - int64(keys))
	} else {
		ob.ended.Add(-int64(keys))
	}
	return n, keys, nil
}

// compactBatch is how many done keys one transaction of Compact deletes
// at most.
func (ob *Outbox) compactBatch() int {
	if ob.batchForTest > 0 {
		return ob.batchForTest
	}
	return 10_000
}

// Ended returns how many terminal entries the outbox keeps (exact after
// Open and Compact; in between it may count high, see Outbox.ended).
func (ob *Outbox) Ended() int64 { return max(ob.ended.Load(), 0) }

// EndedOver reports whether more terminal entries are kept than
// MaxEnded: a Compact is due before the Retention's.
func (ob *Outbox) EndedOver() bool { return ob.ended.Load() > int64(ob.opts.MaxEnded) }

// view runs fn in a read transaction, with the deferred verdicts
// (ob.later) read-locked: fn sees each of them either waiting or, once
// committed, in the file.
func (ob *Outbox) view(fn func(tx *bbolt.Tx) error) error {
	ob.mu.RLock()
	defer ob.mu.RUnlock()
	if ob.closed {
		return ErrClosed
	}
	ob.lmu.RLock()
	defer ob.lmu.RUnlock()
	return ob.db.View(fn)
}

// getRecord reads the record of id; ErrNotFound if there is none.
func getRecord(tx *bbolt.Tx, id []byte) (record, error) {
	var v []byte
	if b := tx.Bucket(entriesBucket); b != nil {
		v = b.Get(id)
	}
	if v == nil {
		return record{}, ErrNotFound
	}
	r, err := parseRecord(v)
	if err != nil {
		return record{}, fmt.Errorf("%w (id %s)", err, id)
	}
	return r, nil
}
