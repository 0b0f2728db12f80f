package mqtt

import (
	"context"
	"fmt"
	"log/slog"
	"math/bits"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"

	"github.com/edgefence/edgefence/internal/backoff"
)

// Client is an MQTT v5 connection that keeps itself up: it reconnects with
// backoff, resubscribes on every connection, and publishes at QoS 1. It is
// safe for concurrent use.
type Client struct {
	cfg Config
	log *slog.Logger
	cm  *autopaho.ConnectionManager

	ctx    context.Context // the client's lifetime: cancelled by Close or by the Dial context
	cancel context.CancelFunc
	kick   chan struct{} // capacity 1: subscription work may be pending
	done   chan struct{} // closed once every goroutine has stopped

	everUp    atomic.Bool     // a connection has been up at least once
	reconnect backoff.Backoff // MinBackoff to MaxBackoff, full jitter (backoff.go)

	mu          sync.Mutex
	pending     *link             // dialled, waiting for CONNACK
	cur         *link             // the connection that is up; nil while down
	gen         uint64            // bumped on every connection up
	subs        []subscription    // registered by Subscribe, kept for the client's life
	routes      routes            // subs indexed for delivery
	acked       map[string]uint64 // filter → gen of the connection that SUBACKed it
	changed     chan struct{}     // closed and replaced on every state change
	downSince   time.Time
	failedDials int // failed connection attempts since the last connection up

	published, publishErrors, received, reconnects, oversize atomic.Uint64
	oversizeLog                                              oversizeLog
}

// Stats are counters since Dial.
type Stats struct {
	Published     uint64 // publishes acknowledged by the broker (PUBACK)
	PublishErrors uint64 // Publish calls that returned an error
	Received      uint64 // PUBLISH packets received from the broker
	Reconnects    uint64 // connections established after the first
	Connected     bool   // a connection is up now
	Broker        string // the broker of the connection that is up (URL without credentials); "" when down

	// PacketsOversize counts packets over Config.MaxPacketSize the broker
	// sent anyway (it should not: the limit is in CONNECT), each dropped
	// unread (see Config.MaxPacketSize).
	PacketsOversize uint64
}

// Dial validates cfg and starts the connection manager, which connects in
// the background and keeps reconnecting until the client is closed. It does
// not wait for the connection: use AwaitConnection, or just Publish and
// handle ErrNotConnected.
//
// ctx bounds the client's lifetime, as with autopaho: cancelling it shuts the
// client down like Close (without waiting). Pass a long-lived context, not a
// per-call timeout.
//
// Connection attempts go through Brokers in order; between rounds the client
// waits a random delay in [MinBackoff, min(MinBackoff·2^(n+1), MaxBackoff)]
// after the n-th failed round. The first attempt is immediate; the first
// attempt after a lost connection waits too.
func Dial(ctx context.Context, cfg Config) (*Client, error) {
	userLogger := cfg.Logger != nil
	cfg, brokers, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("mqtt: dial: %w", err)
	}
	c := &Client{
		cfg:     cfg,
		log:     cfg.Logger.With("client_id", cfg.ClientID),
		kick:    make(chan struct{}, 1),
		done:    make(chan struct{}),
		acked:   make(map[string]uint64),
		changed: make(chan struct{}),
	}
	c.reconnect = backoff.Backoff{Min: cfg.MinBackoff, Max: cfg.MaxBackoff}
	for _, s := range cfg.Subscriptions {
		c.addSubLocked(s.Filter, s.Handler)
	}
	c.ctx, c.cancel = context.WithCancel(ctx)

	urls := make([]*url.URL, len(brokers))
	for i, b := range brokers {
		urls[i] = b.url
	}
	acfg := autopaho.ClientConfig{
		ServerUrls:                    urls,
		KeepAlive:                     cfg.keepAliveSeconds(),
		CleanStartOnInitialConnection: cfg.CleanStart,
		SessionExpiryInterval:         cfg.sessionExpirySeconds(),
		ReconnectBackoff:              c.backoff,
		ConnectTimeout:                cfg.ConnectTimeout,
		ConnectUsername:               cfg.Username,
		ConnectPassword:               cfg.Password,
		ConnectPacketBuilder:          c.connectPacket,
		AttemptConnection:             c.attemptConnection,
		OnConnectionUp:                c.onConnectionUp,
		OnConnectionDown:              c.onConnectionDown,
		OnConnectError:                c.onConnectError,
		ClientConfig: paho.ClientConfig{
			ClientID:           cfg.ClientID,
			OnPublishReceived:  []func(paho.PublishReceived) (bool, error){c.onPublishReceived},
			OnClientError:      c.onClientError,
			OnServerDisconnect: c.onServerDisconnect,
		},
	}
	if userLogger {
		acfg.Debug = pahoLogger{c.log, slog.LevelDebug, "autopaho"}
		acfg.Errors = pahoLogger{c.log, slog.LevelWarn, "autopaho"}
		acfg.PahoDebug = pahoLogger{c.log, slog.LevelDebug, "paho"}
		acfg.PahoErrors = pahoLogger{c.log, slog.LevelWarn, "paho"}
	}
	cm, err := autopaho.NewConnection(c.ctx, acfg)
	if err != nil {
		c.cancel()
		return nil, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	c.cm = cm
	go c.run()
	return c, nil
}

