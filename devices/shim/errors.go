package shim

import "errors"

// Sentinel errors. Callers test them with errors.Is.
var (
	// ErrLocked means the database file is held by another process (or
	// another Shim in this process) and did not come free within
	// Options.LockTimeout.
	ErrLocked = errors.New("shim: database locked")
	// ErrClosed means the Shim was closed.
	ErrClosed = errors.New("shim: closed")
	// ErrStorage means the fence point could not read or write its marks.
	// Commands are refused (Invalid) while it persists: the shim fails
	// closed. A device's mark record that fails its checksum or does not
	// parse also wraps fence.ErrMarkRecordCorrupt; that device's commands
	// are refused until the record is repaired or removed, the other
	// devices are served.
	ErrStorage = errors.New("shim: storage")
)
