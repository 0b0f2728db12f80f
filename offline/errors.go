package offline

import "errors"

// Errors of the outbox. Callers test them with errors.Is.
var (
	// ErrLocked means another process (normally a second agent on the same
	// gateway) holds the outbox file and it did not come free within
	// Options.Timeout.
	ErrLocked = errors.New("offline: another process holds the outbox")
	// ErrFull means an Append would exceed one of the outbox limits. Nothing
	// was appended: the caller must hold the command back (backpressure),
	// never drop it silently.
	ErrFull = errors.New("offline: outbox full")
	// ErrExists means an entry with the same command id is in the outbox.
	ErrExists = errors.New("offline: command id already in the outbox")
	// ErrNotFound means no entry has the command id (it never existed, or
	// it was compacted after its retention).
	ErrNotFound = errors.New("offline: no such entry")
	// ErrResolved means the entry already has its terminal state; the
	// outbox changed nothing.
	ErrResolved = errors.New("offline: entry already has a terminal state")
	// ErrCorrupt means a stored record is not readable. The outbox fails
	// closed: the entry is not delivered, resolved or expired until an
	// operator repairs it.
	ErrCorrupt = errors.New("offline: outbox record corrupt")
	// ErrReadOnly means a write was asked of an Outbox opened with
	// Options.ReadOnly; nothing was written.
	ErrReadOnly = errors.New("offline: outbox opened read-only")
	// ErrAmbiguous means an id prefix (Find) matches more than one entry.
	ErrAmbiguous = errors.New("offline: id prefix matches several entries")
	// ErrClosed means the Outbox was closed.
	ErrClosed = errors.New("offline: outbox closed")
)
