package mqtt

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
)

// Commander is the agent side of the command path over MQTT: it publishes
// fenced envelopes to <prefix>/dev/<id>/cmd at QoS 1 and matches the Acks
// that come back on <prefix>/dev/<id>/ack by command id (also sent as MQTT v5
// correlation data). It owns its Client.
//
// A command's wait for its ack outlives a Send or Post that stops waiting
// without one (its ctx ended, Drop): it lapses, and the first ack that
// comes for the command afterwards is kept and answers the command's next
// Send or Post at once, without publishing it again — a device that
// answers later than the caller waited (a slow bus, a retry at a home
// gateway) has its first verdict heard, not its answer to the resend
// (duplicate). A lapsed wait ends when the command is sent again, or when
// another command to the same device registers (its sender keeps one
// command in flight per device, so the earlier one is settled): at most
// one lapsed wait per device.
//
// It decides nothing about admission: that is the fence point's job.
type Commander struct {
	c      *Client
	topics Topics
	log    *slog.Logger

	mu      sync.Mutex
	pending map[string]*waiting                             // by command id: waited for, or lapsed
	lapsed  map[string]string                               // device → the id of its lapsed wait
	sign    func(*fence.Envelope) ([]byte, error)           // nil: plain envelopes
	other   func(device string, ack *fence.Ack, raw []byte) // nil: unmatched acks are dropped
	check   AckCheck                                        // nil: every ack decoded, none verified
	plain   map[string]bool                                 // devices sent plain envelopes although sign is set

	acks, unmatched, badAcks, retries, refused, unsigned, late atomic.Uint64
}

// waiting is the wait for a command's ack: a Send's (ch), a Post's
// (answer), or lapsed (live false: the ack that comes is kept in ch for
// the command's next Send or Post). env is set once; answer, live and
// sends to ch are guarded by Commander.mu.
type waiting struct {
	env    *fence.Envelope
	ch     chan *fence.Ack // one ack, the first
	answer func(*fence.Ack)
	live   bool
}

// SignWith makes Send publish envelopes encoded by sign (a signed envelope,
// fence/auth's Signer.Sign) instead of plain CBOR, except to the devices
// in plain (their policy is `auth: off`), which get plain envelopes still.
// Every plain envelope published is counted (Status "unsigned"). Call it
// before the first Send.
func (m *Commander) SignWith(sign func(*fence.Envelope) ([]byte, error), plain ...string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sign = sign
	m.plain = make(map[string]bool, len(plain))
	for _, d := range plain {
		m.plain[d] = true
	}
}

// OnUnmatched makes the Commander hand every well-formed ack that answers
// no Send of its own to f, with the device its topic names and the ack as
// it arrived (signed or plain; ack is what it claims, not verified): the
// agent learns of an operator's fence reset so. f runs on the delivery
// goroutine: it must not block.
func (m *Commander) OnUnmatched(f func(device string, ack *fence.Ack, raw []byte)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.other = f
}

// AckCheck decides whether raw, an ack that names env's command, answers
// it, and returns the ack to resolve the command with; an error drops the
// ack (Send keeps waiting). The agent's checks signatures (invariant I7).
type AckCheck func(env *fence.Envelope, raw []byte) (*fence.Ack, error)

// CheckAcksWith makes every ack pass check before it can resolve the
// command it names: a refused one is dropped, and a later one (the
// device's own) still resolves it. Call it before the first Send.
func (m *Commander) CheckAcksWith(check AckCheck) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.check = check
}

// NewCommander dials the broker with cfg and subscribes to the ack topics of
// devices before the first connection, so that acks the broker queued for a
// resumed session are not lost. It does not wait for the connection.
func NewCommander(ctx context.Context, cfg Config, topics Topics, devices []string) (*Commander, error) {
	m := &Commander{topics: topics, log: cfg.Logger, pending: make(map[string]*waiting), lapsed: make(map[string]string)}
	if m.log == nil {
		m.log = slog.New(slog.DiscardHandler)
	}
	for _, d := range devices {
		if !ValidDeviceID(d) {
			return nil, fmt.Errorf("%w: device id %q", ErrInvalidConfig, d)
		}
		cfg.Subscriptions = append(cfg.Subscriptions, Subscription{Filter: topics.Ack(d), Handler: m.onAck})
	}
	c, err := Dial(ctx, cfg)
	if err != nil {
		return nil, err
	}
	m.c = c
	return m, nil
}

// Client returns the underlying client.
func (m *Commander) Client() *Client { return m.c }

// Connected reports whether the broker connection is up.
func (m *Commander) Connected() bool { return m.c.Connected() }

// AwaitConnection waits until the broker connection is up or ctx ends.
func (m *Commander) AwaitConnection(ctx context.Context) error { return m.c.AwaitConnection(ctx) }

