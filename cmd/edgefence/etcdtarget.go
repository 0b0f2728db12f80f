package main

import (
	"context"
	"flag"
	"fmt"
	"net/url"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/agent/daemon"
)

// addEtcdFlags registers --config, --etcd and --prefix: how the commands
// that talk to etcd directly (twin, etcd) find it.
func addEtcdFlags(fs *flag.FlagSet, config, etcd, prefix *string) {
	fs.StringVar(config, "config", "", "agent config file: etcd endpoints, prefix, credentials and devices (default "+defaultConfig+" unless --etcd is given)")
	fs.StringVar(etcd, "etcd", "", "etcd endpoints, comma-separated (overrides the config's)")
	fs.StringVar(prefix, "prefix", "", "etcd key prefix (overrides the config's; default "+agent.DefaultEtcdPrefix+")")
}

// etcdTarget is the etcd a command talks to, from the etcd flags.
type etcdTarget struct {
	endpoints []string
	prefix    string
	cfg       agent.EtcdConfig // auth, TLS and dial timeout, from the config file
	config    string           // the config file read, "" if none
	known     map[string]bool  // the config's devices; nil without a config
}

// resolveEtcd reads the config file (default defaultConfig unless etcd is
// given) and applies the --etcd and --prefix overrides.
func resolveEtcd(config, etcd, prefix string) (*etcdTarget, error) {
	t := &etcdTarget{prefix: agent.DefaultEtcdPrefix, cfg: agent.EtcdConfig{DialTimeout: 5 * time.Second}}
	if config == "" && etcd == "" {
		config = defaultConfig
	}
	if config != "" {
		c, err := agent.LoadConfig(config)
		if err != nil {
			return nil, err
		}
		t.config, t.cfg, t.endpoints, t.prefix = config, c.Etcd, c.Etcd.Endpoints, c.Etcd.Prefix
		t.known = make(map[string]bool, len(c.Devices))
		for _, d := range c.Devices {
			t.known[d.ID] = true
		}
	}
	if etcd != "" {
		t.endpoints = strings.Split(etcd, ",")
		for _, e := range t.endpoints {
			if u, err := url.Parse(e); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return nil, fmt.Errorf("--etcd: %q is not an http:// or https:// URL", e)
			}
		}
	}
	if prefix != "" {
		if !strings.HasPrefix(prefix, "/") || strings.HasSuffix(prefix, "/") {
			return nil, fmt.Errorf("--prefix %q must start with / and not end with /", prefix)
		}
		t.prefix = prefix
	}
	t.cfg.Endpoints = t.endpoints
	return t, nil
}

// dial connects to the target; a TLS handshake that fails is an error at
// once, an etcd out of reach is not (the first request times out).
func (t *etcdTarget) dial() (*clientv3.Client, error) {
	ccfg, err := daemon.EtcdClientConfig(t.cfg)
	if err != nil {
		return nil, err
	}
	if err := daemon.CheckEtcdTLS(context.Background(), ccfg); err != nil {
		return nil, err
	}
	cli, err := clientv3.New(ccfg)
	if err != nil {
		return nil, fmt.Errorf("etcd client: %w", err)
	}
	return cli, nil
}
