//go:build !linux

package hrtimer

import "errors"

// errUnsupported means the system has no timerfd.
var errUnsupported = errors.New("hrtimer: no timerfd on this system")

func newTimerfd() (waiter, error) { return nil, errUnsupported }
