package profile

import (
	"errors"

	"github.com/edgefence/edgefence/internal/keyerr"
)

// ErrProfile is what every problem in a profile wraps.
var ErrProfile = errors.New("modbus profile: invalid")

// Error is one problem in a profile: the file, the 1-based line (0 if
// unknown) and the dotted key it is about (fields[2].type). Load and Parse
// return them joined (errors.Join), in the order of the file.
type Error struct {
	File string
	Line int
	Key  string
	Msg  string
}

func (e *Error) Error() string { return keyerr.Format(e.File, e.Line, e.Key, e.Msg) }

// Unwrap makes errors.Is(err, ErrProfile) true.
func (e *Error) Unwrap() error { return ErrProfile }

// Errors returns the *Errors in err (joined or single), in order.
func Errors(err error) []*Error { return keyerr.All[*Error](err) }
