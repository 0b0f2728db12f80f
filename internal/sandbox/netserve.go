//go:build linux

package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// Default ports of a sandbox served in a lab node: the node's namespace is
// the lab's own, so the well-known ports are free there.
const (
	NetSandboxEtcdPort = 2379
	NetSandboxMQTTPort = 1883
)

// NetSandboxConfig configures an `edgefence-sandbox serve` process run in a
// NetLab node. Bin and Dir are required.
type NetSandboxConfig struct {
	Bin      string   // the edgefence-sandbox binary
	Dir      string   // its --dir; its stderr goes to Dir/serve.log
	EtcdPort int      // 0 means NetSandboxEtcdPort
	MQTTPort int      // 0 means NetSandboxMQTTPort
	Fast     bool     // --fast etcd timing
	Devices  int      // --devices: simulated devices dev-1..dev-N (0: none)
	Env      []string // extra environment, "K=V"
	// MQTTUsers and MQTTACL are serve's --mqtt-users and --mqtt-acl: files
	// of more broker users (user:password lines, BrokerAuth.WritePasswords)
	// and rules (Mosquitto's acl_file format). serve's broker requires
	// credentials.
	MQTTUsers, MQTTACL string
}

// NetSandbox is an `edgefence-sandbox serve` process (embedded etcd and
// mochi broker) running inside a lab node, listening on the node's IP.
type NetSandbox struct {
	*Proc        // Freeze, Resume, Kill, Stop, WaitLine
	Node  string // the node it runs in
	Etcd  string // "http://IP:PORT", reachable from the other nodes
	MQTT  string // "mqtt://IP:PORT", reachable from the other nodes
}

// StartSandbox starts `edgefence-sandbox serve` in node, bound to the
// node's IP, and returns once it reports ready (or ctx is done, or it
// exits). Stop it with Stop (SIGTERM) or Kill before the lab's Close.
func (l *NetLab) StartSandbox(ctx context.Context, node string, cfg NetSandboxConfig) (*NetSandbox, error) {
	if cfg.Bin == "" || cfg.Dir == "" {
		return nil, errors.New("sandbox: netlab sandbox: Bin and Dir are required")
	}
	if _, err := l.node(node); err != nil {
		return nil, err
	}
	if cfg.EtcdPort == 0 {
		cfg.EtcdPort = NetSandboxEtcdPort
	}
	if cfg.MQTTPort == 0 {
		cfg.MQTTPort = NetSandboxMQTTPort
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("sandbox: netlab sandbox: %w", err)
	}
	etcdAddr, mqttAddr := l.HostPort(node, cfg.EtcdPort), l.HostPort(node, cfg.MQTTPort)
	args := []string{"serve", "--dir", cfg.Dir, "--etcd-addr", etcdAddr, "--mqtt-addr", mqttAddr,
		"--devices", strconv.Itoa(cfg.Devices)}
	if cfg.Fast {
		args = append(args, "--fast")
	}
	if cfg.MQTTUsers != "" {
		args = append(args, "--mqtt-users", cfg.MQTTUsers)
	}
	if cfg.MQTTACL != "" {
		args = append(args, "--mqtt-acl", cfg.MQTTACL)
	}
	p, err := StartProc("sandbox@"+node, filepath.Join(cfg.Dir, "serve.log"), cfg.Env, NetLabIP, l.ExecArgs(node, cfg.Bin, args...)...)
	if err != nil {
		return nil, err
	}
	if err := p.WaitLine(ctx, "ready; interrupt to stop"); err != nil {
		return nil, errors.Join(err, ignoreKilled(p.Stop(5*time.Second)))
	}
	return &NetSandbox{Proc: p, Node: node, Etcd: "http://" + etcdAddr, MQTT: "mqtt://" + mqttAddr}, nil
}

// ignoreKilled drops the exit error of a process we stopped on purpose.
func ignoreKilled(err error) error {
	var ee interface{ ExitCode() int }
	if errors.As(err, &ee) {
		return nil
	}
	return err
}
