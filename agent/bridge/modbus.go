package bridge

// Modbus devices (issue 14): PLCs, meters and drives that speak Modbus RTU
// on an RS-485 line or Modbus TCP, several units on one bus. The fence is
// the same as for every device of the bridge — decode, admit through the
// table before the PUBACK, a per-device FIFO worker, applied-marks — and
// what changes is the wire:
//
//   - a device is a unit on a bus (Device.Modbus): one modbus.Bus per RTU
//     line or TCP endpoint serialises the transactions of all its units, so
//     a dead unit costs the others at most one timeout per transaction;
//   - a command becomes one or more transactions (profile.Op): with a device
//     profile, twin.set writes desired fields and the profile's command kinds
//     run its writes; without one, the raw register kinds of
//     modbus.CommandPDU;
//   - RTU has no transaction id, so a lost answer leaves a write's fate
//     unknown: a read, or a write the profile marks idempotent (an absolute
//     value), is sent again up to Bus.Retries times; any other write never
//     is, and its command ends fence.Unknown — terminal, never repeated, for
//     the operator to check. A request that never reached the line
//     (modbus.ErrNotSent: the port is down, the connection refused) is sent
//     again until the command's timeout, and a unit that says it is busy is
//     asked again: neither applied anything;
//   - a write whose op asks for verification is read back;
//   - reported fields of the profile are polled (poll.go).

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/internal/backoff"
	"github.com/edgefence/edgefence/shadow"
	"github.com/edgefence/edgefence/transport/modbus"
	"github.com/edgefence/edgefence/transport/modbus/profile"
)

// KindTwinSet is the twin reconciler's command kind (agent.KindTwinSet):
// its body is a twin delta (shadow.EncodeCBOR), whose fields a profile
// maps to register writes.
const KindTwinSet = "twin.set"

// DefaultPollUtilisation is Bus.PollUtilisation's default.
const DefaultPollUtilisation = 0.5

// Bus is one Modbus bus of the bridge's Modbus devices: an RS-485 line
// (BusConfig.RTU) or a TCP endpoint (BusConfig.TCP).
type Bus struct {
	modbus.BusConfig
	// Retries is how many more times a read, or a write its profile marks
	// idempotent, is sent after its answer was lost (timeout, CRC error, an
	// answer from another unit) or the unit said it was busy. A write that
	// is not idempotent is never sent twice.
	Retries int
	// PollUtilisation caps the share of the bus's time that polls of
	// reported fields may take, in (0, 1]; 0 means
	// DefaultPollUtilisation. Commands are not capped.
	PollUtilisation float64
}

// ModbusUnit places a device on a Modbus bus.
type ModbusUnit struct {
	Bus  string // a Config.Buses name
	Unit byte   // 1..247: 0 is broadcast, which nobody answers, so never fenced
	// Profile maps the device's twin fields and command kinds to its
	// registers. nil: the raw register kinds (modbus.CommandPDU).
	Profile *profile.Profile
}

// mbBus is one open bus and its poll gate.
type mbBus struct {
	cfg Bus
	bus *modbus.Bus

	// gate holds one token: a poll takes it, so one poll at a time runs on
	// the bus, and gives it back with next, the earliest start of the next
	// poll, set so that polls use at most cfg.PollUtilisation of the time.
	gate chan time.Time

	mu       sync.Mutex
	polls    uint64
	pollBusy time.Duration
}

// mbDev is a device's place on its bus, and what its poller saw.
type mbDev struct {
	bus  *mbBus
	unit byte
	prof *profile.Profile

	mu        sync.Mutex
	polls     uint64
	pollErrs  uint64
	lastPoll  time.Time // last poll answered
	lastErr   string    // last poll's or command's error, "" after a success
	lastErrAt time.Time

	pubFailing atomic.Bool // the last state report could not be published (poller only)
}

