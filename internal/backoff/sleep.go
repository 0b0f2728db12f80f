package backoff

import (
	"context"
	"time"
)

// Sleep waits for d, or until ctx ends. It reports whether it waited the
// whole of d: false means ctx has ended (also if it had before the call).
func Sleep(ctx context.Context, d time.Duration) bool {
	if ctx.Err() != nil {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
