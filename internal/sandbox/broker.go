package sandbox

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/edgefence/edgefence/internal/mochiquota"
)

// brokerCloseGrace is how long Stop lets mochi disconnect clients politely
// (DISCONNECT 0x8B "server shutting down") before it closes their sockets.
const brokerCloseGrace = 500 * time.Millisecond

// brokerHandleWait bounds Stop's wait for mochi's handlers to start on the
// connections accepted before its listener closed (awaitHandled).
const brokerHandleWait = time.Second

// BrokerConfig configures an in-process MQTT broker. The zero value listens
// on a free 127.0.0.1 port and logs nothing.
type BrokerConfig struct {
	// Addr is the listen address, "HOST:PORT". An empty string, an empty
	// host or port 0 pick 127.0.0.1 and a free port.
	Addr string
	// Logger receives the broker's log; nil means silent.
	Logger *slog.Logger
	// Setup, if set, is called with each new mochi server (at StartBroker
	// and at every Start or Restart) before it serves, to add hooks such
	// as a Duplicator's Attach. An error fails that start.
	Setup func(*mqtt.Server) error
	// Auth, if set, makes the broker require credentials and apply an ACL
	// (see BrokerAuth); nil allows every client and topic.
	Auth *BrokerAuth
}

// Broker is an in-process mochi-mqtt v2 broker speaking MQTT v5 (and 3.1.1)
// on loopback, allowing every client and topic unless BrokerConfig.Auth
// says otherwise, with no persistence: a
// Restart loses sessions, subscriptions and retained messages, as a real
// broker without a store would. Its address stays the same across Stop/Start
// and Restart.
type Broker struct {
	cfg  BrokerConfig
	addr string // HOST:PORT, fixed at StartBroker

	mu     sync.Mutex
	srv    *mqtt.Server // nil while stopped
	ln     *trackingListener
	closed bool
}

// StartBroker starts the broker and returns once it is listening.
func StartBroker(cfg BrokerConfig) (*Broker, error) {
	addr := cfg.Addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("sandbox: broker address %q: %w", cfg.Addr, err)
	}
	if host == "" {
		host = "127.0.0.1"
	}
	if port == "" {
		port = "0"
	}
	// Binding port 0 ourselves leaves no window for another process to take
	// a port picked in advance.
	ln, err := net.Listen("tcp", net.JoinHostPort(host, port))
	if err != nil {
		return nil, fmt.Errorf("sandbox: broker listen: %w", err)
	}
	b := &Broker{cfg: cfg, addr: ln.Addr().String()}
	if err := b.serveLocked(ln); err != nil {
		ln.Close()
		return nil, err
	}
	return b, nil
}

// Addr returns the listen address, "127.0.0.1:PORT".
func (b *Broker) Addr() string { return b.addr }

// URL returns the broker URL, "mqtt://127.0.0.1:PORT", as autopaho's
// ServerUrls expect.
func (b *Broker) URL() string { return "mqtt://" + b.addr }

// Server returns the running mochi server, for tests that inspect clients or
// publish inline, or nil while stopped. Each Start makes a new one.
func (b *Broker) Server() *mqtt.Server {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.srv
}

// Start starts a stopped broker again on the same address, retrying the
// bind until ctx is done. It is a no-op while running and returns ErrClosed
// after Close.
func (b *Broker) Start(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ErrClosed
	}
	if b.srv != nil {
		return nil
	}
	return b.startLocked(ctx)
}

// Stop stops the broker, dropping connected clients, and waits for their
// connections to end. Stop on a stopped broker is a no-op.
func (b *Broker) Stop() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.stopLocked()
	return nil
}

// Restart stops the broker and starts a fresh one on the same address.
// Clients are dropped and must reconnect (autopaho does).
func (b *Broker) Restart(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ErrClosed
	}
	b.stopLocked()
	return b.startLocked(ctx)
}

// Close stops the broker; connected clients are dropped. It is idempotent.
func (b *Broker) Close() error {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	b.stopLocked()
	return nil
}

