package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/internal/backoff"
	"github.com/edgefence/edgefence/offline"
	"github.com/edgefence/edgefence/shadow"
)

// The twin reconciler, on when Options.Twins is set:
//
//	Store.Watch(all devices) ─▶ desired[dev] ─▶ kick(dev) ─▶ worker(dev):
//	  holder(dev) → lock key, token      (not holding: nothing to do)
//	  Cache.Flush (reported patches queued while etcd was out of reach)
//	  delta := Delta(desired, LastReported)  (empty: done — idempotent)
//	  Send(dev, "twin.set", CBOR(delta))      (the normal fenced path, outbox)
//	  ack accepted or duplicate ─▶ UpdateReported(dev, delta, lockKey, ack.Token)
//	  ErrFenced ─▶ this controller stops for the device (I5)
//
// One watch serves every device of the agent; a worker runs per device
// only while there is something to do (like the outbox's), so a device's
// twin.set commands never overlap. A worker is kicked by a desired change,
// by the agent acquiring the device, and by a device state report.
//
// The rule for device-local changes: the device's own state report
// (DeviceState, ReportState) updates reported, fenced like any reported write; if it
// differs from desired the difference shows up as delta, and stays there:
// the reconciler acts on a desired version once (per token held), so it
// does not undo a local change. Desired wins again only when an
// application writes desired (a new version, even with the same values),
// or when a holder takes the device over or the agent restarts — it cannot
// tell a local change from a reconcile its predecessor left unfinished, so
// it converges the device to desired.

// KindTwinSet is the command kind the twin reconciler sends: its body is a
// twin delta, encoded with shadow.EncodeCBOR.
const KindTwinSet = "twin.set"

// twinRounds bounds the send → write rounds of one reconcile: a device
// that accepts a delta but keeps reporting something else must not be sent
// commands in a loop; the next desired change or report starts again.
const twinRounds = 4

// twinPoll is how often a reconciler looks at a twin.set command that was
// queued in the outbox without an ack, for its terminal state.
const twinPoll = 200 * time.Millisecond

// twins is the agent's twin reconciler. It sees the rest of the agent
// through twinHost (who holds a device; the fenced command path) and the
// outbox (the fate of a queued twin.set). Its one lock, mu, is a leaf: no
// other lock is taken while it is held.
type twins struct {
	store       *shadow.Store
	cache       *shadow.Cache // nil: reported writes are not queued while etcd is out of reach
	host        twinHost
	outbox      *offline.Outbox
	log         *slog.Logger
	dialTimeout time.Duration   // etcd.dial_timeout: bounds a reported write before it is queued
	order       []string        // the configured devices, in config order
	known       map[string]bool // the configured devices

	mu      sync.Mutex
	ctx     context.Context // set while Run runs; nil: no new workers
	devs    map[string]*twinDev
	workers sync.WaitGroup

	stats struct {
		events, sent, written, fenced, refused, queued, errors, reports atomic.Uint64
	}
}

// twinDev is one device's reconciler state, guarded by twins.mu.
type twinDev struct {
	desired     shadow.State
	haveDesired bool
	running     bool // a worker runs
	again       bool // kicked while it ran: run once more
	// fencedAt is the highest token under which etcd refused a reported
	// write (I5): the reconciler does nothing more under it.
	fencedAt fence.Token
	// refused is the desired version the device refused as invalid: it is
	// not sent again until desired changes.
	refused int64
	// synced is the desired version the reconciler last found converged,
	// under syncedToken: it does not act on that version again (a local
	// change since then stays, as delta, until desired is written again).
	synced      int64
	syncedToken fence.Token
	// report is the latest device state report not yet written (DeviceState);
	// the worker writes it before it reconciles.
	report map[string]any
	// written is the last device report handed to the worker: download
	// progress is written against it (progressOnly).
	written map[string]any
	// deltaFields is the number of leaf fields in Delta(desired, reported)
	// when the reconciler (or a device report) last compared them:
	// edgefence_twin_delta_fields.
	deltaFields int
}

