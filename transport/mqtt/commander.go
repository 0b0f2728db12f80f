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
// It decides nothing about admission: that is the fence point's job.
type Commander struct {
	c      *Client
	topics Topics
	log    *slog.Logger

	mu      sync.Mutex
	pending map[string]*waiting
	sign    func(*fence.Envelope) ([]byte, error)           // nil: plain envelopes
	other   func(device string, ack *fence.Ack, raw []byte) // nil: unmatched acks are dropped
	check   AckCheck                                        // nil: every ack decoded, none verified
	plain   map[string]bool                                 // devices sent plain envelopes although sign is set

	acks, unmatched, badAcks, retries, refused, unsigned atomic.Uint64
}

// waiting is a Send waiting for its command's ack (ch), or a Post's
// (answer).
type waiting struct {
	env    *fence.Envelope
	ch     chan *fence.Ack
	answer func(*fence.Ack)
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
	m := &Commander{topics: topics, log: cfg.Logger, pending: make(map[string]*waiting)}
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
// unknown.
func (m *Commander) Send(ctx context.Context, env *fence.Envelope) (*fence.Ack, error) {
	w := &waiting{env: env, ch: make(chan *fence.Ack, 1)}
	msg, err := m.await(w)
	if err != nil {
		return nil, err
	}
	defer m.Drop(env.ID)
	for {
		err := m.c.Publish(ctx, msg)
		if err == nil {
			break
		}
		if !errors.Is(err, ErrNotConnected) {
			return nil, fmt.Errorf("publish %s: %w", msg.Topic, err)
		}
		// Not sent, or sent with the outcome unknown: wait for the broker
		// and send the same envelope again.
		m.retries.Add(1)
		m.log.Debug("broker unavailable; will resend", "device", env.Device, "id", env.ID, "err", err)
		if werr := m.c.AwaitConnection(ctx); werr != nil {
			return nil, fmt.Errorf("publish %s: %w (%w)", msg.Topic, werr, err)
		}
	}
	select {
	case ack := <-w.ch:
		return ack, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("await ack for %s on %s: %w", env.ID, m.topics.Ack(env.Device), ctx.Err())
	}
}

// Post publishes env to its device's command topic, like Send, but does
// not wait for the ack: it returns once the broker has the command (its
// PUBACK), and the ack is handed to answer, once, on the MQTT delivery
// goroutine (answer must not block), if it comes before Drop(env.ID). The
// caller keeps no goroutine while its command is at the device. An error
// means the command was not published, or its outcome is unknown (the
// broker went away: ErrNotConnected); answer may still be called if it
// reached the device, so the caller settles on whichever comes first.
// Post does not resend: the caller does, with the same envelope.
func (m *Commander) Post(ctx context.Context, env *fence.Envelope, answer func(*fence.Ack)) error {
	msg, err := m.await(&waiting{env: env, answer: answer})
	if err != nil {
		return err
	}
	if err := m.c.Publish(ctx, msg); err != nil {
		if errors.Is(err, ErrNotConnected) {
			m.retries.Add(1)
		}
		return fmt.Errorf("publish %s: %w", msg.Topic, err)
	}
	return nil
}

// Drop stops waiting for the ack of command id (a Post's or a Send's). It
// reports whether the command was still waiting: false means a Post's
// answer has been (or is being) called.
func (m *Commander) Drop(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.pending[id]
	delete(m.pending, id)
	return ok
}

// await encodes w's envelope and registers w for its ack; it returns the
// message to publish.
func (m *Commander) await(w *waiting) (Message, error) {
	env := w.env
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
		return Message{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, dup := m.pending[env.ID]; dup {
		return Message{}, fmt.Errorf("mqtt: command id %s already in flight", env.ID)
	}
	m.pending[env.ID] = w
	return Message{
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
		// Send gave up, or an operator reset's.
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
	if w.answer != nil {
		m.mu.Lock()
		mine := m.pending[id] == w // not dropped, nor answered by a duplicate meanwhile
		if mine {
			delete(m.pending, id)
		}
		m.mu.Unlock()
		if mine {
			m.acks.Add(1)
			w.answer(ack)
		}
		return
	}
	m.acks.Add(1)
	select {
	case w.ch <- ack:
	default: // a duplicate ack; the first one counts
	}
}

// Status describes the transport for the agent's status output.
func (m *Commander) Status() map[string]any {
	s := m.c.Stats()
	m.mu.Lock()
	inflight := len(m.pending)
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
		// The ceiling of the delay between reconnection attempts.
		"reconnect_backoff_max": m.c.cfg.MaxBackoff.String(),
		// Packets over max_packet_size the broker sent anyway, dropped.
		"packets_oversize": s.PacketsOversize,
		"max_packet_size":  m.c.cfg.MaxPacketSize,
	}
}
