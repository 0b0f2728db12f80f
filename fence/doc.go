// Package fence is the heart of edgefence: fencing tokens, the command
// envelope and its acknowledgement, and the one admit rule every fence point
// applies.
//
// A fencing token is the etcd CreateRevision of the holder's lock key. It
// strictly increases with every grant, travels on every command, and is
// checked at the resource: a fence point accepts a command only if its token
// is at least as high as the highest it has accepted, and orders commands of
// the same token by a per-token sequence number:
//
//	token >  max                    → accepted (new holder; seq restarts)
//	token == max && seq >  lastSeq  → accepted
//	token == max && seq <= lastSeq  → duplicate (ack again, never re-apply)
//	token <  max                    → stale
//
// Admit is that rule as a pure function. AdmitEpoch puts an epoch before
// it: a command carries the epoch it was issued in, a fence point is at an
// epoch per device that only the operator's root raises (a fleet epoch
// statement, a reset), and a command of an earlier epoch is stale whatever
// its token, one of a later epoch invalid. Envelope and Ack are encoded as
// deterministic CBOR (RFC 8949 core deterministic encoding) with small integer
// map keys, and decoded with explicit limits on size, nesting, and container
// lengths; duplicate map keys, indefinite lengths, tags and unknown fields are
// rejected. MarkRecord is the durable mark every fence point stores (Table
// here, devices/shim on a device): a versioned binary record with a CRC-32C,
// read back exactly or refused with ErrMarkRecordCorrupt.
//
// The package imports no network code so that device firmware written in Go
// can use it as is.
package fence
