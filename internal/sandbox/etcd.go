package sandbox

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// DefaultStartTimeout bounds how long StartEtcd and Start wait for etcd to
// become ready when EtcdConfig.StartTimeout is zero.
const DefaultStartTimeout = 30 * time.Second

// EtcdConfig configures an embedded single-node etcd. The zero value is not
// usable: Dir is required.
type EtcdConfig struct {
	// Dir is the data dir; required (tests pass t.TempDir()). Restart and a
	// later StartEtcd on the same Dir keep the data.
	Dir string
	// Fast sets TickMs=10 and ElectionMs=100: etcd is ready in tens of
	// milliseconds and honours lease TTLs of 1–2 s (the minimum TTL is
	// 1.5 × the election timeout; 2 s with the defaults of 100/1000 ms).
	Fast bool
	// ClientAddr is the client listen address, "HOST:PORT". An empty string,
	// an empty host or port 0 pick 127.0.0.1 and a free port.
	ClientAddr string
	// Logger receives etcd's warnings and errors (its info level is too
	// chatty). nil means silent.
	Logger *slog.Logger
	// StartTimeout bounds the wait for readiness; 0 means DefaultStartTimeout.
	StartTimeout time.Duration
	// TLS, if set, serves the client URL over TLS: Endpoint is then
	// https://. nil means plain http://.
	TLS *EtcdTLS
}

// EtcdTLS is the TLS of etcd's client listener, as PEM files.
type EtcdTLS struct {
	CertFile, KeyFile string // the server's certificate and key
	// ClientCAFile is the CA bundle client certificates are verified
	// with; ClientCertAuth makes a valid one required (mutual TLS).
	ClientCAFile   string
	ClientCertAuth bool
	// Client is what Etcd.Client connects with: its RootCAs and, for
	// ClientCertAuth, its Certificates. nil fails Client.
	Client *tls.Config
}

// Etcd is an embedded single-node etcd serving on loopback. Its endpoint
// stays the same across Stop/Start and Restart.
type Etcd struct {
	cfg        EtcdConfig
	clientAddr string // HOST:PORT, fixed at StartEtcd
	peerAddr   string // 127.0.0.1:PORT, fixed at StartEtcd

	mu     sync.Mutex
	srv    *embed.Etcd  // nil while stopped
	quiet  *atomic.Bool // demotes srv's log to debug while it stops
	closed bool
}

// StartEtcd starts etcd and returns once it is ready to serve, or an error
// if it is not ready within cfg.StartTimeout or before ctx is done. ctx only
// bounds the start; Close stops the server. If StartEtcd picked the ports
// and one is taken meanwhile, it retries with fresh ports.
func StartEtcd(ctx context.Context, cfg EtcdConfig) (*Etcd, error) {
	if cfg.Dir == "" {
		return nil, errors.New("sandbox: etcd: Dir is required")
	}
	var lastErr error
	for range 3 {
		clientAddr, clientPicked, err := resolveAddr(cfg.ClientAddr)
		if err != nil {
			return nil, err
		}
		peerAddr, _, err := resolveAddr("")
		if err != nil {
			return nil, err
		}
		e := &Etcd{cfg: cfg, clientAddr: clientAddr, peerAddr: peerAddr}
		err = e.Start(ctx)
		if err == nil {
			return e, nil
		}
		lastErr = err
		if !addrInUse(err) || (!clientPicked && strings.Contains(err.Error(), clientAddr)) {
			break // not a port race, or the caller's fixed address is taken
		}
	}
	return nil, lastErr
}

// Endpoint returns the client URL, "http://127.0.0.1:PORT", or
// "https://127.0.0.1:PORT" with EtcdConfig.TLS.
func (e *Etcd) Endpoint() string { return e.scheme() + "://" + e.clientAddr }

func (e *Etcd) scheme() string {
	if e.cfg.TLS != nil {
		return "https"
	}
	return "http"
}

// Endpoints returns Endpoint as a slice, for clientv3.Config.Endpoints.
func (e *Etcd) Endpoints() []string { return []string{e.Endpoint()} }

// Dir returns the data dir.
func (e *Etcd) Dir() string { return e.cfg.Dir }

// Client returns a new etcd client for this server with a silent logger and
// a 5 s dial timeout (over TLS with EtcdTLS.Client). The caller closes it.
func (e *Etcd) Client() (*clientv3.Client, error) {
	var tc *tls.Config
	if e.cfg.TLS != nil {
		if tc = e.cfg.TLS.Client; tc == nil {
			return nil, errors.New("sandbox: etcd client: EtcdTLS.Client is nil")
		}
	}
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   e.Endpoints(),
		DialTimeout: 5 * time.Second,
		TLS:         tc,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("sandbox: etcd client: %w", err)
	}
	return c, nil
}