// leafFields counts the leaf fields of a delta: a nested object counts its
// fields (an empty one counts as one), anything else as one.
func leafFields(m map[string]any) int {
	n := 0
	for _, v := range m {
		if sub, ok := v.(map[string]any); ok && len(sub) > 0 {
			n += leafFields(sub)
		} else {
			n++
		}
	}
	return n
}

// setDelta records dev's current delta size.
func (t *twins) setDelta(dev string, delta map[string]any) {
	t.mu.Lock()
	t.dev(dev).deltaFields = leafFields(delta)
	t.mu.Unlock()
}

// deltaFields returns the delta size last recorded for dev.
func (t *twins) deltaFields(dev string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	if td := t.devs[dev]; td != nil {
		return td.deltaFields
	}
	return 0
}

// TwinStats are the twin reconciler's counters.
type TwinStats struct {
	Events   uint64 `json:"desired_events"`   // desired changes seen by the watch
	Sent     uint64 `json:"twin_set_sent"`    // twin.set commands issued
	Written  uint64 `json:"reported_written"` // fenced reported writes that etcd accepted
	Fenced   uint64 `json:"reported_fenced"`  // reported writes etcd refused (I5): the controller stopped
	Refused  uint64 `json:"twin_set_refused"` // twin.set commands the device refused as invalid
	Queued   uint64 `json:"reported_queued"`  // reported patches queued in the cache (etcd out of reach)
	Errors   uint64 `json:"twin_errors"`      // other failures (retried)
	Reports  uint64 `json:"device_reports"`   // device state reports written to reported
	Watching bool   `json:"watching"`
}

// twinHost is what the reconciler needs of the agent's leases and
// delivery.
type twinHost interface {
	// holder returns the lock key and token of dev's controller, if the
	// agent holds dev.
	holder(dev string) (key string, token fence.Token, ok bool)
	// Send issues a fenced command through the outbox (Agent.Send).
	Send(ctx context.Context, dev, kind string, body []byte) (*fence.Ack, error)
}

func newTwins(a *Agent, store *shadow.Store, cache *shadow.Cache) *twins {
	t := &twins{store: store, cache: cache, host: a, outbox: a.outbox, log: a.log, dialTimeout: a.cfg.Etcd.DialTimeout,
		order: a.order, known: make(map[string]bool, len(a.order)), devs: make(map[string]*twinDev)}
	for _, id := range a.order {
		t.known[id] = true
	}
	return t
}

// TwinStats returns the twin reconciler's counters (zero if it is off).
func (a *Agent) TwinStats() TwinStats {
	if a.twin == nil {
		return TwinStats{}
	}
	return a.twin.statsNow()
}

func (t *twins) statsNow() TwinStats {
	t.mu.Lock()
	watching := t.ctx != nil
	t.mu.Unlock()
	return TwinStats{Events: t.stats.events.Load(), Sent: t.stats.sent.Load(), Written: t.stats.written.Load(),
		Fenced: t.stats.fenced.Load(), Refused: t.stats.refused.Load(), Queued: t.stats.queued.Load(),
		Errors: t.stats.errors.Load(), Reports: t.stats.reports.Load(), Watching: watching}
}

// runTwins watches desired states of every device until ctx ends, kicking
// a device's reconciler on each change, and waits for the workers.
func (t *twins) run(ctx context.Context) {
	t.mu.Lock()
	t.ctx = ctx
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		t.ctx = nil
		t.mu.Unlock()
		t.workers.Wait()
	}()
	// Offline start: reconcile from the cached desired states until the
	// watch's first read replaces them.
	if t.cache != nil {
		for _, id := range t.order {
			st, ok, err := t.cache.Desired(id)
			if err != nil {
				t.log.Warn("twin: cached desired state", "device", id, "err", err)
				continue
			}
			if ok {
				t.setDesired(id, st)
			}
		}
	}
	delay := backoff.Backoff{Min: 100 * time.Millisecond, Max: 5 * time.Second}
	for ctx.Err() == nil {
		// Watch re-opens itself after lost connections; it returns only
		// when ctx ends or on a bad argument.
		err := t.store.Watch(ctx, "", 0, func(ev shadow.Event) error {
			delay.Reset()
			t.desiredEvent(ev)
			return nil
		})
		if ctx.Err() != nil {
			return
		}
		t.log.Warn("twin: watch of desired states ended", "err", err)
		if !backoff.Sleep(ctx, delay.Next()) {
			return
		}
	}
}

