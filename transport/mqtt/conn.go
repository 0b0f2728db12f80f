package mqtt

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
)

// link is one network connection to a broker. Its context is cancelled (with
// cause ErrConnectionLost) the moment paho closes the connection, which
// happens before paho waits for its handlers to return; so a Publish waiting
// for a PUBACK, or a SUBSCRIBE waiting for a SUBACK, on a dead connection
// returns at once instead of waiting for paho's packet timeout.
type link struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	broker string // redacted URL, for logs
}

// trackedConn reports Close to its link. paho writes to the connection from
// several goroutines and serialises each packet only if the connection is a
// sync.Locker, hence the mutex. Embedding *net.TCPConn (rather than
// net.Conn) keeps net.Buffers.WriteTo on the writev path: one syscall per
// packet, as with the bare connection autopaho would dial itself.
type trackedConn struct {
	*net.TCPConn
	sync.Mutex
	once    sync.Once
	onClose func()
	guard   packetGuard // Read: Config.MaxPacketSize (packetsize.go)
}

func (c *trackedConn) Read(b []byte) (int, error) { return c.guard.Read(b) }

func (c *trackedConn) Close() error {
	c.once.Do(c.onClose)
	return c.TCPConn.Close()
}

// tlsTrackedConn is trackedConn for TLS connections.
type tlsTrackedConn struct {
	*tls.Conn
	sync.Mutex
	once    sync.Once
	onClose func()
	heard   atomic.Bool // a Read returned data
	guard   packetGuard // Read: Config.MaxPacketSize (packetsize.go)
}

// alertWait bounds the look for a TLS alert after a failed write.
const alertWait = 200 * time.Millisecond

// Write returns, when a write fails before the broker has sent anything,
// the TLS alert the broker sent instead, if there is one. A TLS 1.3 server
// checks the client's certificate after the client's side of the handshake
// is done, so a broker that refuses it ("tls: certificate required", "tls:
// unknown certificate authority") closes the connection under the CONNECT
// and the write alone says only "broken pipe".
func (c *tlsTrackedConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if err != nil && !c.heard.Load() {
		if alert := c.peerAlert(); alert != nil {
			err = fmt.Errorf("%w (%w)", alert, err)
		}
	}
	return n, err
}

func (c *tlsTrackedConn) Read(b []byte) (int, error) { return c.guard.Read(b) }

// read is the TLS connection's own Read, under the guard.
func (c *tlsTrackedConn) read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.heard.Store(true)
	}
	return n, err
}

// peerAlert reads what the broker sent, briefly, and returns it if it is a
// TLS alert.
func (c *tlsTrackedConn) peerAlert() error {
	if err := c.Conn.SetReadDeadline(time.Now().Add(alertWait)); err != nil {
		return nil
	}
	var buf [1]byte
	_, err := c.Conn.Read(buf[:])
	if isTLSAlert(err) {
		return err
	}
	return nil
}

// isTLSAlert reports whether err is an alert the peer sent.
func isTLSAlert(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "remote error"
}

func (c *tlsTrackedConn) Close() error {
	c.once.Do(c.onClose)
	return c.Conn.Close()
}

// attemptConnection is autopaho's AttemptConnection hook: it dials u and
// registers the connection as the pending link, which OnConnectionUp
// promotes to the current one once CONNACK arrives.
func (c *Client) attemptConnection(ctx context.Context, _ autopaho.ClientConfig, u *url.URL) (net.Conn, error) {
	b, err := parseBroker(u.String()) // validated by Dial already
	if err != nil {
		return nil, err
	}
	// autopaho passes its long-lived context here, not the per-attempt one,
	// so dial and TLS handshake need their own timeout.
	ctx, cancelDial := context.WithTimeout(ctx, c.cfg.ConnectTimeout)
	defer cancelDial()
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", b.addr)
	if err != nil {
		return nil, err
	}
	tcp, ok := nc.(*net.TCPConn)
	if !ok {
		nc.Close()
		return nil, fmt.Errorf("dial %s: unexpected connection type %T", b.addr, nc)
	}

	lctx, cancel := context.WithCancelCause(c.ctx)
	l := &link{ctx: lctx, cancel: cancel, broker: u.Redacted()}
	onClose := func() {
		cancel(ErrConnectionLost)
		c.linkClosed(l)
	}

	plain := &trackedConn{TCPConn: tcp, onClose: onClose}
	plain.guard = c.packetGuard(tcp, plain)
	var conn net.Conn = plain
	if b.tls {
		cfg := c.cfg.TLSConfig.Clone()
		if cfg == nil {
			cfg = &tls.Config{}
		}
		if cfg.ServerName == "" {
			cfg.ServerName = b.server
		}
		tc := tls.Client(tcp, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			tc.Close()
			cancel(err)
			return nil, fmt.Errorf("tls handshake with %s: %w", b.addr, err)
		}
		tlc := &tlsTrackedConn{Conn: tc, onClose: onClose}
		tlc.guard = c.packetGuard(readerFunc(tlc.read), tlc)
		conn = tlc
	}

	c.mu.Lock()
	c.pending = l
	c.mu.Unlock()
	return conn, nil
}

// readBuffer is the size of a connection's read buffer. The guard reads
// each packet's fixed header a byte at a time (packetsize.go): unbuffered,
// a packet cost three or four read system calls (its type, one or two
// bytes of length, its body); buffered, the packets that arrived together
// (a fan-out's acks and PUBACKs) share one.
const readBuffer = 4 << 10

// packetGuard returns the guard of a connection that reads from r
// (through a buffer of readBuffer bytes) and writes through w.
func (c *Client) packetGuard(r io.Reader, w lockedWriter) packetGuard {
	return packetGuard{r: bufio.NewReaderSize(r, readBuffer), w: w, limit: c.cfg.MaxPacketSize, onOversize: c.packetTooLarge}
}

// readerFunc is an io.Reader made of a Read function.
type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(b []byte) (int, error) { return f(b) }