// AwaitConnection returns nil once a connection is up (at once if it is
// already up), ctx's error if ctx ends first, or ErrClosed.
func (c *Client) AwaitConnection(ctx context.Context) error {
	return c.await(ctx, "await connection", func() bool { return c.upLocked() })
}

// Connected reports whether a connection is up.
func (c *Client) Connected() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.upLocked()
}

// Stats returns a snapshot of the counters.
func (c *Client) Stats() Stats {
	s := Stats{
		Published:       c.published.Load(),
		PublishErrors:   c.publishErrors.Load(),
		Received:        c.received.Load(),
		Reconnects:      c.reconnects.Load(),
		PacketsOversize: c.oversize.Load(),
	}
	if l := c.current(); l != nil {
		s.Connected, s.Broker = true, l.broker
	}
	return s
}

// Close disconnects cleanly (DISCONNECT, then closing the connection) and
// waits until every goroutine the client started has stopped, including
// paho's, and any handler still running has returned. It is idempotent and
// returns nil once the client is down; it returns ctx's error if ctx ends
// first (call it again to keep waiting). Close must not be called from a
// Handler: it would wait for that handler.
func (c *Client) Close(ctx context.Context) error {
	c.cancel()
	if err := c.cm.Disconnect(ctx); err != nil {
		return fmt.Errorf("mqtt: close: %w", err)
	}
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("mqtt: close: %w", ctx.Err())
	}
}

// Done is closed when the client has shut down (after Close or the
// cancellation of the Dial context) and all its goroutines have stopped.
func (c *Client) Done() <-chan struct{} { return c.done }

// run is the one goroutine the client owns (paho's are owned by autopaho and
// waited for here). It (re)subscribes every registered filter whenever a
// connection comes up or Subscribe adds one, retrying with backoff while the
// connection stays up, so that OnConnectionUp never blocks.
func (c *Client) run() {
	defer close(c.done)
	defer func() { <-c.cm.Done() }()

	// Full jitter: the gateways of a fleet resubscribing to one broker
	// should not retry in step.
	resub := backoff.Backoff{Min: c.cfg.MinBackoff, Max: c.cfg.MaxBackoff}
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-c.kick:
		}
		for c.ctx.Err() == nil {
			l, gen, filters := c.unsubscribed()
			if l == nil || len(filters) == 0 {
				resub.Reset()
				break
			}
			err := c.subscribe(l, gen, filters)
			if err == nil {
				resub.Reset()
				continue
			}
			if l.ctx.Err() != nil {
				break // connection lost; the next connection up kicks us again
			}
			delay := resub.Next()
			c.log.Warn("mqtt subscribe failed; retrying", "filters", filters, "retry_in", delay, "err", err)
			t := time.NewTimer(delay)
			select {
			case <-c.ctx.Done():
				t.Stop()
				return
			case <-l.ctx.Done():
				t.Stop()
			case <-t.C:
			}
		}
	}
}

func (c *Client) kickRun() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// await waits until cond (called with c.mu held) holds.
func (c *Client) await(ctx context.Context, op string, cond func() bool) error {
	for {
		c.mu.Lock()
		ok, ch := cond(), c.changed
		c.mu.Unlock()
		if ok {
			return nil
		}
		if c.ctx.Err() != nil {
			return fmt.Errorf("mqtt: %s: %w", op, ErrClosed)
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("mqtt: %s: %w", op, ctx.Err())
		case <-c.ctx.Done():
			return fmt.Errorf("mqtt: %s: %w", op, ErrClosed)
		}
	}
}

func (c *Client) upLocked() bool { return c.cur != nil && c.cur.ctx.Err() == nil }

// current returns the link that is up, or nil.
func (c *Client) current() *link {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.upLocked() {
		return nil
	}
	return c.cur
}