func (b *Broker) startLocked(ctx context.Context) error {
	for {
		ln, err := net.Listen("tcp", b.addr)
		if err == nil {
			if err := b.serveLocked(ln); err != nil {
				ln.Close()
				return err
			}
			return nil
		}
		if !addrInUse(err) {
			return fmt.Errorf("sandbox: broker listen: %w", err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("sandbox: broker listen: %w (%w)", err, context.Cause(ctx))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (b *Broker) serveLocked(ln net.Listener) error {
	lg := slog.New(slog.DiscardHandler)
	if b.cfg.Logger != nil {
		lg = b.cfg.Logger.With("component", "mqtt")
	}
	srv := mqtt.New(&mqtt.Options{Logger: lg})
	// mochi denies every client unless an auth hook allows it.
	var hook mqtt.Hook = new(auth.AllowHook)
	if b.cfg.Auth != nil {
		hook = &authHook{a: b.cfg.Auth, log: lg}
	}
	if err := srv.AddHook(hook, nil); err != nil {
		return fmt.Errorf("sandbox: broker auth hook: %w", err)
	}
	if _, err := mochiquota.Add(srv); err != nil { // mochi v2.7.9's send quota stalls deliveries
		return fmt.Errorf("sandbox: broker quota hook: %w", err)
	}
	if b.cfg.Setup != nil {
		if err := b.cfg.Setup(srv); err != nil {
			srv.Close()
			return fmt.Errorf("sandbox: broker setup: %w", err)
		}
	}
	tl := newTrackingListener(ln)
	if err := srv.AddListener(listeners.NewNet("sandbox", tl)); err != nil {
		return fmt.Errorf("sandbox: broker listener: %w", err)
	}
	if err := srv.Serve(); err != nil {
		srv.Close()
		tl.closeAll()
		return fmt.Errorf("sandbox: broker serve: %w", err)
	}
	b.srv, b.ln = srv, tl
	return nil
}

func (b *Broker) stopLocked() {
	if b.srv == nil {
		return
	}
	srv, tl := b.srv, b.ln
	b.srv, b.ln = nil, nil
	// Accept nothing more first: mochi's Close closes its done channel
	// before it stops its listener, and a connection accepted in between
	// (a client reconnecting at once) is set up racing that close (the
	// race detector caught it in TestBrokerCloseDropsClients).
	_ = tl.Listener.Close()
	// And let the connections accepted before that reach mochi's handler:
	// its first act (ClientsWg.Add) must not race Close's ClientsWg.Wait
	// (a panic, "WaitGroup is reused", in TestBrokerCloseDropsClients when
	// Close came right after an Accept). The handler's next act is to read
	// the CONNECT packet: a connection that was read from has been added.
	tl.awaitHandled(brokerHandleWait)
	drainClients(srv, brokerCloseGrace)
	// mochi's Close sends DISCONNECT to each client and waits for every
	// connection handler, including ones still waiting for a CONNECT packet,
	// which would wait forever; after a grace period close the sockets.
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Close()
	}()
	t := time.NewTimer(brokerCloseGrace)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		tl.closeAll()
		<-done
	}
	tl.closeAll() // connections mochi accepted after it began closing
}

// drainClients disconnects srv's clients, as its Close would (DISCONNECT
// "server shutting down"), and waits, at most wait, until their
// connection handlers have returned, each session deleted. mochi v2.7.9's
// Close reads its client map under a read lock taken twice in a row
// (Clients.GetByListener calls Len): a Delete queued in between — a client
// whose connection ends just then — deadlocks it for good (CI:
// TestBrokerPubSubQoS1 hung 15 minutes). Drained, Close finds no client
// to disconnect and no Delete comes.
func drainClients(srv *mqtt.Server, wait time.Duration) {
	for _, cl := range srv.Clients.GetAll() {
		if !cl.Closed() {
			_ = srv.DisconnectClient(cl, packets.ErrServerShuttingDown)
		}
	}
	for end := time.Now().Add(wait); atomic.LoadInt64(&srv.Info.ClientsConnected) > 0 && time.Now().Before(end); {
		time.Sleep(time.Millisecond)
	}
}

// trackingListener remembers the connections it accepted so Stop can close
// the ones mochi does not.
type trackingListener struct {
	net.Listener

	mu    sync.Mutex
	conns map[*trackedConn]struct{}
}

func newTrackingListener(ln net.Listener) *trackingListener {
	return &trackingListener{Listener: ln, conns: make(map[*trackedConn]struct{})}
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: c, l: l}
	l.mu.Lock()
	l.conns[tc] = struct{}{}
	l.mu.Unlock()
	return tc, nil
}

func (l *trackingListener) closeAll() {
	l.Listener.Close()
	l.mu.Lock()
	conns := make([]*trackedConn, 0, len(l.conns))
	for c := range l.conns {
		conns = append(conns, c)
	}
	l.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

// awaitHandled waits, at most d, until every open connection has been
// read from (mochi's handler has started on it).
func (l *trackingListener) awaitHandled(d time.Duration) {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		l.mu.Lock()
		all := true
		for c := range l.conns {
			all = all && c.read.Load()
		}
		l.mu.Unlock()
		if all {
			return
		}
	}
}

type trackedConn struct {
	net.Conn
	l    *trackingListener
	read atomic.Bool // Read was called: mochi's handler runs
	once sync.Once
	err  error
}

func (c *trackedConn) Read(p []byte) (int, error) {
	c.read.Store(true)
	return c.Conn.Read(p)
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.err = c.Conn.Close()
		c.l.mu.Lock()
		delete(c.l.conns, c)
		c.l.mu.Unlock()
	})
	return c.err
}
