// Package offline is the agent's durable outbox: every fenced command the
// agent creates is appended here before it is sent, and stays here until
// it has its terminal state.
//
// # Guarantees
//
// Invariant I4 (docs/ARCHITECTURE.md): every command ends in exactly one
// recorded terminal state — accepted, duplicate, stale, invalid or expired.
// The Outbox keeps it as follows.
//
//   - Append is durable: it returns only after the bbolt commit holding the
//     entry was fsynced. An entry keeps the original encoded envelope (its
//     token, seq, command id, kind and body exactly as they will be sent)
//     and its creation time and deadline.
//   - Per device, entries are delivered in the order they were appended:
//     Next returns the oldest pending one. Positions are never reused.
//   - An entry leaves the pending state only through Resolve (with the
//     fence point's Ack) or ExpireDue (fence.Expired, after its TTL), each
//     durable; a second terminal state is refused with ErrResolved and
//     changes nothing. ResolveMany records several acks in one commit
//     (group commit), with the same checks per ack.
//   - The outbox is bounded by pending entries and envelope bytes, per
//     device and in all. At a limit Append returns ErrFull and stores
//     nothing: backpressure to the caller, never a silent drop. Refusals
//     are counted (Stats.Refused).
//   - Nothing disappears without a terminal state: Compact deletes only
//     terminal entries, and only after Options.Retention.
//   - Records carry a CRC-32C; an unreadable one is reported (ErrCorrupt),
//     never obeyed, and stops its device's queue (fail closed) rather than
//     skip a command.
//   - One process at a time: a second Open waits Options.Timeout and fails
//     with ErrLocked. Options.ReadOnly opens the file for inspection under
//     a shared lock (several readers, no writer; every write returns
//     ErrReadOnly); it too fails with ErrLocked while an agent holds the
//     file, and the agent's local API serves the outbox instead.
//
// A command id stays unique while its entry is in the outbox; after
// Compact removed it the id could be appended again, so ids must be unique
// for longer than Retention (the agent makes them unique forever).
//
// # What the agent does with it (issue 4)
//
// The agent appends each command before handing it to a transport, sends
// Next(device) when the link is up, and calls Resolve with each Ack it
// receives (a duplicate delivery of a QoS 1 message ends as
// fence.Duplicate at the fence point, never applied twice). Commands queued
// under a token that has since been superseded are replayed as they are:
// the fence point refuses them as stale and the refusal is recorded. A
// periodic ExpireDue ends what waited too long; the caller logs and counts
// the returned number. Compact runs on the same tick. `edgefence outbox
// list|show` reads List, Summary and Find: from the file read-only when no
// agent runs, else from the agent's local API (GET /v1/outbox).
package offline
