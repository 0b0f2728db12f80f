package shim

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/bbolt"
	bberrors "go.etcd.io/bbolt/errors"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/fence/history"
)

// DefaultLockTimeout is how long Open waits for the database file lock.
const DefaultLockTimeout = time.Second

// marksBucket holds one Record per device id.
var marksBucket = []byte("shim.marks")

// Options configure a Shim. A nil *Options means the defaults.
type Options struct {
	// PersistOnTokenChangeOnly saves flash on devices whose commands are all
	// idempotent. A command that raises the token is still committed with
	// fsync before it takes effect (the token is always durable first), but
	// a command that only advances the seq under the current token is
	// admitted against an in-memory mark and not written at all; the
	// in-memory seqs are written on Close.
	//
	// The trade-off: after a crash or power loss the device comes back with
	// the last durable seq of its current token, so a redelivered command of
	// that same token may be applied a second time (a same-token duplicate).
	// Stale tokens are still refused, exactly as without the option.
	//
	// It has no effect for devices that implement TxApplier: their effect
	// is committed in a write transaction anyway, and the mark rides along
	// for free.
	PersistOnTokenChangeOnly bool

	// LockTimeout bounds the wait for the database file lock; zero means
	// DefaultLockTimeout. A second process opening the same file gets an
	// error wrapping ErrLocked instead of hanging.
	LockTimeout time.Duration

	// Logger receives the shim's log lines; nil means none.
	Logger *slog.Logger

	// History, if not nil, gets one history.OpVerdict event per decision
	// (device, id, token, seq, kind, verdict, reason), in decision order,
	// for history.Check. The shim does not close it.
	//
	// An accept is recorded before the commit that makes it durable (inside
	// the write transaction, after the decision and the TxApplier's effect),
	// so a kill after the commit cannot lose it. A kill between the line and
	// the commit leaves an accept that never took effect; Open therefore
	// calls History.Recover, which records a history.OpOpened event with
	// the durable mark for each device that has such accepts, and the
	// checker discards them. A failed commit does the same at once. When
	// Apply fails after the commit (the command is consumed, the ack says
	// invalid) the decision has two lines: accepted, then invalid.
	//
	// Use one History (one source name) per database file, kept across
	// restarts. The history is a record of decisions, not part of them: a
	// write error is logged and the decision stands. With
	// PersistOnTokenChangeOnly only tokens are durable, so only accepts
	// above the durable token are discarded after a crash.
	History *history.Writer
	// HistoryNote, if set, adds what the device knows about a command to
	// its History event before it is written (fwjob.NoteHistory: the job
	// and image of a firmware step). It must not block.
	HistoryNote func(env *fence.Envelope, e *history.Event)

	// Keys, if set, makes the shim accept only signed envelopes (invariant
	// I7, fence/auth): a command must be a COSE_Sign1 by a key Keys
	// accepts for the device (certified by the operator, not revoked,
	// valid now; auth.Trust). Anything else — unsigned, a bad signature,
	// an unknown, revoked or unauthorised key — is refused invalid before
	// the admit rule, the mark unchanged, counted in
	// Stats.Unauthenticated and logged. nil: unsigned envelopes, as before.
	//
	// When Keys is an *auth.Trust the shim also learns trust updates (a
	// command payload starting 0x81–0x88, auth.ParseUpdate): certificates,
	// revocation lists and epoch statements signed by the root, each newer
	// one committed with fsync before it takes effect, replayed into the
	// Trust at Open (trust.go). The epoch statement's epoch is then every
	// device's lowest epoch here (fence.AdmitEpoch, State).
	Keys auth.Keys

	// Root, if set, lets the operator reset a device's mark with a reset
	// statement signed by the root key (fence/auth; reset.go), whether or
	// not commands must be signed: a device of the unsigned era needs
	// only this for the way back from a forged mark. nil: Keys, if it is
	// an *auth.Trust; neither: every reset is refused.
	Root auth.ResetVerifier
}

