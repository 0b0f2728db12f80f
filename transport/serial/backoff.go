package serial

import "time"

// backoffDelay returns how long to wait before reopening attempt number
// attempt (0-based, counted from the moment the port was lost): drawn
// uniformly from [lo, min(lo·2^(attempt+1), hi)], exponential growth with
// full jitter above a floor, so the gateways of a site whose hub lost power
// do not retry in lockstep. randN(n) returns a value in [0, n).
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
