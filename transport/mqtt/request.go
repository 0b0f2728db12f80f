package mqtt

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/edgefence/edgefence/fence"
)

// Request publishes payload, a message a fence point answers with an ack
// (an operator's fence reset, say), on device's command topic at QoS 1,
// with id as correlation data, and waits for the ack that names id on the
// device's ack topic. It dials its own short-lived client with cfg (give
// it a ClientID of its own: not the agent's, whose session it would take
// over), subscribed before the publish, and closes it before returning.
// It returns ctx's error if no such ack came: the message's fate is then
// unknown, and sending it again is safe for a reset (a replay is refused).
// Acks are read plain (fence.UnmarshalAck); RequestChecked verifies them.
func Request(ctx context.Context, cfg Config, topics Topics, device string, payload []byte, id string) (*fence.Ack, error) {
	return RequestChecked(ctx, cfg, topics, device, payload, id, fence.UnmarshalAck)
}

// RequestChecked is Request with each message on the ack topic read by
// check (a signed ack verified against the device's key and bound to the
// message, say): one check refuses, or that names another id, is not the
// answer and the wait goes on. If ctx ends after acks were refused, the
// error says why the last one was.
func RequestChecked(ctx context.Context, cfg Config, topics Topics, device string, payload []byte, id string, check func(raw []byte) (*fence.Ack, error)) (*fence.Ack, error) {
	if !ValidDeviceID(device) {
		return nil, fmt.Errorf("%w: device id %q", ErrInvalidConfig, device)
	}
	acks := make(chan *fence.Ack, 1)
	var refused atomic.Pointer[error]
	cfg.CleanStart = true
	cfg.SessionExpiry = -1
	cfg.Subscriptions = append(cfg.Subscriptions, Subscription{Filter: topics.Ack(device), Handler: func(m Message) {
		a, err := check(m.Payload)
		if err != nil && string(m.CorrelationData) == id {
			refused.Store(&err)
		}
		if err != nil || (a.ID != id && string(m.CorrelationData) != id) {
			return // another command's ack, or garbage
		}
		select {
		case acks <- a:
		default:
		}
	}})
	c, err := Dial(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), DefaultConnectTimeout)
		defer cancel()
		_ = c.Close(cctx)
	}()
	if err := c.AwaitSubscribed(ctx); err != nil {
		return nil, fmt.Errorf("subscribe to %s: %w", topics.Ack(device), err)
	}
	msg := Message{Topic: topics.Cmd(device), Payload: payload, CorrelationData: []byte(id), ResponseTopic: topics.Ack(device)}
	for {
		err := c.Publish(ctx, msg)
		if err == nil {
			break
		}
		if !errors.Is(err, ErrNotConnected) {
			return nil, fmt.Errorf("publish %s: %w", msg.Topic, err)
		}
		if werr := c.AwaitSubscribed(ctx); werr != nil {
			return nil, fmt.Errorf("publish %s: %w (%w)", msg.Topic, werr, err)
		}
	}
	select {
	case a := <-acks:
		return a, nil
	case <-ctx.Done():
		if r := refused.Load(); r != nil {
			return nil, fmt.Errorf("await the ack of %s on %s: %w; an answer came but was refused: %w", id, topics.Ack(device), ctx.Err(), *r)
		}
		return nil, fmt.Errorf("await the ack of %s on %s: %w", id, topics.Ack(device), ctx.Err())
	}
}