// desiredEvent records one change of desired state and kicks the device.
func (t *twins) desiredEvent(ev shadow.Event) {
	if !t.known[ev.Device] {
		return // another agent's device
	}
	t.stats.events.Add(1)
	if ev.Err != nil {
		t.stats.errors.Add(1)
		t.log.Warn("twin: unreadable desired state ignored", "device", ev.Device, "revision", ev.Revision, "err", ev.Err)
		return
	}
	if t.cache != nil {
		if _, err := t.cache.PutDesired(ev.Device, ev.Desired); err != nil {
			t.log.Warn("twin: cache desired state", "device", ev.Device, "err", err)
		}
	}
	t.setDesired(ev.Device, ev.Desired)
}

// setDesired makes st dev's desired state unless a newer one is known, and
// kicks the device.
func (t *twins) setDesired(dev string, st shadow.State) {
	t.mu.Lock()
	td := t.dev(dev)
	if td.haveDesired && st.Version != 0 && td.desired.Version > st.Version {
		t.mu.Unlock()
		return
	}
	td.desired, td.haveDesired = st, true
	t.mu.Unlock()
	t.kick(dev)
}

func (t *twins) dev(id string) *twinDev {
	td := t.devs[id]
	if td == nil {
		td = &twinDev{}
		t.devs[id] = td
	}
	return td
}

// twinNewToken is called by install before a controller under a new token
// (not a resumed session) becomes visible. What this process remembers of
// the reported state may be stale — another holder may have written since
// — and reported patches it queued under an older token must not be pushed
// under the new one: the device reports its current state again. If they
// cannot be dropped, the twin controller stays stopped for the device
// under this token (fail closed, as after a fenced write).
func (t *twins) newToken(dev string, token fence.Token) {
	if t == nil {
		return
	}
	t.store.Forget(dev)
	t.mu.Lock()
	t.dev(dev).written = nil // the device's next report is written whole
	t.mu.Unlock()
	if t.cache == nil {
		return
	}
	if p, err := t.cache.Pending(dev); err == nil && len(p) == 0 {
		return // nothing queued: no write (and no fsync) per device at start
	}
	if err := t.cache.Discard(dev, 0); err != nil {
		t.mu.Lock()
		td := t.dev(dev)
		td.fencedAt = max(td.fencedAt, token)
		t.mu.Unlock()
		t.log.Error("twin: cannot drop reported patches queued under an older token; twins stop for the device under this token",
			"device", dev, "token", token, "reason", "twin cache: "+err.Error())
	}
}

// kick makes sure a worker reconciles dev. It does nothing if twins
// are off or Run is not running.
func (t *twins) kick(dev string) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ctx == nil {
		return
	}
	td := t.dev(dev)
	if td.running {
		td.again = true
		return
	}
	td.running, td.again = true, false
	ctx := t.ctx
	t.workers.Add(1)
	go func() {
		defer t.workers.Done()
		t.worker(ctx, dev)
	}()
}

func (t *twins) worker(ctx context.Context, dev string) {
	for {
		if report := t.takeReport(dev); report != nil {
			t.writeDeviceReport(ctx, dev, report)
		}
		t.reconcile(ctx, dev)
		t.mu.Lock()
		if t.dev(dev).again && ctx.Err() == nil {
			t.dev(dev).again = false
			t.mu.Unlock()
			continue
		}
		t.dev(dev).running = false
		t.mu.Unlock()
		return
	}
}

