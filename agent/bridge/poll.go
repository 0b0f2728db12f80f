package bridge

// Polling the reported fields of Modbus devices: a device with a profile
// has a poller that reads its reported fields (profile.PollBlocks: fields
// of one table and interval coalesced into reads), decodes them and, when a
// value changed, publishes the changed fields as a state report on the
// device's state topic — signed with the gateway's key when it has one, and
// bound to the device's mark in the fence table — for the device's holder
// to write to the twin's reported state under its own token (I5). The
// holder writes only what differs from reported, so repeating a value
// costs a message, not an etcd write: every fullReportEvery, and at the
// first poll after the table saw a new holder's token (a holder that just
// took over dropped the reports from before it held the device), all
// fields are sent again.
//
// Polls share the bus with commands, at most Bus.PollUtilisation of its
// time: one poll runs at a time on a bus, and the next may start only once
// the bus was free of polls for as long as (1/share − 1) times the last
// poll took. Commands are not capped, and wait behind at most the one poll
// in progress.

import (
	"context"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/internal/backoff"
	"github.com/edgefence/edgefence/shadow"
	"github.com/edgefence/edgefence/transport/modbus"
	"github.com/edgefence/edgefence/transport/modbus/profile"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// fullReportEvery is how often a poller reports every field, changed or
// not.
const fullReportEvery = 30 * time.Second

// marker is what the bridge reads of the table to bind state reports to the
// device's mark; *fence.Table has it.
type marker interface {
	Get(device string) (fence.Record, bool, error)
}

// poll runs p's poller until the bridge closes.
func (b *Bridge) poll(p *port) {
	m := p.mb
	blocks := m.prof.PollBlocks()
	if len(blocks) == 0 {
		return
	}
	due := make([]time.Time, len(blocks))
	last := map[string]any{}
	var lastFull time.Time
	var lastToken fence.State // the full report goes again when the token or the epoch moves
	for {
		i := 0
		for k := range due {
			if due[k].Before(due[i]) {
				i = k
			}
		}
		if !sleepUntil(b.ctx, due[i]) || !m.bus.takeGate(b.ctx) {
			return
		}
		start := time.Now()
		ctx, cancel := context.WithTimeout(b.ctx, b.cfg.CommandTimeout)
		r, err := m.bus.bus.Transact(ctx, m.unit, blocks[i].Req)
		cancel()
		m.bus.giveGate(start, time.Since(start))
		due[i] = start.Add(blocks[i].Interval)
		if b.ctx.Err() != nil {
			return
		}
		fields, err := b.polled(p, blocks[i], r, err)
		if err != nil {
			continue
		}
		// last holds what was reported: a report that could not be
		// published (the broker away) is sent again with the next poll.
		changed := map[string]any{}
		for k, v := range fields {
			if old, ok := last[k]; !ok || !reflect.DeepEqual(old, v) {
				changed[k] = v
			}
		}
		full := time.Since(lastFull) > fullReportEvery
		if st := b.stateOf(p.dev.ID); st.Mark.Token != lastToken.Mark.Token || st.Epoch != lastToken.Epoch {
			full, lastToken = true, st
		}
		if full {
			changed = maps.Clone(last)
			maps.Copy(changed, fields)
		}
		if len(changed) > 0 && b.publishState(p, changed) == nil {
			maps.Copy(last, changed)
			if full {
				lastFull = time.Now()
			}
		}
	}
}

// polled records one poll's outcome and decodes its fields.
func (b *Bridge) polled(p *port, blk profile.Block, r *modbus.Response, err error) (map[string]any, error) {
	var fields map[string]any
	if err == nil {
		fields, err = p.mb.prof.Decode(blk, r)
	}
	m := p.mb
	m.mu.Lock()
	m.polls++
	first := err != nil && m.lastErr == ""
	if err != nil {
		m.pollErrs++
		m.lastErr, m.lastErrAt = "poll: "+err.Error(), time.Now()
	} else {
		m.lastPoll = time.Now()
		m.lastErr = ""
	}
	m.mu.Unlock()
	if first { // one line per failing stretch, not one per poll
		b.log.Warn("modbus: poll failed", "device", p.dev.ID, "bus", m.bus.cfg.Name, "unit", m.unit, "fields", blk.Fields, "err", err)
	}
	return fields, err
}

// publishState publishes fields as p's state report.
func (b *Bridge) publishState(p *port, fields map[string]any) error {
	raw, err := shadow.EncodeCBOR(fields, shadow.Limits{})
	if err == nil && b.cfg.Signer != nil {
		st := b.stateOf(p.dev.ID)
		raw, err = b.cfg.Signer.SignState(&auth.StateReport{Device: p.dev.ID, Token: st.Mark.Token, Seq: st.Mark.Seq, Epoch: st.Epoch,
			Counter: b.reports.Add(1), State: raw})
	}
	if err == nil {
		ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
		err = b.client.Publish(ctx, mqtt.Message{Topic: b.cfg.Topics.State(p.dev.ID), Payload: raw})
		cancel()
	}
	// One WARN line per failing stretch (the broker away: every poll
	// would fail), the rest at DEBUG.
	m := p.mb
	switch {
	case err != nil && b.ctx.Err() == nil:
		b.ackErr.Add(1)
		lvl := slog.LevelDebug
		if !m.pubFailing.Swap(true) {
			lvl = slog.LevelWarn
		}
		b.log.Log(b.ctx, lvl, "publish state report; sent again with the next poll", "device", p.dev.ID, "err", err)
	case err == nil && m.pubFailing.Swap(false):
		b.log.Info("state reports published again", "device", p.dev.ID)
	}
	return err
}

// stateOf returns dev's epoch and mark in the table (zero if the table
// cannot say).
func (b *Bridge) stateOf(dev string) fence.State {
	t, ok := b.cfg.Table.(marker)
	if !ok {
		return fence.State{}
	}
	r, found, err := t.Get(dev)
	if err != nil || !found {
		return fence.State{}
	}
	return fence.State{Epoch: r.Epoch, Mark: r.Mark}
}

// takeGate waits for the bus's poll token and for the time it allows.
func (m *mbBus) takeGate(ctx context.Context) bool {
	select {
	case <-ctx.Done():
		return false
	case next := <-m.gate:
		if sleepUntil(ctx, next) {
			return true
		}
		m.gate <- next
		return false
	}
}

// giveGate gives the token back after a poll that started at start and
// took d.
func (m *mbBus) giveGate(start time.Time, d time.Duration) {
	m.mu.Lock()
	m.polls++
	m.pollBusy += d
	m.mu.Unlock()
	idle := time.Duration(float64(d) * (1/m.cfg.PollUtilisation - 1))
	m.gate <- start.Add(d + idle)
}

// sleepUntil waits until t, or reports false if ctx ends first.
func sleepUntil(ctx context.Context, t time.Time) bool {
	return backoff.Sleep(ctx, time.Until(t))
}

// BusStatus is one Modbus bus as the operator sees it.
type BusStatus struct {
	Name      string          `json:"name"`
	Transport string          `json:"transport"` // rtu or tcp
	Target    string          `json:"target"`    // the port path or host:port
	Stats     modbus.BusStats `json:"stats"`
	Polls     uint64          `json:"polls"`
	// PollBusy is the time polls took; PollCap the share they may take.
	PollBusy time.Duration `json:"poll_busy_ns"`
	PollCap  float64       `json:"poll_utilisation_cap"`
}

// UnitStatus is one Modbus device as the operator sees it.
type UnitStatus struct {
	Device    string    `json:"device"`
	Bus       string    `json:"bus"`
	Unit      byte      `json:"unit"`
	Profile   string    `json:"profile,omitempty"`
	Polls     uint64    `json:"polls"`
	PollErrs  uint64    `json:"poll_errors"`
	LastPoll  time.Time `json:"last_poll,omitzero"`
	LastError string    `json:"last_error,omitempty"`
	ErrorAt   time.Time `json:"last_error_at,omitzero"`
}

// Buses returns the Modbus buses' status, by name.
func (b *Bridge) Buses() []BusStatus {
	out := make([]BusStatus, 0, len(b.buses))
	for _, m := range b.buses {
		s := BusStatus{Name: m.cfg.Name, Transport: "tcp", Target: m.cfg.TCP, PollCap: m.cfg.PollUtilisation}
		if m.cfg.RTU != nil {
			s.Transport, s.Target = "rtu", m.cfg.RTU.Path
		}
		if m.bus != nil {
			s.Stats = m.bus.Stats()
		}
		m.mu.Lock()
		s.Polls, s.PollBusy = m.polls, m.pollBusy
		m.mu.Unlock()
		out = append(out, s)
	}
	sortBy(out, func(s BusStatus) string { return s.Name })
	return out
}

// Units returns the Modbus devices' status, by device id.
func (b *Bridge) Units() []UnitStatus {
	var out []UnitStatus
	for _, p := range b.devices {
		m := p.mb
		if m == nil {
			continue
		}
		s := UnitStatus{Device: p.dev.ID, Bus: m.bus.cfg.Name, Unit: m.unit}
		if m.prof != nil {
			s.Profile = m.prof.Model
		}
		m.mu.Lock()
		s.Polls, s.PollErrs, s.LastPoll, s.LastError, s.ErrorAt = m.polls, m.pollErrs, m.lastPoll, m.lastErr, m.lastErrAt
		m.mu.Unlock()
		out = append(out, s)
	}
	sortBy(out, func(s UnitStatus) string { return s.Device })
	return out
}

func sortBy[T any](s []T, key func(T) string) {
	slices.SortFunc(s, func(a, b T) int { return strings.Compare(key(a), key(b)) })
}

// Status is what the bridge reports in the agent's status: its counters,
// and its Modbus buses and devices.
type Status struct {
	Stats
	Buses []BusStatus  `json:"buses,omitempty"`
	Units []UnitStatus `json:"units,omitempty"`
}

// Status returns the bridge's status.
func (b *Bridge) Status() Status {
	return Status{Stats: b.Stats(), Buses: b.Buses(), Units: b.Units()}
}