// checkBuses validates the buses and the Modbus devices' places on them.
func (b *Bridge) checkBuses() error {
	b.buses = make(map[string]*mbBus, len(b.cfg.Buses))
	for i, c := range b.cfg.Buses {
		if c.Name == "" || b.buses[c.Name] != nil {
			return fmt.Errorf("%w: buses[%d]: name %q empty or not unique", ErrConfig, i, c.Name)
		}
		if (c.RTU == nil) == (c.TCP == "") {
			return fmt.Errorf("%w: bus %s: exactly one of RTU and TCP", ErrConfig, c.Name)
		}
		if c.RTU != nil {
			if err := c.RTU.Validate(); err != nil {
				return fmt.Errorf("%w: bus %s: %w", ErrConfig, c.Name, err)
			}
		}
		if c.PollUtilisation == 0 {
			c.PollUtilisation = DefaultPollUtilisation
		}
		if c.Retries < 0 || c.PollUtilisation < 0 || c.PollUtilisation > 1 {
			return fmt.Errorf("%w: bus %s: retries %d, poll utilisation %g (want ≥ 0 and in (0, 1])", ErrConfig, c.Name, c.Retries, c.PollUtilisation)
		}
		if c.Logger == nil {
			c.Logger = b.log.With("bus", c.Name)
		}
		g := make(chan time.Time, 1)
		g <- time.Time{}
		b.buses[c.Name] = &mbBus{cfg: c, gate: g}
	}
	units := map[string]string{}
	for _, p := range b.devices {
		u := p.dev.Modbus
		if u == nil {
			continue
		}
		bus := b.buses[u.Bus]
		switch at := fmt.Sprintf("%s/%d", u.Bus, u.Unit); {
		case bus == nil:
			return fmt.Errorf("%w: device %s: no bus %q", ErrConfig, p.dev.ID, u.Bus)
		case u.Unit < 1 || u.Unit > 247:
			return fmt.Errorf("%w: device %s: unit %d not in 1..247", ErrConfig, p.dev.ID, u.Unit)
		case units[at] != "":
			return fmt.Errorf("%w: devices %s and %s are both unit %d on bus %s", ErrConfig, units[at], p.dev.ID, u.Unit, u.Bus)
		default:
			units[at] = p.dev.ID
		}
		p.mb = &mbDev{bus: bus, unit: u.Unit, prof: u.Profile}
	}
	return nil
}

// openBuses opens every bus (Start). A bus whose port or endpoint is not
// there yet is logged: its bus keeps trying, and the other buses serve.
func (b *Bridge) openBuses() error {
	for name, m := range b.buses {
		bus, err := modbus.OpenBus(m.cfg.BusConfig)
		if bus == nil {
			b.closeBuses()
			return fmt.Errorf("bridge: bus %s: %w", name, err)
		}
		if err != nil {
			b.log.Warn("modbus bus not there; its commands wait for it", "bus", name, "err", err)
		}
		m.bus = bus
	}
	return nil
}

func (b *Bridge) closeBuses() {
	for _, m := range b.buses {
		if m.bus != nil {
			m.bus.Close()
		}
	}
}

// plan turns an envelope into the transactions of its command, or an error
// wrapping fence.ErrInvalid (answered Invalid before admission).
func (m *mbDev) plan(env *fence.Envelope) ([]profile.Op, error) {
	if m.prof == nil {
		q, err := modbus.CommandPDU(env)
		if err != nil {
			return nil, err
		}
		// An absolute register write can be sent again; so can a read.
		return []profile.Op{{Req: q, Idempotent: true}}, nil
	}
	switch env.Kind {
	case modbus.KindWriteRegister, modbus.KindWriteRegisters, modbus.KindReadRegisters:
		return nil, fmt.Errorf("%w: kind %s: the device has profile %s: send one of its kinds or twin.set", fence.ErrInvalid, env.Kind, m.prof.Model)
	case KindTwinSet:
		fields, err := shadow.DecodeCBOR(env.Body, shadow.Limits{})
		if err != nil {
			return nil, fmt.Errorf("%w: twin.set body: %w", fence.ErrInvalid, err)
		}
		return m.prof.PlanFields(fields)
	}
	var body map[string]any
	if len(env.Body) > 0 {
		if err := fence.DecodeBody(env.Body, &body); err != nil {
			return nil, err
		}
	}
	return m.prof.PlanCommand(env.Kind, body)
}