// holding returns dev's lock key and token if the agent holds dev and
// etcd has not fenced the reconciler under that token.
func (t *twins) holding(dev string) (string, fence.Token, bool) {
	key, token, ok := t.host.holder(dev)
	if !ok {
		return "", 0, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if token <= t.dev(dev).fencedAt {
		return "", 0, false
	}
	return key, token, true
}

// fenced records that etcd refused a reported write of dev under token:
// the reconciler stops for the device until it holds a newer token (I5).
func (t *twins) fenced(dev string, token fence.Token, err error) {
	t.stats.fenced.Add(1)
	t.mu.Lock()
	td := t.dev(dev)
	td.fencedAt = max(td.fencedAt, token)
	t.mu.Unlock()
	t.store.Forget(dev)
	t.log.Warn("twin: reported write refused by etcd; the twin controller stops for the device (I5)",
		"device", dev, "token", token, "reason", "fenced: the lock key of this token is gone (no longer the holder)", "err", err)
}

// reconcile runs send → write rounds for dev until its delta is empty or
// it can do nothing more now. Transient failures are retried with backoff
// as long as the agent holds the device.
func (t *twins) reconcile(ctx context.Context, dev string) {
	delay := backoff.Backoff{Min: 100 * time.Millisecond, Max: 5 * time.Second}
	retry := func(what string, err error) bool {
		t.stats.errors.Add(1)
		wait := delay.Next()
		t.log.Warn("twin: "+what, "device", dev, "err", err, "retry_in", wait)
		return backoff.Sleep(ctx, wait)
	}
	var written *shadow.State // reported as the last write left it
	for round := 0; round < twinRounds && ctx.Err() == nil; {
		key, token, ok := t.holding(dev)
		if !ok {
			return
		}
		if flushed, stop := t.flushBefore(ctx, dev); stop {
			return
		} else if !flushed {
			if !retry("queued reported patches not written yet", errors.New("etcd unreachable")) {
				return
			}
			continue
		}
		rep := written
		written = nil
		delta, version, done, err := t.deltaFor(ctx, dev, token, rep)
		if done {
			return
		}
		if err != nil {
			if ctx.Err() != nil || !retry("read reported", err) {
				return
			}
			continue
		}
		body, err := shadow.EncodeCBOR(delta, shadow.Limits{})
		if err != nil {
			t.stats.errors.Add(1)
			t.log.Error("twin: delta does not encode; not sent", "device", dev, "err", err)
			return
		}
		round++
		t.stats.sent.Add(1)
		ack, err := t.send(ctx, dev, body)
		if err != nil {
			if errors.Is(err, ErrNotHolder) || ctx.Err() != nil {
				return
			}
			if !retry("twin.set without a verdict", err) {
				return
			}
			continue
		}
		if !t.applied(dev, ack, version) {
			return
		}
		if ack.Token != token {
			// Issued under a controller installed since holder(): the
			// key read then is not that token's.
			if key, token, ok = t.holding(dev); !ok || token != ack.Token {
				continue
			}
		}
		st, ok := t.writeReported(ctx, dev, delta, key, token)
		if !ok {
			return
		}
		written = st // what etcd has now: the next round needs no read
		delay.Reset()
	}
}

// deltaFor returns what dev must still be sent to reach its desired state
// under token, comparing with rep (reading reported if rep is nil), and
// the desired version. done: nothing to send now (no desired state, this
// version converged under token, or the device refused it).
func (t *twins) deltaFor(ctx context.Context, dev string, token fence.Token, rep *shadow.State) (delta map[string]any, version int64, done bool, err error) {
	t.mu.Lock()
	td := t.dev(dev)
	desired, have, refused := td.desired, td.haveDesired, td.refused
	synced := td.synced == desired.Version && td.syncedToken == token
	t.mu.Unlock()
	if !have || synced {
		return nil, 0, true, nil
	}
	if rep == nil {
		st, err := t.store.LastReported(ctx, dev)
		if err != nil {
			return nil, 0, false, err
		}
		rep = &st
	}
	delta = shadow.Delta(desired.Fields, rep.Fields)
	t.setDelta(dev, delta)
	if len(delta) == 0 {
		// Converged: nothing to send (a repeated desired value costs one
		// read).
		t.mu.Lock()
		td.synced, td.syncedToken = desired.Version, token
		t.mu.Unlock()
		return nil, desired.Version, true, nil
	}
	if desired.Version != 0 && desired.Version == refused {
		return nil, desired.Version, true, nil // refused: wait for a new desired state
	}
	return delta, desired.Version, false, nil
}

// flushBefore pushes dev's queued reported patches before a reconcile
// round, bounded by etcd.dial_timeout: with etcd away the worker must come
// back to queue device reports instead of waiting in the client. stop: the
// round must not go on (ctx ended, or fenced); !flushed: retry later.
func (t *twins) flushBefore(ctx context.Context, dev string) (flushed, stop bool) {
	fctx, cancel := context.WithTimeout(ctx, t.dialTimeout)
	flushed = t.flushReported(fctx, dev)
	cancel()
	if flushed {
		return true, false
	}
	if ctx.Err() != nil {
		return false, true
	}
	if _, _, ok := t.holding(dev); !ok {
		return false, true // fenced
	}
	// A device report that came meanwhile goes behind the queued patches:
	// reports reach etcd in the order the device made them, and durably.
	if report := t.takeReport(dev); report != nil {
		t.queueReport(dev, report)
	}
	return false, false
}

// applied reports whether the device applied a twin.set (accepted or
// duplicate). A stale verdict means a newer holder reached the device (the
// session loop notices); any other refusal is remembered for the desired
// version, which is not sent again until desired changes.
func (t *twins) applied(dev string, ack *fence.Ack, version int64) bool {
	switch ack.Verdict {
	case fence.Accepted, fence.Duplicate:
		return true
	case fence.Stale:
		return false
	}
	t.stats.refused.Add(1)
	t.mu.Lock()
	t.dev(dev).refused = version
	t.mu.Unlock()
	t.log.Warn("twin: device refused the desired state; not sent again until desired changes",
		"device", dev, "token", ack.Token, "reason", ack.Reason, "verdict", ack.Verdict, "id", ack.ID, "desired_version", version)
	return false
}

// send issues one twin.set command and returns its ack. A command not
// acked within the command timeout stays queued: send then waits for its
// terminal state in the outbox, so that a device that is away gets one
// twin.set, not one per timeout.
func (t *twins) send(ctx context.Context, dev string, body []byte) (*fence.Ack, error) {
	ack, err := t.host.Send(ctx, dev, KindTwinSet, body)
	if ack != nil {
		return ack, nil
	}
	var qe *QueuedError
	if !errors.As(err, &qe) || ctx.Err() != nil {
		return nil, err
	}
	tick := time.NewTicker(twinPoll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-tick.C:
		}
		rec, err := t.outbox.Find(qe.ID)
		if errors.Is(err, offline.ErrNotFound) {
			return nil, fmt.Errorf("twin.set %s: gone from the outbox: %w", qe.ID, err)
		}
		if err != nil || rec.Pending() {
			continue
		}
		if rec.Ack == nil { // expired, never sent
			return nil, fmt.Errorf("twin.set %s ended %s without an ack", qe.ID, rec.StateString())
		}
		return rec.Ack, nil
	}
}

