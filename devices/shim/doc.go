// Package shim is a fence point for Linux-class device firmware: it decides,
// for every command envelope addressed to a device, whether the command may
// take effect, and keeps the device's high-water mark durably in a bbolt file
// (a fence.MarkRecord per device; a record that fails its checksum refuses
// that device's commands, counted in Stats.CorruptMarks).
//
// The decision is fence.Admit, the one admit rule. What the shim adds is
// durability and ordering around it:
//
//   - The check and the update of the mark happen in one bbolt write
//     transaction, committed with fsync, before the command takes effect
//     (invariant I3, durable before effect). A command whose token is below
//     the mark is refused for ever after, across restarts (I1).
//   - A device that implements TxApplier writes its effect in that same
//     transaction, so mark and effect commit or vanish together: across a
//     crash or kill -9 every accepted command takes effect exactly once.
//   - A device that only implements Device gets Apply called after the commit:
//     its effect happens at most once (a crash between commit and Apply loses
//     the effect, never repeats it; a redelivery is a Duplicate).
//   - Duplicates (same token, seq not above the mark) are acknowledged again
//     and never re-applied.
//
// Options.PersistOnTokenChangeOnly trades the exactly-once/at-most-once
// guarantee for flash wear on devices whose commands are all idempotent; see
// its documentation. The fence cannot be turned off (the demonstrations'
// unfenced device is a simulator kind of devices/sim, in test builds only).
//
// Handle never panics, whatever the input, and never moves the mark for input
// it refuses. Stats counts verdicts; the Invalid count is the bad-input metric.
// Options.History records every decision for fence/history's checker, each
// accept before its commit, and on Open the durable marks that show which
// recorded accepts a crash kept from committing (history.OpOpened).
package shim
