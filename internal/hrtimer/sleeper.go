package hrtimer

import (
	"context"
	"sync"
	"time"
)

// sleeper waits on a time.Timer: Go's timers, late by up to a millisecond
// on Linux.
type sleeper struct {
	t      *time.Timer
	closed chan struct{}
	once   sync.Once
}

func newSleeper() *sleeper {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &sleeper{t: t, closed: make(chan struct{})}
}

func (s *sleeper) wait(ctx context.Context, d time.Duration) error {
	select {
	case <-s.closed:
		return ErrClosed
	default:
	}
	s.t.Reset(d) // since Go 1.23 no stale tick survives Reset or Stop
	defer s.t.Stop()
	select {
	case <-s.t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-s.closed:
		return ErrClosed
	}
}

func (s *sleeper) close() error {
	s.once.Do(func() { close(s.closed) })
	return nil
}