// writeReported merges patch into dev's reported state under key and
// token (I5) and returns the new state if etcd has it (nil if the patch
// was only queued). ok is false when the reconciler must not go on: etcd
// refused the write (fenced), the patch is invalid, or ctx ended. If etcd
// cannot be reached within etcd.dial_timeout and the agent has a twin
// cache, the patch is queued there (durably) and pushed later by
// flushReported.
func (t *twins) writeReported(ctx context.Context, dev string, patch map[string]any, key string, token fence.Token) (st *shadow.State, ok bool) {
	// Bounded: with etcd out of reach the patch goes to the cache instead
	// of waiting for etcd (the client would wait as long as ctx lasts).
	wctx, cancel := context.WithTimeout(ctx, t.dialTimeout)
	rep, err := t.store.UpdateReported(wctx, dev, patch, key, int64(token))
	cancel()
	switch {
	case err == nil:
		t.stats.written.Add(1)
		return &rep, true
	case errors.Is(err, shadow.ErrFenced):
		t.fenced(dev, token, err)
		return nil, false
	case ctx.Err() != nil:
		return nil, false
	case errors.Is(err, shadow.ErrInvalid):
		t.stats.errors.Add(1)
		t.log.Error("twin: reported patch refused as invalid", "device", dev, "err", err)
		return nil, false
	}
	if t.cache == nil {
		// The next round reads reported again and sends what is still
		// missing: the device answers a setting it has as a new command,
		// which changes nothing.
		t.stats.errors.Add(1)
		t.log.Warn("twin: reported not written", "device", dev, "token", token, "err", err)
		return nil, true
	}
	if _, qerr := t.cache.Enqueue(dev, patch); qerr != nil {
		t.stats.errors.Add(1)
		t.log.Error("twin: reported not written and not queued", "device", dev, "err", errors.Join(err, qerr))
		return nil, true
	}
	t.stats.queued.Add(1)
	t.log.Warn("twin: reported queued in the cache until etcd is back", "device", dev, "token", token, "err", err)
	return nil, true
}

