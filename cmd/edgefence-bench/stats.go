package main

import (
	"fmt"
	"slices"
	"time"
)

// summary describes a latency sample.
type summary struct {
	N                        int
	P50, P90, P99, P999, Max time.Duration
	Mean                     time.Duration
}

// summarize sorts lat in place and returns its percentiles (nearest rank).
func summarize(lat []time.Duration) summary {
	if len(lat) == 0 {
		return summary{}
	}
	slices.Sort(lat)
	pct := func(p float64) time.Duration {
		i := int(p*float64(len(lat))+0.5) - 1
		return lat[max(0, min(len(lat)-1, i))]
	}
	var sum time.Duration
	for _, d := range lat {
		sum += d
	}
	return summary{N: len(lat), P50: pct(0.50), P90: pct(0.90), P99: pct(0.99), P999: pct(0.999),
		Max: lat[len(lat)-1], Mean: sum / time.Duration(len(lat))}
}

// us formats d in microseconds.
func us(d time.Duration) string {
	return fmt.Sprintf("%.0f", float64(d)/float64(time.Microsecond))
}

// ms formats d in milliseconds with one decimal.
func ms(d time.Duration) string {
	return fmt.Sprintf("%.1f", float64(d)/float64(time.Millisecond))
}

// median returns the median of ds (sorting a copy).
func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// medianFloat returns the median of xs (sorting a copy).
func medianFloat(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
