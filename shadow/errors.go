package shadow

import (
	"errors"
	"fmt"
)

// Sentinel errors. Callers test them with errors.Is.
var (
	// ErrInvalid means a document, patch, device id or argument was
	// malformed: not a JSON object, invalid JSON or CBOR, an unsupported
	// value type, a non-finite number. ErrTooLarge and ErrTooDeep errors
	// wrap it too, so errors.Is(err, ErrInvalid) catches every bad input.
	ErrInvalid = errors.New("shadow: invalid document")
	// ErrTooLarge means an encoded document or patch exceeds Limits.MaxSize.
	ErrTooLarge = errors.New("shadow: document too large")
	// ErrTooDeep means a document or patch nests objects and arrays deeper
	// than Limits.MaxDepth.
	ErrTooDeep = errors.New("shadow: document too deeply nested")
	// ErrUnknownDevice means StoreConfig.KnownDevice refused the device.
	ErrUnknownDevice = errors.New("shadow: unknown device")
	// ErrConflict means an optimistic write lost: the version read is no
	// longer current. The *ConflictError carrying it has the current
	// version; read again, merge, retry.
	ErrConflict = errors.New("shadow: version conflict")
	// ErrFenced means a reported write was refused by etcd because the
	// writer's lock key no longer exists with CreateRevision == token: it
	// is no longer the holder (invariant I5). Nothing was written; the
	// controller must stop. It is never retried.
	ErrFenced = errors.New("shadow: fenced: no longer the holder")
	// ErrClosed means the Cache was closed.
	ErrClosed = errors.New("shadow: cache closed")
)

// ConflictError is the typed form of ErrConflict: the write expected the
// key at version Want, etcd had it at Current (0: the key does not exist).
// Attempts is set when a retrying update (UpdateDesiredAny,
// UpdateReported) gave up after that many conflicts in a row.
type ConflictError struct {
	Device   string
	Key      string
	Want     int64
	Current  int64
	Attempts int
}

func (e *ConflictError) Error() string {
	if e.Attempts > 0 {
		return fmt.Sprintf("shadow: version conflict on %s: other writers won %d times in a row (current version %d)", e.Key, e.Attempts, e.Current)
	}
	return fmt.Sprintf("shadow: version conflict on %s: wanted version %d, current %d", e.Key, e.Want, e.Current)
}

// Unwrap makes errors.Is(err, ErrConflict) true.
func (e *ConflictError) Unwrap() error { return ErrConflict }

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}
