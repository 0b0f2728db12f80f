package mqtt

import (
	"math/rand/v2"
	"time"
)

// backoffDelay returns how long to wait before connection attempt number
// attempt (0-based, counted from the moment the connection was lost or the
// client started). The delay is drawn uniformly from [lo, hi] where
// hi = min(lo·2^(attempt+1), cap): exponential growth with full jitter above
// a floor, so a fleet of gateways does not reconnect in lockstep after a
// broker restart. randN(n) returns a value in [0, n).
func backoffDelay(attempt int, lo, hi time.Duration, randN func(int64) int64) time.Duration {
	if hi <= lo {
		return lo
	}
	upper := lo
	for i := 0; i <= attempt && upper < hi; i++ {
		upper *= 2
		if upper <= 0 { // overflow; lo > 0 is guaranteed by the caller
			upper = hi
		}
	}
	upper = min(upper, hi)
	return lo + time.Duration(randN(int64(upper-lo)+1))
}

// backoff adapts backoffDelay to autopaho's ReconnectBackoff. The very first
// attempt of a client that has never connected is immediate; after a lost
// connection even the first attempt waits (the broker is likely restarting,
// and so are its other clients).
func (c *Client) backoff(attempt int) time.Duration {
	if attempt == 0 && !c.everUp.Load() {
		return 0
	}
	return backoffDelay(attempt, c.cfg.MinBackoff, c.cfg.MaxBackoff, rand.Int64N)
}
