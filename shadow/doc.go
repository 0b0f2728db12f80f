// Package shadow provides device twins ("shadows"): per device a desired
// state written by applications and operators, a reported state written
// only by the device's current lease holder, and the delta between them.
// It stores twins in etcd (Store), keeps a bbolt Cache for working offline,
// and never sends commands: the reconciler lives in package agent, which
// this package does not import.
//
//   - A state is a JSON object (map[string]any as Normalize returns it). Merge
//     applies a patch with JSON Merge Patch semantics (RFC 7386); it is pure
//     and idempotent. Delta(desired, reported) is what reported lacks; empty
//     when converged. FieldMeta records who set each leaf field and when.
//   - Limits (default 64 KiB, 8 levels) apply to every patch and its result;
//     bad input fails with an error wrapping ErrInvalid (ErrTooLarge,
//     ErrTooDeep) and nothing is written; StoreConfig.KnownDevice may refuse
//     a device (ErrUnknownDevice). JSON for people and etcd, deterministic
//     CBOR (EncodeCBOR, DecodeCBOR) on the device link.
//   - A state's Version is its etcd ModRevision. UpdateDesired writes only if
//     the key is still at ifVersion, else *ConflictError (ErrConflict);
//     UpdateDesiredAny retries conflicts itself.
//   - UpdateReported writes in one txn only while the writer's lock key has
//     CreateRevision == token (invariant I5): a deposed holder gets ErrFenced
//     and nothing is written.
//   - Store.Watch follows desired changes from a revision, re-opening after a
//     lost connection and falling back to a full read after compaction.
//   - Cache keeps the last desired per device and a per-device fsynced queue
//     of reported patches; Flush pushes them in order under the caller's
//     current token, returning fenced devices with their queues intact.
//
// Merge rules, etcd layout, versions and the cache in detail, and what is
// left: docs/ARCHITECTURE.md, "Twins".
package shadow