// transactBus runs one admitted command on a Modbus device: its
// transactions in order, each with the retries it may have.
func (b *Bridge) transactBus(p *port, j *job) (result, string, *modbus.Response) {
	ctx, cancel := context.WithTimeout(b.ctx, b.cfg.CommandTimeout)
	defer cancel()
	if j.verify {
		if res, reason, done := b.recheck(ctx, p, j); done {
			return res, reason, nil
		}
	}
	var last *modbus.Response
	for i, op := range j.ops {
		r, err := b.runOp(ctx, p, op)
		if err == nil && op.Verify && op.Req.IsWrite() {
			// A read-back that differs fails the command; one that gets no
			// answer does not: the unit's own answer confirmed the write.
			if verr := b.verifyOp(ctx, p, op); errors.Is(verr, errVerify) {
				err = verr
			} else if verr != nil && b.ctx.Err() == nil {
				b.log.Warn("modbus: write answered, its read-back failed", "device", p.dev.ID, "id", j.env.ID, "op", opName(op), "err", verr)
			}
		}
		if err != nil {
			if b.ctx.Err() != nil {
				return resStopped, "", nil // delivered again, read back first, at the next start
			}
			res, reason := b.opFailed(p, j, i, err)
			p.mb.noteErr(reason)
			return res, reason, nil
		}
		last = r
	}
	p.mb.noteErr("")
	return resApplied, "", last
}

// runOp runs one transaction, sending it again only where that cannot apply
// it twice. Once a request of it went out and its answer was lost, its
// failure is a *lostError (fate unknown), however the later attempts end:
// not sent, refused, or cut short by the command's timeout.
func (b *Bridge) runOp(ctx context.Context, p *port, op profile.Op) (*modbus.Response, error) {
	m := p.mb
	again := !op.Req.IsWrite() || op.Idempotent
	// Between attempts: 20 ms doubling to 1 s, jittered (a bus whose
	// port is down is asked again until the command's timeout).
	delay := backoff.Backoff{Min: 20 * time.Millisecond, Max: time.Second, Jitter: backoff.Equal}
	sent, lost := 0, 0 // requests that went out; answers of them lost
	giveUp := func(err error) error {
		if lost > 0 {
			return &lostError{err: err, sent: sent, lost: lost, again: again}
		}
		return err
	}
	for {
		r, err := m.bus.bus.Transact(ctx, m.unit, op.Req)
		if err == nil {
			return r, nil
		}
		if !errors.Is(err, modbus.ErrNotSent) && !errors.Is(err, modbus.ErrClosed) {
			sent++
		}
		if errors.Is(err, modbus.ErrTimeout) {
			lost++
		}
		var ex *modbus.ExceptionError
		busy := errors.As(err, &ex) && ex.Code == modbus.ExDeviceBusy
		switch {
		case ctx.Err() != nil || errors.Is(err, modbus.ErrClosed):
			return nil, giveUp(err)
		case errors.Is(err, modbus.ErrNotSent):
			// Nothing reached the line: send it again, until the timeout.
		case busy && sent <= m.bus.cfg.Retries:
			// Not applied: ask again later.
		case errors.Is(err, modbus.ErrException):
			return r, giveUp(err)
		case again && sent <= m.bus.cfg.Retries:
			b.log.Info("modbus: answer lost; sending again (a read, or an idempotent write)", "device", p.dev.ID,
				"bus", m.bus.cfg.Name, "unit", m.unit, "function", op.Req.Func, "addr", op.Req.Addr, "attempt", sent+1, "err", err)
		default:
			return nil, giveUp(err)
		}
		if !backoff.Sleep(ctx, delay.Next()) {
			return nil, giveUp(err)
		}
	}
}

// lostError is an op given up on after an answer to it was lost: if a
// write, its fate is unknown.
type lostError struct {
	err        error // the last attempt's
	sent, lost int   // requests sent; answers of them lost
	again      bool  // the op could be sent again (a read, an idempotent write)
}

func (e *lostError) Error() string {
	switch {
	case !e.again:
		return fmt.Sprintf("no answer, and the write is not idempotent, so it was not sent again: %v", e.err)
	case e.lost == e.sent && errors.Is(e.err, modbus.ErrTimeout):
		return fmt.Sprintf("no answer after %d attempts: %v", e.sent, e.err)
	default:
		return fmt.Sprintf("no answer to %d of %d attempts sent, then: %v", e.lost, e.sent, e.err)
	}
}

