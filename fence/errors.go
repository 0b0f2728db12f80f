package fence

import "errors"

// Sentinel errors. Callers test them with errors.Is.
var (
	// ErrStale means the command's token is lower than the highest token the
	// fence point has accepted: a newer holder exists.
	ErrStale = errors.New("fence: stale token")
	// ErrDuplicate means the command (token, seq) was already applied; it was
	// acknowledged again but not re-applied.
	ErrDuplicate = errors.New("fence: duplicate command")
	// ErrInvalid means the envelope was malformed or failed validation.
	ErrInvalid = errors.New("fence: invalid envelope")
	// ErrExpired means the command outlived its time to live before it was
	// delivered.
	ErrExpired = errors.New("fence: command expired")
	// ErrUnknown means the command reached a device that cannot check
	// tokens and its fate is unknown: the device gave no answer, and the
	// command may not be repeated (see Unknown).
	ErrUnknown = errors.New("fence: fate unknown")
	// ErrTooLarge means an encoded envelope or ack exceeds its size limit.
	ErrTooLarge = errors.New("fence: message too large")
)