// flushReported pushes dev's queued reported patches (twin cache) under
// the token the agent holds now. It reports whether the queue is empty.
func (t *twins) flushReported(ctx context.Context, dev string) bool {
	if t.cache == nil {
		return true
	}
	if ps, err := t.cache.Pending(dev); err == nil && len(ps) == 0 {
		return true
	}
	var token fence.Token
	fenced, err := t.cache.Flush(ctx, t.store, func(d string) (string, int64, bool) {
		if d != dev {
			return "", 0, false
		}
		k, tok, ok := t.holding(d)
		token = tok
		return k, int64(tok), ok
	})
	if len(fenced) > 0 {
		// Not the holder under this token: the patches are dropped, the
		// next holder reconciles from what etcd has.
		t.fenced(dev, token, err)
		if derr := t.cache.Discard(dev, 0); derr != nil {
			t.log.Warn("twin: discard queued reported patches", "device", dev, "err", derr)
		}
		return false
	}
	if err != nil {
		t.log.Warn("twin: flush queued reported patches", "device", dev, "err", err)
		return false
	}
	return true
}

// ReportState writes a device's own state report into its reported state,
// if the agent holds the device: fenced by the holder's lock key and token
// like every reported write (I5). A report that differs from desired shows
// up as delta; nothing is sent until desired is written again (see the
// rule at the top of this file). It returns ErrNotHolder if the agent does not hold
// the device, and an error wrapping shadow.ErrFenced if etcd refused it.
func (a *Agent) ReportState(ctx context.Context, dev string, fields map[string]any) error {
	if a.twin == nil {
		return fmt.Errorf("report %s: twins are off", dev)
	}
	return a.twin.reportState(ctx, dev, fields)
}

// reportState is ReportState with twins on.
func (t *twins) reportState(ctx context.Context, dev string, fields map[string]any) error {
	if !t.known[dev] {
		return fmt.Errorf("report %q: %w", dev, ErrUnknownDevice)
	}
	key, token, ok := t.holding(dev)
	if !ok {
		return fmt.Errorf("report %s: %w", dev, ErrNotHolder)
	}
	if _, err := t.store.UpdateReported(ctx, dev, fields, key, int64(token)); err != nil {
		if errors.Is(err, shadow.ErrFenced) {
			t.fenced(dev, token, err)
		} else {
			t.stats.errors.Add(1)
		}
		return fmt.Errorf("report %s: %w", dev, err)
	}
	t.stats.reports.Add(1)
	return nil
}