func (e *lostError) Unwrap() error { return e.err }

// errVerify means a write's read-back did not hold what was written.
var errVerify = errors.New("read back differs from the write")

// verifyOp reads back what op wrote.
func (b *Bridge) verifyOp(ctx context.Context, p *port, op profile.Op) error {
	same, got, err := b.readBack(ctx, p, op)
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	if !same {
		return fmt.Errorf("%w: wrote %v at %d, read %v", errVerify, op.Req.Values, op.Req.Addr, got)
	}
	return nil
}

// readBack reports whether the device holds what the write op puts there.
func (b *Bridge) readBack(ctx context.Context, p *port, op profile.Op) (bool, []uint16, error) {
	r, err := b.runOp(ctx, p, profile.Op{Req: op.ReadBack()})
	if err != nil {
		return false, nil, err
	}
	return op.Matches(r), r.Values, nil
}

// recheck handles the oldest command a previous process admitted and did
// not see applied: it may have reached the device. If every write of it is
// found applied it is done (resFound); if it is not and one of its writes
// may not be sent twice, its fate is unknown; otherwise (done false) it is
// run.
func (b *Bridge) recheck(ctx context.Context, p *port, j *job) (result, string, bool) {
	writes, unsafe := 0, false
	for _, op := range j.ops {
		if op.Req.IsWrite() {
			writes++
			unsafe = unsafe || !op.Idempotent
		}
	}
	for _, op := range j.ops {
		if !op.Req.IsWrite() {
			continue
		}
		same, _, err := b.readBack(ctx, p, op)
		if err != nil || !same {
			if unsafe {
				return resUnknown, "admitted before the restart, may have reached the device, and not idempotent: not sent again", true
			}
			return 0, "", false
		}
	}
	if writes == 0 {
		return 0, "", false
	}
	b.log.Info("command admitted before the restart was already applied", "device", p.dev.ID, "id", j.env.ID)
	return resFound, "", true
}

// opFailed turns the failure of j's op i into the command's result.
func (b *Bridge) opFailed(p *port, j *job, i int, err error) (result, string) {
	op := j.ops[i]
	what := opName(op)
	var prefix string
	if i > 0 {
		done := make([]string, 0, i)
		for _, o := range j.ops[:i] {
			done = append(done, opName(o))
		}
		prefix = fmt.Sprintf("partly applied: %s done; ", strings.Join(done, ", "))
	}
	where := fmt.Sprintf("unit %d on bus %s", p.mb.unit, p.mb.bus.cfg.Name)
	var lost *lostError
	switch {
	case errors.As(err, &lost) && op.Req.IsWrite(): // before an exception: an earlier attempt may have been applied
		b.serialErr.Add(1)
		b.log.Warn("modbus: write's answer lost; fate unknown, not repeated", "device", p.dev.ID, "bus", p.mb.bus.cfg.Name,
			"unit", p.mb.unit, "id", j.env.ID, "op", what, "err", err)
		return resUnknown, fmt.Sprintf("%sfate unknown: %s of %s: %v", prefix, what, where, err)
	case errors.Is(err, modbus.ErrException):
		b.devErr.Add(1)
		return resRefused, fmt.Sprintf("%s%s refused %s: %v", prefix, where, what, err)
	case errors.Is(err, errVerify):
		b.devErr.Add(1)
		return resRefused, fmt.Sprintf("%s%s: %s: %v", prefix, where, what, err)
	default:
		// Not sent (the port stayed down), a read that got no answer, a
		// verification read lost: nothing of op was applied by us.
		b.serialErr.Add(1)
		return resRefused, fmt.Sprintf("%snot done: %s of %s: %v", prefix, what, where, err)
	}
}

// opName names an op for reasons and logs.
func opName(op profile.Op) string {
	if op.Field != "" {
		return "field " + op.Field
	}
	return fmt.Sprintf("function 0x%02x at %d", op.Req.Func, op.Req.Addr)
}

// noteErr records the outcome of a command for the device's status: why
// it failed, or "" for a success.
func (m *mbDev) noteErr(reason string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lastErr = reason
	if reason != "" {
		m.lastErrAt = time.Now()
	}
}
