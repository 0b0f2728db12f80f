package shim

import (
	"go.etcd.io/bbolt"

	"github.com/edgefence/edgefence/fence"
)

// Device is what a device plugs into the shim.
type Device interface {
	// Check validates the command (kind, body) without side effects. An
	// error makes the verdict Invalid and leaves the mark unchanged. Check is
	// called for every decodable command addressed to the device, before the
	// admit rule, including commands that then turn out stale or duplicate.
	Check(env *fence.Envelope) error
	// Apply makes the command take effect. The shim calls it only after the
	// new mark is committed with fsync, and at most once per (token, seq). It
	// is not called for devices that implement TxApplier.
	//
	// If Apply fails the verdict is Invalid with the error as reason, but
	// the mark has already moved: the command is consumed (at most once),
	// a redelivery of it is a Duplicate, and retrying takes a new command.
	// This is the one Invalid verdict that moves the mark; the ack shows it.
	Apply(env *fence.Envelope) error
}

// TxApplier is implemented by devices whose effect can be written to the
// shim's own bbolt database. ApplyTx runs inside the write transaction that
// moves the mark, so mark and effect commit together: exactly once across
// crashes. An error (or panic) rolls the whole transaction back; the verdict
// is then Invalid and the mark does not move.
//
// ApplyTx must keep its writes to buckets of its own; it must not touch the
// shim's bucket, commit, or roll back tx.
type TxApplier interface {
	ApplyTx(tx *bbolt.Tx, env *fence.Envelope) error
}
