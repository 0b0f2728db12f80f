package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/history"
	"github.com/edgefence/edgefence/offline"
)

// Fan-out: one request commands many devices (POST /v1/fanout, `edgefence
// send --devices/--selector`). Each selected device still gets its own
// envelope, under its own token and its next seq, stored in the outbox
// before its worker may send it (I4); what the fan-out shares is the
// commit: the entries of up to FanoutChunk devices are appended in one
// outbox transaction (one fsync), so a fan-out to 10,000 devices costs
// about ten fsyncs, not 10,000. A device the agent cannot command (unknown,
// not held, its queue full) is reported with its reason; the others go on.

// MaxFanoutDevices caps the devices one fan-out may select.
const MaxFanoutDevices = 50_000

// FanoutChunk is how many devices' entries one outbox commit of a fan-out
// takes. A chunk holds its devices' seq order (device.sem) while it is
// built and committed, so that concurrent sends to them wait that long.
const FanoutChunk = 1024

// Fan-out outcomes, per device: the verdicts (verdictNames), queued (stored,
// no verdict yet) and refused (by the agent: not issued).
var fanoutOutcomes = [...]string{"accepted", "duplicate", "stale", "invalid", "expired", "unknown", "queued", "refused"}

// Outcome returns r's outcome: its verdict, "queued" (stored in the
// outbox, no verdict yet) or "refused" (the agent did not issue it).
func (r *SendResult) Outcome() string {
	switch {
	case r.Verdict != "":
		return r.Verdict
	case r.Queued:
		return "queued"
	}
	return "refused"
}

// FanoutSummary is the last line of a fan-out's answer.
type FanoutSummary struct {
	Devices   int            `json:"devices"`    // selected
	ByOutcome map[string]int `json:"by_outcome"` // outcome → devices
	Commits   uint64         `json:"commits"`    // outbox commits the fan-out's appends took
	IssuedMs  float64        `json:"issued_ms"`  // request → every entry stored
	ElapsedMs float64        `json:"elapsed_ms"` // request → the last outcome
}

// fanoutStats are the fan-out counters (edgefence_fanout_*).
type fanoutStats struct {
	requests atomic.Uint64
	devices  [len(fanoutOutcomes)]atomic.Uint64
}

func (s *fanoutStats) counts() (req uint64, devs [len(fanoutOutcomes)]uint64) {
	for i := range s.devices {
		devs[i] = s.devices[i].Load()
	}
	return s.requests.Load(), devs
}

// SelectDevices returns the device ids sel selects (Selection.resolve),
// at most MaxFanoutDevices; an error wraps ErrSelection.
func (a *Agent) SelectDevices(sel Selection) ([]string, error) {
	devs, err := sel.resolve(a.cfg.Devices)
	if err != nil {
		return nil, err
	}
	if len(devs) > MaxFanoutDevices {
		return nil, fmt.Errorf("%w: %s selects %d devices; a fan-out takes at most %d", ErrSelection, sel, len(devs), MaxFanoutDevices)
	}
	return devs, nil
}

