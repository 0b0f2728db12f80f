package images

import (
	"context"
	"errors"
	"maps"
)

// Stats are the cache's counters (see the package doc).
type Stats struct {
	Fetches      uint64
	FetchedBytes uint64
	Hits         uint64
	Misses       uint64
	Failures     map[string]uint64 // by reason
	Corrupt      uint64
	Pruned       uint64
	Entries      int
	Bytes        uint64
	InUse        int
}

// Reasons of failures, the keys of Stats.Failures.
var reasons = []struct {
	err error
	why string
}{
	{context.Canceled, "canceled"},
	{context.DeadlineExceeded, "canceled"},
	{ErrHashMismatch, "hash_mismatch"},
	{ErrSizeMismatch, "size_mismatch"},
	{ErrTooLarge, "too_large"},
	{ErrNotFound, "not_found"},
	{ErrBadURL, "bad_url"},
	{ErrStorage, "storage"},
	{ErrFetch, "fetch"},
}

// Reasons lists the keys of Stats.Failures.
func Reasons() []string {
	var out []string
	for _, r := range reasons {
		if len(out) == 0 || out[len(out)-1] != r.why {
			out = append(out, r.why)
		}
	}
	return out
}

func reason(err error) string {
	for _, r := range reasons {
		if errors.Is(err, r.err) {
			return r.why
		}
	}
	return "fetch"
}

// Stats returns the counters now.
func (c *Cache) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.st
	s.Failures = maps.Clone(c.st.Failures)
	s.Entries, s.Bytes = len(c.ents), c.bytes
	for _, e := range c.ents {
		if e.refs > 0 {
			s.InUse++
		}
	}
	return s
}
