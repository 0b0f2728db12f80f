package agent

import "github.com/edgefence/edgefence/offline"

// The fresh-entry hint: a fan-out stores one command for each of
// thousands of devices, and each device's worker would then read back
// from the outbox (NextAfter: a read transaction, two B+tree lookups, a
// CBOR decode and a copy) the entry that was just encoded and stored. When
// the entry stored is the device's only pending one, the issuer hands it
// to the worker instead (device.fresh), and the worker's next takes it
// without a read.
//
// Why the hint is the device's next entry when the worker takes it:
//   - it was stored with the device's seq order held (d.sem) while the
//     outbox counted no pending entry for the device, so every entry
//     before it had its terminal state recorded; entries stored later
//     come after it;
//   - it is still pending: only the device's worker resolves its entries
//     (it has not been handed this one: its queue position is above
//     device.handed), and an expiry pass that ends it drops the hint
//     (delivery.expire, under expireMu, which next holds for reading);
//   - a worker that read it from the outbox before the hint was set has
//     handed it (device.handed ≥ its position): the hint is then dropped.
//
// The hint is set only after the entry's commit (durable before the first
// send, I4). Anything else (a send's entries, a restart, a device with
// entries queued) reads the outbox as before.

// hintFresh hands e, just stored for d with d.sem held and d's queue
// empty before it (only), to d's worker.
func (q *delivery) hintFresh(d *device, e *offline.Entry, only bool) {
	if !only || e.Pos == 0 {
		return
	}
	c := *e
	d.mu.Lock()
	d.fresh = &c
	d.mu.Unlock()
}

// takeFresh returns d's fresh entry if it is still the next one for d's
// worker (above every position handed to it), and drops the hint either
// way. Call with expireMu held for reading.
func (q *delivery) takeFresh(d *device) *offline.Entry {
	d.mu.Lock()
	defer d.mu.Unlock()
	f := d.fresh
	d.fresh = nil
	if f == nil || f.Pos <= d.handed {
		return nil
	}
	q.stats.hinted.Add(1)
	return f
}