// Shim is a fence point backed by one bbolt file. Its methods are safe for
// concurrent use; decisions are serialized.
type Shim struct {
	db   *bbolt.DB
	path string
	opts Options
	log  *slog.Logger

	mu      sync.Mutex // serializes decisions, apply calls and Close
	closed  bool
	pending map[string]Record // PersistOnTokenChangeOnly: seq advances not yet written
	ledger  *auth.Ledger      // trust updates, when Keys is an *auth.Trust (trust.go)
	signer  string            // key id of the command being decided, once verified (for its history event)
	listed  uint64            // version of the revocation list last recorded in the history (OpTrust)

	stats struct {
		accepted, duplicate, stale, invalid     atomic.Uint64
		applyFailed, storage, deferred, corrupt atomic.Uint64
		unauth                                  atomic.Uint64
		trust                                   auth.LearnedCounters
		resets, resetsRefused                   atomic.Uint64
	}
}

// Open opens (creating if needed) the fence point's database at path. The
// directory must exist.
func Open(path string, opts *Options) (*Shim, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.LockTimeout <= 0 {
		o.LockTimeout = DefaultLockTimeout
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: o.LockTimeout})
	if err != nil {
		if errors.Is(err, bberrors.ErrTimeout) {
			return nil, fmt.Errorf("%w: %s held by another process for %v: %w", ErrLocked, path, o.LockTimeout, err)
		}
		return nil, fmt.Errorf("shim: open %s: %w", path, err)
	}
	if err := db.Update(func(tx *bbolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(marksBucket)
		return err
	}); err != nil {
		db.Close()
		return nil, fmt.Errorf("shim: init %s: %w", path, err)
	}
	s := &Shim{db: db, path: path, opts: o, log: log, pending: make(map[string]Record)}
	if err := s.openLedger(); err != nil {
		db.Close()
		return nil, fmt.Errorf("shim: %s: %w", path, err)
	}
	// Before any decision: say which recorded accepts never became durable.
	s.recordDurable()
	if o.PersistOnTokenChangeOnly {
		log.Info("fence point persists seq advances lazily; same-token duplicates may be re-applied after a crash",
			"path", path)
	}
	return s, nil
}

// Close writes any in-memory seq advances (PersistOnTokenChangeOnly) with
// fsync and closes the database. Calling Close again returns nil.
func (s *Shim) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	var flushErr error
	if len(s.pending) > 0 {
		flushErr = s.db.Update(func(tx *bbolt.Tx) error {
			b := tx.Bucket(marksBucket)
			for dev, r := range s.pending {
				if err := putRecord(b, dev, r); err != nil {
					return err
				}
			}
			return nil
		})
		if flushErr != nil {
			flushErr = fmt.Errorf("shim: flush marks: %w", flushErr)
		}
		clear(s.pending)
	}
	return errors.Join(flushErr, s.db.Close())
}

// Path returns the database file's path.
func (s *Shim) Path() string { return s.path }

// Mark returns the device's current high-water mark in its epoch (the zero
// Mark if it has accepted no command in it; see State). With
// PersistOnTokenChangeOnly it may be ahead of what is on disk.
func (s *Shim) Mark(device string) (fence.Mark, error) {
	st, err := s.State(device)
	return st.Mark, err
}

// State returns the device's epoch and its mark in that epoch
// (fence.State.At): the epoch is the highest of the fleet epoch the shim's
// trust holds (Options.Keys an *auth.Trust), the device's last reset's and
// its stored mark's.
func (s *Shim) State(device string) (fence.State, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fence.State{}, ErrClosed
	}
	r, _, e, err := s.current(device)
	return r.State().At(e), err
}

// Record returns the device's stored mark with its epoch, when and by whom
// it was set (a mark of an epoch below the device's counts as none: State).
func (s *Shim) Record(device string) (Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return Record{}, ErrClosed
	}
	r, _, _, err := s.current(device)
	return r, err
}

// View runs fn in a read-only transaction on the shim's database, for
// devices (TxApplier) to read the state they write.
func (s *Shim) View(fn func(tx *bbolt.Tx) error) error {
	err := s.db.View(fn)
	if errors.Is(err, bberrors.ErrDatabaseNotOpen) {
		return ErrClosed
	}
	return err
}