// Close disconnects; see Client.Close.
func (m *Commander) Close(ctx context.Context) error { return m.c.Close(ctx) }

// Send publishes env to its device's command topic and waits for the Ack.
// While the broker is unreachable it waits for the connection and publishes
// again; resending the same envelope is safe, because the fence point answers
// a repeated (token, seq) as a duplicate and never applies it twice. It
// returns ctx's error if no Ack arrived in time: the command's fate is then
// unknown, and its wait lapses (see Commander): an ack that comes later
// is returned by the command's next Send, at once.
func (m *Commander) Send(ctx context.Context, env *fence.Envelope) (*fence.Ack, error) {
	w, held, msg, err := m.await(env, nil)
	if err != nil || held != nil {
		return held, err
	}
	for {
		err := m.c.Publish(ctx, msg)
		if err == nil {
			break
		}
		if !errors.Is(err, ErrNotConnected) {
			m.lapse(w)
			return nil, fmt.Errorf("publish %s: %w", msg.Topic, err)
		}
		// Not sent, or sent with the outcome unknown: wait for the broker
		// and send the same envelope again.
		m.retries.Add(1)
		m.log.Debug("broker unavailable; will resend", "device", env.Device, "id", env.ID, "err", err)
		if werr := m.c.AwaitConnection(ctx); werr != nil {
			m.lapse(w)
			return nil, fmt.Errorf("publish %s: %w (%w)", msg.Topic, werr, err)
		}
	}
	select {
	case ack := <-w.ch:
		m.end(w)
		return ack, nil
	case <-ctx.Done():
		m.lapse(w)
		return nil, fmt.Errorf("await ack for %s on %s: %w", env.ID, m.topics.Ack(env.Device), ctx.Err())
	}
}

// Post publishes env to its device's command topic, like Send, but does
// not wait for the ack: it returns once the broker has the command (its
// PUBACK), and the ack is handed to answer, once, on the MQTT delivery
// goroutine (answer must not block), if it comes before Drop(env.ID) —
// or, if an ack came for the command after an earlier wait lapsed, at
// once on the caller's goroutine before Post returns nil, without
// publishing. The caller keeps no goroutine while its command is at the
// device. An error means the command was not published, or its outcome
// is unknown (the broker went away: ErrNotConnected); answer may still be
// called if it reached the device, so the caller settles on whichever
// comes first. Post does not resend: the caller does, with the same
// envelope.
func (m *Commander) Post(ctx context.Context, env *fence.Envelope, answer func(*fence.Ack)) error {
	_, held, msg, err := m.await(env, answer)
	if err != nil {
		return err
	}
	if held != nil {
		answer(held)
		return nil
	}
	if err := m.c.Publish(ctx, msg); err != nil {
		if errors.Is(err, ErrNotConnected) {
			m.retries.Add(1)
		}
		return fmt.Errorf("publish %s: %w", msg.Topic, err)
	}
	return nil
}

// Drop stops waiting for the ack of command id (a Post's or a Send's): the
// wait lapses (see Commander), so an ack that comes later answers the
// command's next Send or Post. It reports whether a Post or Send was
// still waiting: false means a Post's answer has been (or is being)
// called, or nothing waited (not registered yet, or lapsed already).
func (m *Commander) Drop(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	w := m.pending[id]
	if w == nil || !w.live {
		return false
	}
	m.lapseLocked(w)
	return true
}

// lapse ends w's wait without its ack: w stays registered, lapsed, if it
// still is.
func (m *Commander) lapse(w *waiting) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.pending[w.env.ID] == w {
		m.lapseLocked(w)
	}
}

// lapseLocked lapses w, registered (m.mu held): the device's lapsed wait
// before it, if any, ends.
func (m *Commander) lapseLocked(w *waiting) {
	w.live, w.answer = false, nil
	dev, id := w.env.Device, w.env.ID
	if old, ok := m.lapsed[dev]; ok && old != id {
		m.forgetLocked(old)
	}
	m.lapsed[dev] = id
}

// end unregisters w, answered.
func (m *Commander) end(w *waiting) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.pending[w.env.ID] == w {
		m.forgetLocked(w.env.ID)
	}
}

// forgetLocked unregisters the wait of command id (m.mu held).
func (m *Commander) forgetLocked(id string) {
	w := m.pending[id]
	if w == nil {
		return
	}
	delete(m.pending, id)
	if m.lapsed[w.env.Device] == id {
		delete(m.lapsed, w.env.Device)
	}
}

