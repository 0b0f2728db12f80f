//go:build !linux

package serial

import (
	"errors"
	"io/fs"
)

// portLock does nothing outside Linux: no lock, no hangup detection.
type portLock struct{ path string }

func lockPort(path string) (*portLock, error) { return &portLock{path: path}, nil }

func (l *portLock) name() string  { return l.path }
func (l *portLock) hungUp() error { return nil }
func (l *portLock) close()        {}
func isMissing(err error) bool    { return errors.Is(err, fs.ErrNotExist) }
