package main

import (
	"crypto/tls"
	"strings"

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
