// Package shadow provides device twins ("shadows"): per device a desired
// state written by applications and operators, a reported state written
// only by the device's current lease holder, and the delta between them.
// It stores twins in etcd, keeps a local bbolt cache for working offline,
// and never sends commands itself (the reconciler that turns a delta into
// fenced commands lives with the agent); it does not import package agent.
//
// # Documents and merge rules
//
// A state is a JSON object, held as map[string]any in the form Normalize
// returns (numbers are float64: integers are exact within ±2^53). A patch
// is a JSON object merged in with JSON Merge Patch semantics (RFC 7386),
// which is what a twin user expects:
//
//   - a partial update merges: fields the patch does not name are kept;
//   - null deletes a field (nulls inside arrays are values);
//   - nested objects merge field by field;
//   - arrays and scalars replace whole.
//
// Merge is pure and idempotent (the same patch twice equals once).
// Patches compose by merging them first only when neither deletes and each
// field keeps its kind (object or not); the property tests check both.
// Delta(desired, reported) is the part of desired that reported does not
// match, field by field in objects, arrays compared whole: merging it into
// reported makes every field desired sets equal, leaving reported-only
// fields alone; it is empty when the device has converged.
//
// Limits (Limits; defaults 64 KiB of compact JSON, 8 levels of objects and
// arrays) apply to every patch and to the state that results from merging
// it; input beyond them fails with ErrTooLarge or ErrTooDeep, invalid JSON
// or CBOR, a non-object, an unsupported value or a non-finite number with
// ErrInvalid — all wrap ErrInvalid, and nothing is written. Device ids are
// checked with fence.ValidateDeviceID; StoreConfig.KnownDevice can refuse
// unknown ones (ErrUnknownDevice).
//
// JSON is the format for people and etcd (DecodeJSON, EncodeJSON). The
// device link uses deterministic CBOR (EncodeCBOR, DecodeCBOR: RFC 8949
// core deterministic encoding, whole numbers as CBOR integers; tags, byte
// strings, duplicate keys and indefinite lengths are refused).
//
// # Metadata
//
// Each state keeps, per leaf field (a non-object value or an empty
// object), keyed by JSON Pointer ("/cfg/fan"), who set it last and when
// (FieldMeta): for desired the writer id (StoreConfig.Writer), for
// reported the writer id and the fencing token it wrote under. Metadata of
// deleted fields is dropped with them.
//
// # etcd layout
//
// With the agent's etcd prefix P (etcd.prefix, e.g. "/edgefence"):
//
//	P/devices/<id>/lock/<lease>      the concurrency.Mutex keys (package agent)
//	P/devices/<id>/twin/desired      {"state":{...},"meta":{"/temp":{"at":"...","by":"app"}}}
//	P/devices/<id>/twin/reported     {"state":{...},"meta":{"/temp":{"at":"...","by":"gw-a","token":1234}}}
//
// so "etcdctl get --prefix P/devices/<id>/twin/" shows a twin as JSON.
//
// # Versions
//
// A state's version (State.Version) is the etcd ModRevision of its key (0:
// never written); it is not stored in the value. Document.Version is the
// larger of the two, so it moves whenever either side does, and
// Document.Revision is the store revision the document was read at (watch
// from Revision+1 to miss nothing after it). Using ModRevision rather than
// a counter makes the version the very value etcd compares in a txn, and a
// watch event's revision directly comparable to it.
//
// Desired is written with optimistic concurrency: UpdateDesired(…,
// ifVersion) succeeds only if the key is still at ifVersion (0: must not
// exist), in one txn; otherwise it returns a *ConflictError (errors.Is
// ErrConflict) with the current version, and the caller reads again and
// retries. UpdateDesiredAny merges whatever the version is, retrying
// conflicts itself.
//
// # The fence rule (invariant I5)
//
// UpdateReported writes only in a txn
//
//	If(CreateRevision(lockKey) == token, ModRevision(reportedKey) == base)
//	Then(Put(reportedKey, merged)) Else(Get(lockKey), Get(reportedKey))
//
// where lockKey is the writer's own lock key (it must lie under
// P/devices/<id>/lock/) and token its CreateRevision, the token the holder
// commands under. A deposed holder's write — lease expired, key deleted or
// recreated, another session holding the lock — is refused by etcd itself:
// ErrFenced, nothing written, and the caller must stop that device's
// controller. The ModRevision compare guards the read-merge-write: if
// another writer moved the reported state, the Else branch returns it, the
// patch is merged into it and the txn retried (never after a fence
// failure). The Store remembers the last reported state it wrote or read
// per device, so the common case costs exactly one etcd request (measured
// by BenchmarkUpdateReported and asserted in TestReportedByHolder).
//
// # Watching desired
//
// Store.Watch follows desired changes of one device or all, from a given
// revision (0: a full read first), re-opening after a lost leader or
// connection from the last revision seen. If the revisions it needs were
// compacted it falls back to a full read (EventSync per device, EventDelete
// for devices it had seen that are gone) and continues from that read's
// revision. A Watch started after the gap cannot know of devices deleted in
// it; compare the sync against the Cache.
//
// # Offline cache
//
// Cache (file twin.db in the agent's state dir) keeps the last known
// desired state per device with its version (never moved back to an older
// one) and a per-device ordered queue of reported patches, each committed
// with fsync before Enqueue returns. Flush pushes the queues in order
// through UpdateReported under the lock key and token the caller holds now,
// keeping each patch's queued time in its metadata; a device's queue stops
// at its first error, and on ErrFenced the device is returned to the caller
// with its queue intact (Discard it, or push it under a new token if the
// patches are still true).
//
// # Not built yet
//
//   - (Built since, outside this package: the reconciler in agent/twin.go
//     and `edgefence twin get|set|watch`; see docs/ARCHITECTURE.md.)
//   - The agent's watch does not resume from the cache's revision after a
//     restart; it starts with a full read.
//   - Kill -9 safety of the cache is not built or tested: a crash between
//     etcd's commit and the dequeue pushes a patch again after restart —
//     harmless alone (merging is idempotent), but it brings old values
//     back if a newer write to the same fields landed in between (fix:
//     record the last applied queue seq in the reported record, in the
//     same txn). The queue has no size bound or expiry yet.
//   - A queued patch that etcd refuses as invalid (e.g. the merged state
//     would exceed the limits) blocks its device's queue until discarded.
//   - Batching several devices' reported writes into one txn, and the
//     convergence/throughput benchmarks for docs/BENCHMARKS.md.
//   - Deleting a twin (today: etcdctl del P/devices/<id>/twin/ --prefix).
package shadow
