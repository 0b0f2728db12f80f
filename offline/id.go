package offline

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"time"
)

// NewCommandID returns a new command id for an envelope made at t: 32
// lowercase hex digits, the first 12 t in milliseconds since the Unix
// epoch, the other 20 random (80 bits from crypto/rand), as a ULID lays
// them out. The ids an agent makes sort by the time they were made, so the
// outbox's entries, keyed by id, go in at the end of their bucket: a
// commit of a fan-out's appends and verdicts dirties a few pages at that
// end instead of one page per command spread over a bucket that keeps up
// to Options.MaxEnded ended commands (BenchmarkCommandIDs: less than half
// the CPU with 50,000 kept). Uniqueness rests on the random part (and Append
// refuses an id it holds); a clock stepped back costs only that locality.
func NewCommandID(t time.Time) string {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], uint64(t.UnixMilli())<<16)
	_, _ = rand.Read(b[6:]) // crypto/rand.Read never fails on Linux (go1.24+)
	return hex.EncodeToString(b[:])
}
