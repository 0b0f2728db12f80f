package fence

import (
	"errors"
	"fmt"
)

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
	// ErrEpochClosed means the command was issued in an epoch below the
	// fence point's for the device (AdmitEpoch): before a reset or a fleet
	// epoch statement. It wraps ErrStale.
	ErrEpochClosed error = &kindError{"fence: epoch closed", ErrStale}
	// ErrUnknownEpoch means the command names an epoch above the fence
	// point's for the device: the fence point has not received that
	// epoch's statement (a trust update brings it). It wraps ErrInvalid.
	ErrUnknownEpoch error = &kindError{"fence: unknown epoch", ErrInvalid}
)

// kindError is a sentinel that is also a kind of another one.
type kindError struct {
	msg  string
	kind error
}

func (e *kindError) Error() string { return e.msg }
func (e *kindError) Unwrap() error { return e.kind }

// ReasonUnknownEpoch starts the reason of an ack refusing a command whose
// epoch the fence point does not know (EpochError).
const ReasonUnknownEpoch = "unknown epoch "

// EpochError is AdmitEpoch's refusal of a command by its epoch. It wraps
// ErrEpochClosed (Command below FencePoint) or ErrUnknownEpoch (above).
// Its text is the ack's reason, worded alike by every fence point (the C
// library byte for byte):
//
//	epoch <Command> closed: the fence point is at epoch <FencePoint>
//	unknown epoch <Command>: the fence point is at epoch <FencePoint>
type EpochError struct {
	Command    uint64 // the command's epoch
	FencePoint uint64 // the fence point's epoch for the device
}

func (e *EpochError) Error() string {
	if e.Command < e.FencePoint {
		return fmt.Sprintf("epoch %d closed: the fence point is at epoch %d", e.Command, e.FencePoint)
	}
	return fmt.Sprintf("%s%d: the fence point is at epoch %d", ReasonUnknownEpoch, e.Command, e.FencePoint)
}

// Unwrap returns ErrEpochClosed or ErrUnknownEpoch.
func (e *EpochError) Unwrap() error {
	if e.Command < e.FencePoint {
		return ErrEpochClosed
	}
	return ErrUnknownEpoch
}
