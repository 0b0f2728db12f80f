// Package offline is the agent's durable outbox: every fenced command the
// agent creates is appended here before it is sent, and stays until it has
// its terminal state. It also keeps the agent's highest token held
// (SetHeld, Held).
//
// Guarantees (invariant I4: exactly one recorded terminal state per command —
// accepted, duplicate, stale, invalid or expired):
//
//   - Append returns only after the bbolt commit holding the entry was
//     fsynced; the entry keeps the encoded envelope exactly as it is sent.
//     Concurrent Append calls share commits (one fsync for a group), each
//     returning once its own entries are durable.
//   - Per device, Next returns the oldest pending entry; positions are never
//     reused.
//   - An entry leaves pending only through Resolve (with the fence point's
//     Ack) or ExpireDue (after its TTL), durably; a second terminal state is
//     refused with ErrResolved. Concurrent Resolve calls share commits.
//   - Bounded by pending entries and bytes, per device and in all: at a limit
//     Append returns ErrFull and stores nothing (counted in Stats.Refused).
//   - A pending entry is never changed. A terminal entry keeps its envelope
//     and ack, but a body larger than KeepBodyMax (a firmware chunk's data)
//     is dropped in the commit of its terminal state: the record keeps the
//     envelope without it, and its size and SHA-256 (Record.BodyBytes,
//     BodySHA256).
//   - Compact deletes only terminal entries: those older than
//     Options.Retention and, over Options.MaxEnded of them, the oldest; so
//     command ids must stay unique for longer than the shorter of the two
//     (the agent's are random).
//   - Records carry a CRC-32C; an unreadable one returns ErrCorrupt and stops
//     its device's queue (fail closed), never skipped.
//   - One process at a time: a second Open fails with ErrLocked after
//     Options.Timeout. Options.ReadOnly opens for inspection under a shared
//     lock (writes return ErrReadOnly).
//
// Methods are safe for concurrent use; the Outbox starts no goroutines.
// How the agent uses it: docs/ARCHITECTURE.md, "Working through
// disconnection".
package offline