// DeviceState hands the agent a state report the device published on its
// own (the MQTT state topic), as a JSON-like object in shadow.Normalize's
// form. It does not block: the device's twin worker writes the latest report
// (a newer one replaces one not yet written) with ReportState's rule — only
// while the agent holds the device, only the fields that differ from
// reported, fenced (I5) — and a report never causes a command by itself.
// Reports for devices the agent does not know, or while twins are off, are
// ignored by the twin. A report's "fw" field goes to the firmware job
// runner (fwjobs.go) for every configured device, held or not.
func (a *Agent) DeviceState(dev string, fields map[string]any) {
	a.firmwareReport(dev, fields) // every configured device, held or not (fwjobs.go)
	if a.twin != nil {
		a.twin.deviceState(dev, fields)
	}
}

// deviceState is DeviceState with twins on.
func (t *twins) deviceState(dev string, fields map[string]any) {
	if !t.known[dev] {
		return
	}
	if _, _, ok := t.holding(dev); !ok {
		return // another holder writes it
	}
	t.mu.Lock()
	td := t.dev(dev)
	if progressOnly(td.written, fields) {
		t.mu.Unlock()
		return // download progress: written a tenth of the image at a time (twinprogress.go)
	}
	td.report, td.written = fields, fields
	t.mu.Unlock()
	t.kick(dev)
}

// takeReport returns dev's device report not yet written, if any, and
// clears it.
func (t *twins) takeReport(dev string) map[string]any {
	t.mu.Lock()
	defer t.mu.Unlock()
	report := t.dev(dev).report
	t.dev(dev).report = nil
	return report
}

// writeDeviceReport writes the fields of a device report that differ from
// reported. With a twin cache, patches queued before it are pushed first,
// and if etcd cannot be reached within etcd.dial_timeout the report is
// queued behind them (whole: what differs from reported is not known), so
// that reports reach etcd in the order the device made them.
func (t *twins) writeDeviceReport(ctx context.Context, dev string, fields map[string]any) {
	wctx := ctx
	if t.cache != nil {
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, t.dialTimeout)
		defer cancel()
		if !t.flushReported(wctx, dev) {
			if ctx.Err() == nil {
				t.queueReport(dev, fields)
			}
			return
		}
	}
	rep, err := t.store.LastReported(wctx, dev)
	if err != nil {
		if t.cache != nil && ctx.Err() == nil {
			t.queueReport(dev, fields)
			return
		}
		t.stats.errors.Add(1)
		t.log.Warn("twin: device report not written: read reported", "device", dev, "err", err)
		return
	}
	patch := shadow.Delta(fields, rep.Fields)
	if len(patch) == 0 {
		return
	}
	err = t.reportState(wctx, dev, patch)
	if err == nil {
		// The report moved reported: a local change shows as delta
		// (which the reconciler leaves alone), a catching-up one clears it.
		t.mu.Lock()
		desired, have := t.dev(dev).desired, t.dev(dev).haveDesired
		t.mu.Unlock()
		if have {
			t.setDelta(dev, shadow.Delta(desired.Fields, shadow.Merge(rep.Fields, patch)))
		}
	}
	switch {
	case err == nil || errors.Is(err, ErrNotHolder) || errors.Is(err, shadow.ErrFenced):
	case t.cache != nil && ctx.Err() == nil && !errors.Is(err, shadow.ErrInvalid):
		// Perhaps written after all: pushing it again changes nothing.
		t.queueReport(dev, patch)
	default:
		t.log.Warn("twin: device report not written", "device", dev, "err", err)
	}
}

// queueReport queues a device report (or the part of it that differs from
// reported) in the twin cache, if the agent may still write dev's reported
// state: flushReported pushes it, fenced, once etcd is back.
func (t *twins) queueReport(dev string, fields map[string]any) {
	if _, _, ok := t.holding(dev); !ok {
		return // not the holder, or fenced: the holder writes it
	}
	if _, err := t.cache.Enqueue(dev, fields); err != nil {
		t.stats.errors.Add(1)
		t.log.Error("twin: device report not written and not queued", "device", dev, "err", err)
		return
	}
	t.stats.queued.Add(1)
	t.log.Warn("twin: device report queued in the cache until etcd is back", "device", dev)
}
