package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// etcdClientConfig is the etcd client configuration of c: endpoints, dial
// timeout, user and password (etcd auth), and TLS for https:// endpoints.
func etcdClientConfig(c agent.EtcdConfig) (clientv3.Config, error) {
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

// mqttCredentials sets the MQTT user, password and TLS files of c in mc.
func mqttCredentials(c agent.MQTTConfig, mc *mqtt.Config) error {
	tc, err := c.TLS.Load("mqtt.tls")
	if err != nil {
		return err
	}
	mc.TLSConfig = tc // nil: the system roots, for mqtts:// brokers
	mc.Username = c.Username
	if p := c.Password.Value(); p != "" {
		mc.Password = []byte(p)
	}
	return nil
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
	backoff := 500 * time.Millisecond
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
		log.Warn("etcd: cannot authenticate yet; retrying", "endpoints", cfg.Endpoints, "user", cfg.Username, "err", err, "retry_in", backoff)
		if waiting != nil {
			waiting("etcd unreachable: waiting to authenticate as "+cfg.Username, backoff+cfg.DialTimeout)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("etcd client: %w", err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 10*time.Second)
	}
}
