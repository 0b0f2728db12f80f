package mqtt

import (
	"context"
	"errors"
	"fmt"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"
	"github.com/eclipse/paho.golang/paho/session"
)

// maxPacketLen is MQTT's largest Remaining Length (four-byte variable
// byte integer). paho does not check it.
const maxPacketLen = 268_435_455

// Message is an MQTT v5 application message.
type Message struct {
	Topic           string
	Payload         []byte // handlers must treat it as read-only
	CorrelationData []byte // MQTT v5 correlation data; at most 65535 bytes
	ResponseTopic   string // MQTT v5 response topic; a topic name, no wildcards
	// Duplicate is the DUP flag on receive; Publish ignores it. It is only
	// a hint: brokers set it on redelivery, but mochi v2.7.9 also sets it on
	// the first delivery of messages queued for an offline session.
	// Deduplicate on content (fence token and sequence), not on this flag.
	Duplicate bool
	// Retain asks the broker to keep the message as the topic's retained
	// one (a device's last state report, read at once by a new
	// subscriber); on receive, it says the message is a retained one.
	Retain bool
}

// Handler handles a received message. See the package documentation for
// the goroutine it runs on and what it may do there.
type Handler func(Message)

// Publish sends m at QoS 1 and blocks until the broker's PUBACK, ctx's end,
// or paho's packet timeout (10s), whichever comes first. Errors:
//
//   - ErrInvalidMessage: m is not a valid PUBLISH; nothing was sent.
//   - ErrNotConnected: no connection was up; nothing was sent. Publish does
//     not queue; retry after AwaitConnection or keep a durable outbox.
//   - ErrConnectionLost (which also matches ErrNotConnected): the connection
//     dropped while waiting for the PUBACK; the message may still arrive.
//   - ErrClosed: the client is closed.
//   - ErrRejected: the broker's PUBACK carried a failure reason code.
//   - ctx's error, or context.DeadlineExceeded for paho's packet timeout:
//     the message may still arrive.
//
// Publish may be called from a Handler.
func (c *Client) Publish(ctx context.Context, m Message) error {
	err := c.publish(ctx, m)
	if err != nil {
		c.publishErrors.Add(1)
		return fmt.Errorf("publish %s: %w", shorten(m.Topic), err)
	}
	c.published.Add(1)
	return nil
}

func (c *Client) publish(ctx context.Context, m Message) error {
	if err := m.validate(); err != nil {
		return err
	}
	if c.ctx.Err() != nil {
		return ErrClosed
	}
	l := c.current()
	if l == nil {
		return ErrNotConnected
	}
	// Cancel the wait if this connection drops: paho would otherwise keep
	// waiting for a PUBACK that can only come on a later connection.
	pctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(l.ctx, func() { cancel(context.Cause(l.ctx)) })
	defer stop()

	p := &paho.Publish{QoS: 1, Topic: m.Topic, Payload: m.Payload, Retain: m.Retain}
	if m.CorrelationData != nil || m.ResponseTopic != "" {
		p.Properties = &paho.PublishProperties{CorrelationData: m.CorrelationData, ResponseTopic: m.ResponseTopic}
	}
	resp, err := c.cm.Publish(pctx, p)
	if err == nil {
		return nil
	}
	switch {
	case c.ctx.Err() != nil:
		return ErrClosed
	case errors.Is(err, autopaho.ConnectionDownError), errors.Is(err, session.ErrNoConnection):
		return ErrNotConnected
	case pctx.Err() != nil && errors.Is(context.Cause(pctx), ErrConnectionLost):
		return ErrConnectionLost
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(err, paho.ErrInvalidArguments):
		return fmt.Errorf("%w: %v", ErrInvalidMessage, err)
	case resp != nil && resp.ReasonCode >= 0x80:
		reason := ""
		if resp.Properties != nil {
			reason = resp.Properties.ReasonString
		}
		return fmt.Errorf("%w: reason code 0x%02x %s", ErrRejected, resp.ReasonCode, reason)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("no PUBACK within paho's packet timeout: %w", err)
	}
	return err
}

func (m *Message) validate() error {
	switch {
	case !validTopic(m.Topic):
		return fmt.Errorf("%w: topic %q is not a valid topic name", ErrInvalidMessage, shorten(m.Topic))
	case m.ResponseTopic != "" && !validTopic(m.ResponseTopic):
		return fmt.Errorf("%w: response topic %q is not a valid topic name", ErrInvalidMessage, shorten(m.ResponseTopic))
	case len(m.CorrelationData) > maxStringLen:
		return fmt.Errorf("%w: correlation data is %d bytes, limit %d", ErrInvalidMessage, len(m.CorrelationData), maxStringLen)
	case len(m.Topic)+len(m.ResponseTopic)+len(m.CorrelationData)+len(m.Payload)+32 > maxPacketLen:
		return fmt.Errorf("%w: %d byte payload exceeds the MQTT packet limit", ErrInvalidMessage, len(m.Payload))
	}
	return nil
}

// shorten bounds a string quoted in an error message.
func shorten(s string) string {
	const n = 80
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
