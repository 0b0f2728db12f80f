package mqtt

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/edgefence/edgefence/fence"
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
	pending map[string]chan *fence.Ack
	sign    func(*fence.Envelope) ([]byte, error) // nil: plain envelopes
	plain   map[string]bool                       // devices sent plain envelopes although sign is set

	acks, unmatched, badAcks, retries, unsigned atomic.Uint64
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

// NewCommander dials the broker with cfg and subscribes to the ack topics of
// devices before the first connection, so that acks the broker queued for a
// resumed session are not lost. It does not wait for the connection.
func NewCommander(ctx context.Context, cfg Config, topics Topics, devices []string) (*Commander, error) {
	m := &Commander{topics: topics, log: cfg.Logger, pending: make(map[string]chan *fence.Ack)}
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
		return nil, err
	}
	ch := make(chan *fence.Ack, 1)
	m.mu.Lock()
	if _, dup := m.pending[env.ID]; dup {
		m.mu.Unlock()
		return nil, fmt.Errorf("mqtt: command id %s already in flight", env.ID)
	}
	m.pending[env.ID] = ch
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		delete(m.pending, env.ID)
		m.mu.Unlock()
	}()

	msg := Message{
		Topic:           m.topics.Cmd(env.Device),
		Payload:         payload,
		CorrelationData: []byte(env.ID),
		ResponseTopic:   m.topics.Ack(env.Device),
	}
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
	case ack := <-ch:
		return ack, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("await ack for %s on %s: %w", env.ID, m.topics.Ack(env.Device), ctx.Err())
	}
}

// onAck routes one ack to the Send waiting for it.
func (m *Commander) onAck(msg Message) {
	ack, err := fence.UnmarshalAck(msg.Payload)
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
	ch := m.pending[id]
	m.mu.Unlock()
	if ch == nil {
		// Another holder's ack on the shared topic, or a redelivery after
		// Send gave up.
		m.unmatched.Add(1)
		m.log.Debug("ack for no pending command", "topic", msg.Topic, "id", id, "verdict", ack.Verdict)
		return
	}
	m.acks.Add(1)
	select {
	case ch <- ack:
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