// FanOut issues one command of kind with body to each of devs (from
// SelectDevices) and reports each device's outcome through report, one
// call at a time, as the outcomes arrive: refusals while issuing, then
// (with wait) each verdict as its ack comes. Devices without a verdict
// within the command timeout after the last entry was stored (or when
// ctx ends) are reported queued: they stay in the outbox and are
// delivered. It returns the counts.
func (a *Agent) FanOut(ctx context.Context, devs []string, kind string, body []byte, wait bool, report func(SendResult)) FanoutSummary {
	start := time.Now()
	sum := FanoutSummary{Devices: len(devs), ByOutcome: map[string]int{}}
	a.fanout.requests.Add(1)
	if len(devs) >= BurstDevices {
		a.burst()
	}
	out := func(r SendResult) {
		o := r.Outcome()
		sum.ByOutcome[o]++
		if i := slices.Index(fanoutOutcomes[:], o); i >= 0 {
			a.fanout.devices[i].Add(1)
		}
		report(r)
	}
	sorted := slices.Clone(devs)
	slices.Sort(sorted) // chunks take their devices' sems in one order: no deadlock between fan-outs
	var acks chan *fence.Ack
	if wait {
		acks = make(chan *fence.Ack, len(sorted))
	}
	stored := make(map[string]*fence.Envelope, len(sorted))
	for i := 0; i < len(sorted); i += FanoutChunk {
		envs, commits := a.delivery.fanIssue(ctx, sorted[i:min(i+FanoutChunk, len(sorted))], kind, body, acks, out)
		sum.Commits += commits
		for _, env := range envs {
			stored[env.ID] = env
		}
	}
	sum.IssuedMs = ms(time.Since(start))
	if wait {
		a.delivery.fanWait(ctx, stored, acks, out)
	} else {
		for _, env := range stored {
			out(SendResult{Device: env.Device, ID: env.ID, Token: uint64(env.Token), Seq: env.Seq, Queued: true})
		}
	}
	sum.ElapsedMs = ms(time.Since(start))
	return sum
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// fanItem is one device of a chunk, held (its sem taken) with its
// envelope made.
type fanItem struct {
	d   *device
	ctl *controller
	env *fence.Envelope
}

// fanIssue issues the command to each of devs (sorted): holds each device,
// makes its envelope, appends them all in one commit, releases the
// devices and kicks their workers. acks, if not nil, is registered as the
// waiter of each envelope before the append. Refusals are reported
// through out; it returns the envelopes stored and the commits used.
func (q *delivery) fanIssue(ctx context.Context, devs []string, kind string, body []byte, acks chan *fence.Ack, out func(SendResult)) ([]*fence.Envelope, uint64) {
	items := make([]fanItem, 0, len(devs))
	for _, dev := range devs {
		d, ctl, err := q.hold(ctx, dev)
		if err != nil {
			out(SendResult{Device: dev, Error: err.Error()})
			continue
		}
		env, err := q.envelope(ctl, dev, kind, body)
		if err != nil {
			<-d.sem
			out(SendResult{Device: dev, Error: fmt.Sprintf("send to %s: %v", dev, err)})
			continue
		}
		items = append(items, fanItem{d, ctl, env})
	}
	if len(items) == 0 {
		return nil, 0
	}
	if acks != nil {
		q.mu.Lock()
		for _, it := range items {
			q.waiters[it.env.ID] = waiter{ch: acks, paced: true}
		}
		q.mu.Unlock()
	}
	only := make([]bool, len(items)) // the device's queue is empty: its entry may be hinted (hint.go)
	for i, it := range items {
		n, _ := q.outbox.Pending(it.d.id)
		only[i] = n == 0
	}
	es, errs, commits := q.fanAppend(ctx, items)
	envs := make([]*fence.Envelope, 0, len(items))
	for i, it := range items {
		if errs[i] != nil {
			it.ctl.seq-- // nothing was created
			q.unwait(it.env.ID)
			if errors.Is(errs[i], offline.ErrFull) {
				q.stats.full.Add(1)
			}
			out(SendResult{Device: it.d.id, Error: fmt.Sprintf("send to %s: %v", it.d.id, errs[i])})
		} else {
			q.hintFresh(it.d, es[i], only[i])
			q.stats.queued.Add(1)
			q.record(history.OpCreated, it.env, "", "")
			envs = append(envs, it.env)
		}
		<-it.d.sem
	}
	for i, it := range items {
		if errs[i] == nil {
			q.kick(it.d)
		}
	}
	return envs, commits
}

// fanAppend appends the items' entries in one commit. If that fails with
// ErrFull (a device's queue or the outbox is at its limit: AppendAll is
// all or none), each entry is appended alone, so that only the devices
// that do not fit are refused. It returns the entries (as stored, where
// their error is nil), each item's error and the commits made.
func (q *delivery) fanAppend(ctx context.Context, items []fanItem) ([]*offline.Entry, []error, uint64) {
	es := make([]*offline.Entry, len(items))
	for i, it := range items {
		es[i] = &offline.Entry{Envelope: *it.env}
	}
	errs := make([]error, len(items))
	err := q.outbox.AppendAll(ctx, es)
	if err == nil || !errors.Is(err, offline.ErrFull) {
		for i := range errs {
			errs[i] = err
		}
		return es, errs, 1
	}
	for i, e := range es {
		errs[i] = q.outbox.Append(ctx, e)
	}
	return es, errs, uint64(len(es))
}

// unwait drops the waiter of command id.
func (q *delivery) unwait(id string) {
	q.mu.Lock()
	delete(q.waiters, id)
	q.mu.Unlock()
}

// fanCommitEvery is how often a fan-out waiting for its verdicts asks the
// outbox to commit those left waiting (outbox.verdict_delay): its devices'
// workers do not ask one by one, so that a burst of verdicts takes a commit
// every fanCommitEvery instead of one after another.
const fanCommitEvery = 10 * time.Millisecond

// fanWait reports the verdict of each stored envelope once its ack arrives
// on acks (once it is durable: recorded), until all have one, or the
// command timeout passes, or ctx ends: the rest are reported queued.
func (q *delivery) fanWait(ctx context.Context, stored map[string]*fence.Envelope, acks chan *fence.Ack, out func(SendResult)) {
	t := time.NewTimer(q.timeout)
	defer t.Stop()
	var pace <-chan time.Time
	if q.later {
		tick := time.NewTicker(fanCommitEvery)
		defer tick.Stop()
		pace = tick.C
	}
	why := ""
	for len(stored) > 0 && why == "" {
		select {
		case <-pace:
			q.outbox.CommitSoon()
		case ack := <-acks:
			env := stored[ack.ID]
			if env == nil {
				continue // a second ack of one already reported
			}
			delete(stored, ack.ID)
			q.unwait(ack.ID)
			out(SendResult{Device: env.Device, ID: env.ID, Token: uint64(env.Token), Seq: env.Seq,
				Verdict: ack.Verdict.String(), Ack: NewAckStatus(ack)})
		case <-t.C:
			why = fmt.Sprintf("%v within %v", ErrNoAck, q.timeout)
		case <-ctx.Done():
			why = ctx.Err().Error()
		}
	}
	for id, env := range stored {
		q.unwait(id)
		out(SendResult{Device: env.Device, ID: env.ID, Token: uint64(env.Token), Seq: env.Seq, Queued: true,
			Error: fmt.Sprintf("%s: %v as %s", why, ErrQueued, id)})
	}
}
