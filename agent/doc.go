// Package agent is the edgefence gateway agent: it holds one etcd session per
// agent, campaigns for a lock per device under that session, turns each
// acquisition into a fencing token (the CreateRevision of its own lock key),
// and runs a controller per held device that stamps every command with that
// token and a per-token sequence number.
//
// Losing the session (Done) stops that session's controllers at once and the
// agent campaigns again under a new session, which yields a strictly greater
// token (invariant I6). That is an optimisation only: safety comes from the
// fence points, which refuse lower tokens even from a process that never
// noticed it was deposed (I1).
//
// The agent knows no wire format beyond package fence: it hands envelopes to
// a Sender (the MQTT transport satisfies it) and reads back Acks.
package agent