// await encodes env and registers the wait for its ack (a Post's if
// answer is set, else a Send's): a new one, or the command's lapsed one
// taken over — and if that holds an ack already, it is returned (held)
// with the wait ended: nothing is to be published. Registering another
// command to the device ends the device's lapsed wait.
func (m *Commander) await(env *fence.Envelope, answer func(*fence.Ack)) (w *waiting, held *fence.Ack, msg Message, err error) {
	m.mu.Lock()
	encode := m.sign
	if m.plain[env.Device] {
		encode = nil
	}
	m.mu.Unlock()
	if encode == nil {
		encode = fence.MarshalEnvelope
		m.unsigned.Add(1)
	}
	payload, err := encode(env)
	if err != nil {
		return nil, nil, Message{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	switch w = m.pending[env.ID]; {
	case w != nil && w.live:
		return nil, nil, Message{}, fmt.Errorf("mqtt: command id %s already in flight", env.ID)
	case w != nil: // lapsed: take it over
		select {
		case held = <-w.ch:
			m.forgetLocked(env.ID)
			return nil, held, Message{}, nil
		default:
		}
		delete(m.lapsed, env.Device)
		w.answer, w.live = answer, true // w.env stays: the same command (onAck reads it unlocked)
	default:
		if old, ok := m.lapsed[env.Device]; ok {
			m.forgetLocked(old) // settled: its sender moved on to this one
		}
		w = &waiting{env: env, ch: make(chan *fence.Ack, 1), answer: answer, live: true}
		m.pending[env.ID] = w
	}
	return w, nil, Message{
		Topic:           m.topics.Cmd(env.Device),
		Payload:         payload,
		CorrelationData: []byte(env.ID),
		ResponseTopic:   m.topics.Ack(env.Device),
	}, nil
}

// onAck routes one ack to the Send waiting for it: the first that passes
// the AckCheck, if there is one.
func (m *Commander) onAck(msg Message) {
	ack, err := auth.ClaimedAck(msg.Payload) // plain, or signed and not yet verified
	if err != nil {
		m.badAcks.Add(1)
		m.log.Warn("dropping malformed ack", "topic", msg.Topic, "bytes", len(msg.Payload), "err", err)
		return
	}
	id := ack.ID
	if id == "" {
		id = string(msg.CorrelationData)
	}
	m.mu.Lock()
	w, check, other := m.pending[id], m.check, m.other
	m.mu.Unlock()
	if w == nil {
		// Another holder's ack on the shared topic, a redelivery after
		// the command was answered, or an operator reset's.
		m.unmatched.Add(1)
		m.log.Debug("ack for no pending command", "topic", msg.Topic, "id", id, "verdict", ack.Verdict)
		if dev, leaf, ok := m.topics.Parse(msg.Topic); ok && leaf == LeafAck && other != nil {
			other(dev, ack, msg.Payload)
		}
		return
	}
	if check != nil {
		if ack, err = check(w.env, msg.Payload); err != nil {
			// Not the device's answer to this command: it never
			// resolves it, and the device's own ack still can. The
			// check counts and logs why.
			m.refused.Add(1)
			return
		}
	}
	m.mu.Lock()
	if m.pending[id] != w { // answered by a duplicate meanwhile, or ended
		m.mu.Unlock()
		return
	}
	if answer := w.answer; answer != nil {
		m.forgetLocked(id)
		m.mu.Unlock()
		m.acks.Add(1)
		answer(ack)
		return
	}
	select {
	case w.ch <- ack:
		m.acks.Add(1)
		if !w.live {
			m.late.Add(1)
			m.log.Debug("ack after its wait ended; kept for the command's resend", "topic", msg.Topic, "id", id, "verdict", ack.Verdict)
		}
	default: // a duplicate ack; the first one counts
	}
	m.mu.Unlock()
}

// Status describes the transport for the agent's status output.
func (m *Commander) Status() map[string]any {
	s := m.c.Stats()
	m.mu.Lock()
	lapsed := len(m.lapsed)
	inflight := len(m.pending) - lapsed
	m.mu.Unlock()
	return map[string]any{
		"connected":      s.Connected,
		"subscribed":     m.c.Subscribed(), // every filter acknowledged on this connection
		"broker":         s.Broker,
		"published":      s.Published,
		"publish_errors": s.PublishErrors,
		"reconnects":     s.Reconnects,
		"acks":           m.acks.Load(),
		"acks_unmatched": m.unmatched.Load(),
		"acks_malformed": m.badAcks.Load(),
		"acks_refused":   m.refused.Load(), // by the AckCheck
		"resends":        m.retries.Load(),
		"unsigned":       m.unsigned.Load(), // sends of plain envelopes (no signer, or an `auth: off` device)
		"in_flight":      inflight,
		"acks_late":      m.late.Load(), // acks that came after their wait lapsed, kept for the resend
		"waits_lapsed":   lapsed,        // commands whose wait lapsed, their ack still awaited
		// The ceiling of the delay between reconnection attempts.
		"reconnect_backoff_max": m.c.cfg.MaxBackoff.String(),
		// Packets over max_packet_size the broker sent anyway, dropped.
		"packets_oversize": s.PacketsOversize,
		"max_packet_size":  m.c.cfg.MaxPacketSize,
	}
}
