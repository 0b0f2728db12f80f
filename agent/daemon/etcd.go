package daemon

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/internal/backoff"
)

// EtcdClientConfig is the etcd client configuration of c: endpoints, dial
// timeout, user and password (etcd auth), and TLS for https:// endpoints.
func EtcdClientConfig(c agent.EtcdConfig) (clientv3.Config, error) {
	tc, err := c.TLS.Load("etcd.tls")
	if err != nil {
		return clientv3.Config{}, err
	}
	if tc == nil && anyPrefix(c.Endpoints, "https://") {
		tc = &tls.Config{MinVersion: tls.VersionTLS12} // the system roots
	}
	return clientv3.Config{
		Endpoints:   c.Endpoints,
		DialTimeout: c.DialTimeout,
		Username:    c.Username,
		Password:    c.Password.Value(),
		TLS:         tc,
		Logger:      zap.NewNop(),
	}, nil
}

// CheckEtcdTLS connects to cfg's https:// endpoints with cfg.TLS, within
// cfg.DialTimeout (default 5s), and returns an error naming the TLS problem when no
// endpoint accepts the TLS handshake and at least one refuses it: etcd's
// certificate fails verification (etcd.tls.ca_file), or etcd refuses ours
// (cert_file, key_file). The etcd client cannot say so itself: its RPCs
// wait for a connection that never comes up and then report only
// "context deadline exceeded". Endpoints out of reach are not a TLS
// problem: the agent starts without etcd and retries.
func CheckEtcdTLS(ctx context.Context, cfg clientv3.Config) error {
	if cfg.TLS == nil {
		return nil
	}
	wait := cfg.DialTimeout
	if wait <= 0 {
		wait = 5 * time.Second // etcd.dial_timeout's default
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	type verdict struct {
		accepted bool
		err      error
	}
	verdicts := make([]verdict, len(cfg.Endpoints))
	var wg sync.WaitGroup
	for i, ep := range cfg.Endpoints {
		wg.Go(func() {
			ok, err := probeTLS(ctx, ep, cfg.TLS)
			verdicts[i] = verdict{ok, err}
		})
	}
	wg.Wait()
	var refused []error
	for i, v := range verdicts {
		if v.accepted {
			return nil
		}
		if v.err != nil {
			refused = append(refused, fmt.Errorf("etcd %s: %w", cfg.Endpoints[i], v.err))
		}
	}
	if len(refused) == 0 {
		return nil
	}
	return fmt.Errorf("%w (check etcd.tls: ca_file, cert_file, key_file)", errors.Join(refused...))
}

// probeTLS says whether endpoint, if an https:// URL, accepts a TLS
// connection made with tc, or the error if it refuses one. Out of reach
// is neither (false, nil).
func probeTLS(ctx context.Context, endpoint string, tc *tls.Config) (bool, error) {
	u, err := url.Parse(endpoint)
	if err != nil || !strings.EqualFold(u.Scheme, "https") {
		return false, nil
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", u.Host)
	if err != nil {
		return false, nil
	}
	defer nc.Close()
	cfg := tc.Clone()
	if cfg.ServerName == "" {
		cfg.ServerName = u.Hostname() // as the etcd client does
	}
	cfg.NextProtos = []string{"h2"} // gRPC
	conn := tls.Client(nc, cfg)
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	if err := conn.HandshakeContext(ctx); err != nil {
		if tlsRefusal(err) {
			return false, err
		}
		return false, nil
	}
	// A TLS 1.3 server checks our certificate after our side of the
	// handshake is done and answers with an alert. The HTTP/2 preface
	// makes a server that accepted us answer with its SETTINGS instead.
	_, _ = io.WriteString(conn, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
	var b [1]byte
	if _, err := conn.Read(b[:]); err != nil {
		if tlsRefusal(err) {
			return false, err
		}
		return false, nil
	}
	return true, nil
}

// tlsRefusal reports whether err is a TLS verdict, not a network failure:
// a certificate that fails verification, an alert from the peer, or a
// peer that does not speak TLS.
func tlsRefusal(err error) bool {
	var (
		verr *tls.CertificateVerificationError
		uerr x509.UnknownAuthorityError
		herr x509.HostnameError
		cerr x509.CertificateInvalidError
		rerr tls.RecordHeaderError
		aerr tls.AlertError
		oerr *net.OpError
	)
	return errors.As(err, &verr) || errors.As(err, &uerr) || errors.As(err, &herr) || errors.As(err, &cerr) ||
		errors.As(err, &rerr) || errors.As(err, &aerr) || errors.As(err, &oerr) && oerr.Op == "remote error"
}

func anyPrefix(ss []string, prefix string) bool {
	for _, s := range ss {
		if strings.HasPrefix(strings.ToLower(s), prefix) {
			return true
		}
	}
	return false
}

// newEtcdClient returns an etcd client. Without a user it connects lazily
// (the agent's session loop retries). With one, clientv3.New authenticates
// at once and fails if etcd is out of reach: then it is retried with
// backoff until ctx ends, and a refused user or password is an error.
// waiting, if set, is told before each wait why and for how long (the
// systemd notifier extends its start timeout with it).
func newEtcdClient(ctx context.Context, cfg clientv3.Config, log *slog.Logger, waiting func(why string, next time.Duration)) (*clientv3.Client, error) {
	// Jittered: the gateways of a site that lost power together do not
	// all come back to etcd in step.
	delay := backoff.Backoff{Min: 500 * time.Millisecond, Max: 10 * time.Second}
	for {
		cli, err := clientv3.New(cfg)
		switch {
		case err == nil:
			return cli, nil
		case errors.Is(err, rpctypes.ErrAuthFailed), errors.Is(err, rpctypes.ErrGRPCAuthFailed):
			return nil, fmt.Errorf("etcd %s: %w (check etcd.username and etcd.password or %s)", strings.Join(cfg.Endpoints, ","), err, agent.EnvEtcdPassword)
		case cfg.Username == "":
			return nil, fmt.Errorf("etcd client: %w", err)
		}
		wait := delay.Next()
		log.Warn("etcd: cannot authenticate yet; retrying", "endpoints", cfg.Endpoints, "user", cfg.Username, "err", err, "retry_in", wait)
		if waiting != nil {
			waiting("etcd unreachable: waiting to authenticate as "+cfg.Username, wait+cfg.DialTimeout)
		}
		if !backoff.Sleep(ctx, wait) {
			return nil, fmt.Errorf("etcd client: %w", err)
		}
	}
}