// CutClient returns a new client of this server through a CutProxy, so a
// test can cut that client off (and heal it) without touching the others.
// The caller closes both.
func (e *Etcd) CutClient() (*CutProxy, *clientv3.Client, error) {
	p, err := StartCutProxy(e.clientAddr)
	if err != nil {
		return nil, nil, err
	}
	var tc *tls.Config
	if e.cfg.TLS != nil {
		tc = e.cfg.TLS.Client
	}
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{e.scheme() + "://" + p.Addr()},
		DialTimeout: 5 * time.Second,
		TLS:         tc,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		p.Close()
		return nil, nil, fmt.Errorf("sandbox: etcd client: %w", err)
	}
	return p, c, nil
}

// Start starts a stopped server again on the same ports and data dir and
// waits until it is ready. It is a no-op while running and returns ErrClosed
// after Close.
func (e *Etcd) Start(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return ErrClosed
	}
	if e.srv != nil {
		return nil
	}
	return e.startLocked(ctx)
}

// Stop stops the server and waits for it, keeping the data dir and ports
// for Start. Clients see the endpoint refuse connections until then. Stop on
// a stopped server is a no-op.
func (e *Etcd) Stop() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.stopLocked()
	return nil
}

// Restart stops the server and starts it again on the same ports and data
// dir, returning once it is ready.
func (e *Etcd) Restart(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return restartServer(ctx, e.closed, e.stopLocked, e.startLocked, "")
}

// Wipe stops the server, empties its data dir and starts a new cluster on
// the same ports: every key and lease is gone and revisions start again at
// 1, as after a rebuild from nothing.
func (e *Etcd) Wipe(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return restartServer(ctx, e.closed, e.stopLocked, e.startLocked, e.cfg.Dir)
}

// restartServer stops a server and starts it again on the same ports; with
// a wipeDir it empties that data dir in between. The caller holds the
// server's lock.
func restartServer(ctx context.Context, closed bool, stop func(), start func(context.Context) error, wipeDir string) error {
	if closed {
		return ErrClosed
	}
	stop()
	if wipeDir != "" {
		if err := os.RemoveAll(wipeDir); err != nil {
			return fmt.Errorf("sandbox: wipe etcd: %w", err)
		}
	}
	return start(ctx)
}

// Close stops the server and waits for it. It is idempotent and safe on an
// Etcd whose start failed.
func (e *Etcd) Close() error {
	if e == nil {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	e.stopLocked()
	return nil
}

func (e *Etcd) stopLocked() {
	if e.srv == nil {
		return
	}
	e.quiet.Store(true)
	e.srv.Close() // waits for the server and its handlers
	e.srv, e.quiet = nil, nil
}

// startLocked starts the server and waits for readiness; on success it sets
// e.srv, on failure it leaves nothing running.
func (e *Etcd) startLocked(ctx context.Context) error {
	if err := context.Cause(ctx); err != nil {
		return fmt.Errorf("sandbox: start etcd: %w", err)
	}
	quiet := new(atomic.Bool)
	srv, err := embed.StartEtcd(e.embedConfig(quiet))
	if err != nil {
		return fmt.Errorf("sandbox: start etcd: %w", err)
	}
	timeout := e.cfg.StartTimeout
	if timeout <= 0 {
		timeout = DefaultStartTimeout
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-srv.Server.ReadyNotify():
		e.srv, e.quiet = srv, quiet
		return nil
	case err = <-srv.Err():
		err = fmt.Errorf("sandbox: start etcd: %w", err)
	case <-srv.Server.StopNotify():
		err = errors.New("sandbox: start etcd: server stopped before ready")
	case <-ctx.Done():
		err = fmt.Errorf("sandbox: start etcd: %w", context.Cause(ctx))
	case <-t.C:
		err = fmt.Errorf("sandbox: start etcd: not ready after %v", timeout)
	}
	quiet.Store(true)
	srv.Close()
	return err
}

func (e *Etcd) embedConfig(quiet *atomic.Bool) *embed.Config {
	cfg := embed.NewConfig()
	cfg.Name = "sandbox"
	cfg.Dir = e.cfg.Dir
	client := url.URL{Scheme: e.scheme(), Host: e.clientAddr}
	peer := url.URL{Scheme: "http", Host: e.peerAddr}
	cfg.ListenClientUrls = []url.URL{client}
	cfg.AdvertiseClientUrls = []url.URL{client}
	cfg.ListenPeerUrls = []url.URL{peer}
	cfg.AdvertisePeerUrls = []url.URL{peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.InitialClusterToken = "edgefence-sandbox"
	cfg.ListenMetricsUrls = nil // no metrics listener
	if t := e.cfg.TLS; t != nil {
		cfg.ClientTLSInfo.CertFile = t.CertFile
		cfg.ClientTLSInfo.KeyFile = t.KeyFile
		cfg.ClientTLSInfo.TrustedCAFile = t.ClientCAFile
		cfg.ClientTLSInfo.ClientCertAuth = t.ClientCertAuth
	}
	if e.cfg.Fast {
		cfg.TickMs = 10
		cfg.ElectionMs = 100
	}
	var lg *slog.Logger
	if e.cfg.Logger != nil {
		lg = e.cfg.Logger.With("component", "etcd")
	}
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(newZapLogger(lg, zapcore.WarnLevel, quiet))
	return cfg
}