// notifyLocked wakes every await.
func (c *Client) notifyLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// receiveMaximum is the Receive Maximum every CONNECT announces: the QoS 1
// and 2 messages the broker may have sent us unacknowledged at once. paho
// sizes a channel of that many pointers per connection; without the
// property (the spec's default, 65,535) that is 512 KiB, resident once the
// channel's ring has gone round (docs/BENCHMARKS.md §74, §80). 8,192 is
// what mochi held in flight for us anyway (its MaximumInflight); Mosquitto
// sends at most 20 (max_inflight_messages). The tests' mochi never sees
// the property (internal/mochiquota).
const receiveMaximum = 8192

// connectPacket is autopaho's ConnectPacketBuilder: it adds the Maximum
// Packet Size and the Receive Maximum to every CONNECT.
func (c *Client) connectPacket(cp *paho.Connect, _ *url.URL) (*paho.Connect, error) {
	if cp.Properties == nil {
		cp.Properties = &paho.ConnectProperties{}
	}
	mps := uint32(c.cfg.MaxPacketSize) // within [MinMaxPacketSize, MaxMaxPacketSize]: withDefaults
	cp.Properties.MaximumPacketSize = &mps
	rm := uint16(receiveMaximum)
	cp.Properties.ReceiveMaximum = &rm
	return cp, nil
}

// onConnectionUp runs on autopaho's goroutine and must not block.
func (c *Client) onConnectionUp(_ *autopaho.ConnectionManager, ca *paho.Connack) {
	c.mu.Lock()
	l := c.pending
	c.pending = nil
	if l == nil || l.ctx.Err() != nil {
		c.mu.Unlock()
		c.log.Debug("mqtt connection lost right after CONNACK")
		return
	}
	c.cur = l
	c.gen++
	downFor := time.Since(c.downSince)
	attempts := c.failedDials
	c.failedDials = 0
	c.notifyLocked()
	c.mu.Unlock()

	attrs := []any{"broker", l.broker, "session_present", ca.SessionPresent}
	if c.everUp.Swap(true) {
		c.reconnects.Add(1)
		attrs = append(attrs, "down_for", downFor.Round(time.Millisecond))
	}
	if attempts > 0 {
		attrs = append(attrs, "failed_attempts", attempts)
	}
	c.log.Info("mqtt connected", attrs...)
	c.kickRun()
}

// linkClosed is called when paho closes a connection (any reason).
func (c *Client) linkClosed(l *link) {
	c.mu.Lock()
	if c.cur != l {
		c.mu.Unlock()
		return
	}
	c.cur = nil
	c.downSince = time.Now()
	c.notifyLocked()
	c.mu.Unlock()
	if c.ctx.Err() != nil {
		c.log.Info("mqtt disconnected", "broker", l.broker)
		return
	}
	c.log.Warn("mqtt connection lost; reconnecting", "broker", l.broker, "backoff_max", c.cfg.MaxBackoff.String())
}

// onConnectionDown runs on autopaho's goroutine once paho has fully shut the
// connection down (after any running handler returned).
func (c *Client) onConnectionDown() bool {
	c.mu.Lock()
	l := c.cur
	c.mu.Unlock()
	if l != nil { // normally linkClosed has run already
		l.cancel(ErrConnectionLost)
		c.linkClosed(l)
	}
	return true // keep reconnecting until the client is closed
}

// onConnectError is called for every failed connection attempt. The first
// failure after a connection was up (or at start) is a warning; later ones
// are warnings only at attempts 2, 4, 8, ... to keep long outages quiet.
func (c *Client) onConnectError(err error) {
	c.mu.Lock()
	c.failedDials++
	n := c.failedDials
	c.mu.Unlock()
	level := slog.LevelDebug
	if bits.OnesCount(uint(n)) == 1 {
		level = slog.LevelWarn
	}
	c.log.Log(context.Background(), level, "mqtt connect failed; retrying", "attempt", n, "err", err)
}

// onClientError runs on a goroutine of autopaho's, at most once per
// connection, when paho hits a network or protocol error.
func (c *Client) onClientError(err error) {
	c.log.Warn("mqtt connection error", "err", err)
}

// onServerDisconnect runs on a goroutine of autopaho's when the broker sends
// DISCONNECT.
func (c *Client) onServerDisconnect(d *paho.Disconnect) {
	attrs := []any{"reason_code", fmt.Sprintf("0x%02x", d.ReasonCode)}
	if d.Properties != nil && d.Properties.ReasonString != "" {
		attrs = append(attrs, "reason", d.Properties.ReasonString)
	}
	if d.ReasonCode == 0x8E {
		attrs = append(attrs, "hint", "session taken over: another client connected with the same ClientID")
	}
	c.log.Warn("mqtt broker sent DISCONNECT", attrs...)
}