// Update runs fn in a write transaction on the shim's database, committed
// with fsync, for TxApplier devices whose state also moves without a
// command (a firmware install that the device finishes after the command
// that started it: devices/fwjob). fn must keep to buckets of its own, as
// ApplyTx does; it cannot move a mark. It runs between decisions, never
// inside one.
func (s *Shim) Update(fn func(tx *bbolt.Tx) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	err := s.db.Update(fn)
	if errors.Is(err, bberrors.ErrDatabaseNotOpen) {
		return ErrClosed
	}
	return err
}

// Stats are the shim's counters since Open.
type Stats struct {
	Accepted  uint64 // commands that took effect
	Duplicate uint64
	Stale     uint64
	Invalid   uint64 // bad input, failed checks and failed effects: the bad-input metric

	ApplyFailed   uint64 // effects that failed (also counted in Invalid)
	StorageErrors uint64 // decisions refused because the marks could not be read or written (also in Invalid)
	CorruptMarks  uint64 // of those, refused because the device's mark record is corrupt (fence.ErrMarkRecordCorrupt)
	Deferred      uint64 // seq advances not fsynced (PersistOnTokenChangeOnly)
	// Unauthenticated counts commands refused by Options.Keys (also in
	// Invalid): unsigned, forged, or signed by a key not allowed here.
	Unauthenticated uint64
	// Trust updates (Options.Keys an *auth.Trust), per statement: taken
	// in (durable, then in effect), already held, refused (older than the
	// one held, not the root's, or in a malformed or forged update).
	TrustApplied, TrustHeld, TrustRefused uint64
	// Resets counts operator resets applied; ResetsRefused those refused
	// (also in Invalid): forged, replayed, for another device, no root.
	Resets, ResetsRefused uint64
}

// Stats returns a snapshot of the counters.
func (s *Shim) Stats() Stats {
	return Stats{
		Accepted:      s.stats.accepted.Load(),
		Duplicate:     s.stats.duplicate.Load(),
		Stale:         s.stats.stale.Load(),
		Invalid:       s.stats.invalid.Load(),
		ApplyFailed:   s.stats.applyFailed.Load(),
		StorageErrors: s.stats.storage.Load(),
		CorruptMarks:  s.stats.corrupt.Load(),
		Deferred:      s.stats.deferred.Load(),

		Unauthenticated: s.stats.unauth.Load(),
		TrustApplied:    s.stats.trust.Applied.Load(),
		TrustHeld:       s.stats.trust.Held.Load(),
		TrustRefused:    s.stats.trust.Refused.Load(),
		Resets:          s.stats.resets.Load(),
		ResetsRefused:   s.stats.resetsRefused.Load(),
	}
}

// current returns the live record for device (pending, else stored), the
// stored one, and the shim's own epoch for the device beyond its mark's: the
// higher of the fleet epoch (floor) and its last reset's. The device's state
// is live.State().At(e). Call with s.mu held.
func (s *Shim) current(device string) (live, stored Record, e uint64, err error) {
	err = s.db.View(func(tx *bbolt.Tx) error {
		if stored, err = getRecord(tx.Bucket(marksBucket), device); err != nil {
			return err
		}
		e, err = getResetEpoch(tx, device)
		return err
	})
	if err != nil {
		return Record{}, Record{}, 0, storageErr(err)
	}
	live = stored
	if p, ok := s.pending[device]; ok && fence.StateLess(stored.State(), p.State()) {
		live = p
	}
	return live, stored, max(e, s.floor()), nil
}

// floor is the fleet epoch the shim's trust holds (auth.Trust.Epoch): the
// lowest epoch of every device here, whose commands must be signed; 0
// without an epoch-keeping Keys.
func (s *Shim) floor() uint64 {
	if k, ok := s.opts.Keys.(interface{ Epoch() uint64 }); ok {
		return k.Epoch()
	}
	return 0
}

func storageErr(err error) error {
	if errors.Is(err, ErrStorage) {
		return err
	}
	if errors.Is(err, bberrors.ErrDatabaseNotOpen) {
		return ErrClosed
	}
	return fmt.Errorf("%w: %w", ErrStorage, err)
}
