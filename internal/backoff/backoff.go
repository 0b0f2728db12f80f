// Package backoff provides the delays between the retries of an operation:
// exponential growth from a floor to a ceiling, drawn at random so that
// clients that failed together (a fleet of gateways after a broker or etcd
// restart) do not retry in lockstep; and Sleep, which waits one of them
// unless a context ends first.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Jitter says how a retry's delay is drawn below its ceiling.
type Jitter uint8

const (
	// Full draws the delay uniformly from [Min, ceiling]: the retries of
	// clients that failed together spread the most.
	Full Jitter = iota
	// Equal draws it from [ceiling/2, ceiling], never below Min: half of
	// it fixed, half random, so every wait is at least half its ceiling.
	Equal
)

// Backoff yields the delays before the retries of one operation. Retry n
// (counted from 0) has the ceiling min(Min·2ⁿ⁺¹, Max) — 2·Min, 4·Min, 8·Min
// and so on up to Max — and its delay is drawn below it as Jitter says
// (the zero value is Full). Every delay lies in [Min, Max]; a Max below Min
// counts as Min, a negative Min or retry number as zero (and with a Min of
// zero there is nothing to double: every ceiling is Max).
//
// Delay is safe for concurrent use if Rand is; Next and Reset keep a count
// of retries and are not.
type Backoff struct {
	Min, Max time.Duration
	Jitter   Jitter
	// Rand returns a number in [0, n); nil means math/rand/v2's Int64N.
	Rand func(n int64) int64

	n int // retries since the last Reset
}

// Delay returns the delay before retry n (counted from 0).
func (b *Backoff) Delay(n int) time.Duration {
	lo, hi := max(b.Min, 0), b.ceiling(max(n, 0))
	if b.Jitter == Equal {
		lo = max(lo, hi/2)
	}
	if hi <= lo {
		return lo
	}
	randN := b.Rand
	if randN == nil {
		randN = rand.Int64N
	}
	return lo + time.Duration(randN(int64(hi-lo)+1))
}

// ceiling returns min(Min·2ⁿ⁺¹, Max), without overflowing.
func (b *Backoff) ceiling(n int) time.Duration {
	lo := max(b.Min, 0)
	if b.Max <= lo {
		return lo
	}
	hi := lo
	for i := 0; i <= n && hi < b.Max; i++ {
		hi *= 2
		if hi <= 0 { // Min was 0, or the doubling overflowed
			return b.Max
		}
	}
	return min(hi, b.Max)
}

// Next returns the delay before the next retry and counts it: the first
// call after a Reset (or on a new Backoff) returns Delay(0).
func (b *Backoff) Next() time.Duration {
	d := b.Delay(b.n)
	if b.n < 64 { // the ceiling is Max long before: no need to count on
		b.n++
	}
	return d
}

// Reset starts the count of retries again, after a success.
func (b *Backoff) Reset() { b.n = 0 }
