package mqtt

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"

	"github.com/eclipse/paho.golang/paho"
)

// subscribeBatch bounds the number of filters in one SUBSCRIBE packet.
const subscribeBatch = 64

type subscription struct {
	filter string
	h      Handler
}

// Subscribe registers h for messages whose topic matches filter ('+' and '#'
// wildcards, $share/<group>/ prefix) at QoS 1. The registration lasts for
// the client's life: the filter is subscribed in the background now if a
// connection is up, and again on every new connection. The filter's first
// SUBSCRIBE of this Client asks for the retained messages whatever the
// broker's session holds (Retain Handling 0): a new process — an agent
// restarted after kill -9 that resumes its session — knows nothing of what
// its previous one received, such as the devices' retained firmware
// reports. Later ones, on reconnects, use Retain Handling 1: resubscribing
// to a live session does not resend them.
// It may be called before the first connection. Use AwaitSubscribed to wait
// until the broker has acknowledged every filter.
//
// With a persistent session (the default) the broker may deliver messages it
// queued while this client was away as soon as the connection is up, which
// can be before Subscribe is called; a message that matches no registered
// filter is acknowledged and dropped (logged at Warn). Register such filters
// in Config.Subscriptions instead.
//
// Every handler whose filter matches is called, in registration order, even
// if the filters overlap. An invalid filter or a nil handler is logged at
// Error and ignored.
func (c *Client) Subscribe(filter string, h Handler) {
	if h == nil || !validFilter(filter) {
		c.log.Error("mqtt subscribe ignored: invalid filter or nil handler", "filter", shorten(filter), "nil_handler", h == nil)
		return
	}
	c.mu.Lock()
	c.addSubLocked(filter, h)
	c.notifyLocked()
	c.mu.Unlock()
	c.kickRun()
}

// AwaitSubscribed returns nil once a connection is up and the broker has
// acknowledged (SUBACK) every filter registered so far on it, ctx's error if
// ctx ends first, or ErrClosed.
func (c *Client) AwaitSubscribed(ctx context.Context) error {
	return c.await(ctx, "await subscribed", c.subscribedLocked)
}

// Subscribed reports whether a connection is up and the broker has
// acknowledged every filter registered so far on it (AwaitSubscribed
// without the wait).
func (c *Client) Subscribed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.subscribedLocked()
}

func (c *Client) subscribedLocked() bool {
	if !c.upLocked() {
		return false
	}
	for _, s := range c.subs {
		if c.acked[s.filter] != c.gen {
			return false
		}
	}
	return true
}

// unsubscribed returns the current link, its generation and the filters not
// yet acknowledged on it; l is nil while down.
func (c *Client) unsubscribed() (l *link, gen uint64, filters []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.upLocked() {
		return nil, 0, nil
	}
	seen := make(map[string]bool)
	for _, s := range c.subs {
		if c.acked[s.filter] != c.gen && !seen[s.filter] {
			seen[s.filter] = true
			filters = append(filters, s.filter)
		}
	}
	return c.cur, c.gen, filters
}

// subscribe sends SUBSCRIBE packets for filters on link l (generation gen)
// and records the granted ones.
func (c *Client) subscribe(l *link, gen uint64, filters []string) error {
	var errs []error
	for len(filters) > 0 {
		batch := filters[:min(len(filters), subscribeBatch)]
		filters = filters[len(batch):]

		s := &paho.Subscribe{Subscriptions: make([]paho.SubscribeOptions, len(batch))}
		c.mu.Lock()
		for i, f := range batch {
			rh := byte(1) // retained only if the broker has no such subscription
			if c.acked[f] == 0 {
				rh = 0 // the filter's first SUBSCRIBE in this Client: always
			}
			s.Subscriptions[i] = paho.SubscribeOptions{Topic: f, QoS: 1, RetainHandling: rh}
		}
		c.mu.Unlock()
		sa, err := c.cm.Subscribe(l.ctx, s)
		var granted []string
		if sa != nil && len(sa.Reasons) == len(batch) {
			for i, code := range sa.Reasons {
				if code < 0x80 { // 0x00 (granted QoS 0) counts: the filter is live
					granted = append(granted, batch[i])
				} else {
					errs = append(errs, fmt.Errorf("%w: filter %q: SUBACK reason code 0x%02x", ErrRejected, batch[i], code))
				}
			}
			err = nil // paho's error for rejected filters is less precise than ours
		} else if err == nil { // paho returns a SUBACK with every nil error
			err = fmt.Errorf("malformed SUBACK for %d filters", len(batch))
		}
		if len(granted) > 0 {
			c.mu.Lock()
			if c.gen == gen {
				for _, f := range granted {
					c.acked[f] = gen
				}
				c.notifyLocked()
			}
			c.mu.Unlock()
			c.log.Debug("mqtt subscribed", "filters", granted)
		}
		if err != nil {
			errs = append(errs, err)
		}
		if l.ctx.Err() != nil {
			break
		}
	}
	return errors.Join(errs...)
}

// onPublishReceived is paho's OnPublishReceived callback. paho calls it on
// its single delivery goroutine, one message at a time, and sends the PUBACK
// when it returns.
func (c *Client) onPublishReceived(pr paho.PublishReceived) (bool, error) {
	p := pr.Packet
	c.received.Add(1)
	m := Message{Topic: p.Topic, Payload: p.Payload, Duplicate: p.Duplicate(), Retain: p.Retain}
	if p.Properties != nil {
		m.CorrelationData = p.Properties.CorrelationData
		m.ResponseTopic = p.Properties.ResponseTopic
	}
	hs := c.handlersFor(m.Topic)
	if len(hs) == 0 {
		// Only possible for messages of a session resumed before Subscribe
		// was called: paho acknowledges it when we return, so it is lost.
		c.log.Warn("mqtt message matches no registered filter; dropped", "topic", m.Topic, "duplicate", m.Duplicate)
		return false, nil
	}
	for _, h := range hs {
		c.callHandler(h, m)
	}
	return true, nil
}

// addSubLocked registers a subscription and indexes it for delivery.
func (c *Client) addSubLocked(filter string, h Handler) {
	c.routes.add(len(c.subs), filter)
	c.subs = append(c.subs, subscription{filter: filter, h: h})
}

// handlersFor returns the handlers of every subscription whose filter
// matches topic, in registration order: one map lookup for the filters
// without wildcards (an agent's per-device filters) and a scan of the
// others only.
func (c *Client) handlersFor(topic string) []Handler {
	c.mu.Lock()
	defer c.mu.Unlock()
	var hs []Handler
	exact, wild := c.routes.exact[topic], c.routes.wild
	for len(exact) > 0 || len(wild) > 0 {
		if len(wild) == 0 || len(exact) > 0 && exact[0] < wild[0] {
			hs = append(hs, c.subs[exact[0]].h)
			exact = exact[1:]
			continue
		}
		if s := c.subs[wild[0]]; matchFilter(s.filter, topic) {
			hs = append(hs, s.h)
		}
		wild = wild[1:]
	}
	return hs
}

// callHandler runs h, turning a panic into an Error log (as net/http does)
// so that one bad message cannot crash the agent or, unacknowledged, be
// redelivered forever.
func (c *Client) callHandler(h Handler, m Message) {
	defer func() {
		if r := recover(); r != nil {
			c.log.Error("mqtt handler panicked", "topic", m.Topic, "panic", r, "stack", string(debug.Stack()))
		}
	}()
	h(m)
}
