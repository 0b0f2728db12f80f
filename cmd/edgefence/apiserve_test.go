package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/offline"
)

// apiWorld serves agents' local APIs in the test process, on a real etcd,
// without their run loops: what the CLI's --socket and --config reach.
type apiWorld struct {
	t         *testing.T
	dir       string // state_dir of the agents, and their configs
	sockDir   string
	endpoints []string
	cli       *clientv3.Client
}

func newAPIWorld(t *testing.T, dir string) *apiWorld {
	t.Helper()
	etcd, err := sandbox.StartEtcd(t.Context(), sandbox.EtcdConfig{Dir: filepath.Join(dir, "etcd"), Fast: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { etcd.Close() })
	cli, err := etcd.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	sockDir, err := os.MkdirTemp("", "api-") // a socket path must stay under 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	return &apiWorld{t: t, dir: dir, sockDir: sockDir, endpoints: etcd.Endpoints(), cli: cli}
}

// serve writes the config of gateway gw-1 named name, with devices (YAML
// list items), and serves its agent's API with o until the test ends.
func (w *apiWorld) serve(name, devices string, o agent.Options) (cfgPath, sock string) {
	t := w.t
	t.Helper()
	sock = filepath.Join(w.sockDir, name+".sock")
	cfgPath = filepath.Join(w.dir, name+".yaml")
	yaml := "gateway: gw-1\netcd:\n  endpoints: [" + strings.Join(w.endpoints, ",") + "]\n" +
		"mqtt:\n  brokers: [mqtt://127.0.0.1:1]\napi:\n  socket: " + sock + "\nstate_dir: " + w.dir + "\ndevices:\n" + devices
	if err := os.WriteFile(cfgPath, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := agent.LoadConfig(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	if o.Outbox == nil {
		ob, err := offline.Open(filepath.Join(t.TempDir(), offline.File), nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ob.Close() })
		o.Outbox = ob
	}
	a, err := agent.New(c, w.cli, nil, o)
	if err != nil {
		t.Fatal(err)
	}
	l, err := agent.ListenAPI(sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.ServeAPIListener(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return cfgPath, sock
}
