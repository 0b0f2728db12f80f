package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// EtcdProcClusterConfig configures a multi-node etcd run from its binary.
type EtcdProcClusterConfig struct {
	// Dir holds one data dir per member (m0, m1, ...). Required.
	Dir string
	// Members is the cluster size (at least 1; 3 for a quorum that
	// survives one member's loss).
	Members int
	// Bin is the etcd binary; "" means EtcdBinPath, else etcd in PATH.
	Bin string
	// Fast: heartbeat 10 ms, election 100 ms; else etcd's defaults
	// (100 ms, 1 s), as a deployment runs.
	Fast bool
	// Args are more flags for every member (e.g. --snapshot-count=10000).
	Args []string
}

// EtcdProcCluster is an etcd cluster of Members separate processes — the
// etcd binary (Debian's etcd-server 3.4), each member with its own client
// and peer port on 127.0.0.1 — unlike EtcdCluster, whose members share
// this process. A member can be killed (SIGKILL) like a crashed node.
// Close stops every member; the death of this process does too (Linux).
type EtcdProcCluster struct {
	cfg     EtcdProcClusterConfig
	bin     string
	members []*etcdMember
}

// etcdMember is one member's process and addresses.
type etcdMember struct {
	name         string
	client, peer string // 127.0.0.1:PORT

	mu   sync.Mutex
	proc *childProc // nil once killed or closed
}

// StartEtcdProcCluster starts cfg.Members etcd processes as one cluster
// and returns once a linearizable read succeeds (a leader is elected).
// ctx bounds the processes' life, as with exec.CommandContext. Without the
// binary it returns an error wrapping ErrNoEtcd.
func StartEtcdProcCluster(ctx context.Context, cfg EtcdProcClusterConfig) (*EtcdProcCluster, error) {
	if cfg.Dir == "" || cfg.Members < 1 {
		return nil, errors.New("sandbox: etcd cluster: Dir and at least one member are required")
	}
	bin, err := findEtcd(cfg.Bin)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("sandbox: etcd cluster: %w", err)
	}
	c := &EtcdProcCluster{cfg: cfg, bin: bin}
	var initial []string
	for i := range cfg.Members {
		m := &etcdMember{name: fmt.Sprintf("m%d", i)}
		if m.client, _, err = resolveAddr(""); err != nil {
			return nil, err
		}
		if m.peer, _, err = resolveAddr(""); err != nil {
			return nil, err
		}
		c.members = append(c.members, m)
		initial = append(initial, m.name+"=http://"+m.peer)
	}
	for _, m := range c.members {
		p, err := startChild(ctx, "", []string{"ETCD_UNSUPPORTED_ARCH=" + runtime.GOARCH}, bin, c.memberArgs(m, strings.Join(initial, ","))...)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("sandbox: start etcd member %s: %w", m.name, err)
		}
		m.proc = p
	}
	if err := c.waitReady(ctx); err != nil {
		tails := c.tails()
		c.Close()
		return nil, fmt.Errorf("sandbox: etcd cluster of %d: %w; members said: %s", cfg.Members, err, tails)
	}
	return c, nil
}

func (c *EtcdProcCluster) memberArgs(m *etcdMember, initial string) []string {
	client, peer := "http://"+m.client, "http://"+m.peer
	args := []string{
		"--name", m.name, "--data-dir", filepath.Join(c.cfg.Dir, m.name),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", initial, "--initial-cluster-token", "edgefence-sandbox-cluster",
		"--initial-cluster-state", "new", "--logger", "zap", "--log-level", "warn",
		// Its warnings (slow applies, slow fsyncs) to a file beside the
		// data dir as well: the figures of a benchmark need them.
		"--log-outputs", "stderr," + filepath.Join(c.cfg.Dir, m.name+".log"),
	}
	if c.cfg.Fast {
		args = append(args, "--heartbeat-interval", "10", "--election-timeout", "100")
	}
	return append(args, c.cfg.Args...)
}

// waitReady waits until every member listens and the cluster answers a
// linearizable read.
func (c *EtcdProcCluster) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, etcdProcWait)
	defer cancel()
	for _, m := range c.members {
		if err := waitListening(ctx, m.client, m.proc.done); err != nil {
			return fmt.Errorf("member %s: %w", m.name, err)
		}
	}
	cli, err := c.Client()
	if err != nil {
		return err
	}
	defer cli.Close()
	return awaitRead(ctx, cli, nil)
}

func (c *EtcdProcCluster) tails() string {
	var out []string
	for _, m := range c.members {
		if m.proc != nil {
			out = append(out, m.name+": "+strings.TrimSpace(m.proc.stderr.String()))
		}
	}
	return strings.Join(out, "; ")
}

// Endpoints returns every member's client URL, "http://127.0.0.1:PORT".
func (c *EtcdProcCluster) Endpoints() []string {
	out := make([]string, len(c.members))
	for i, m := range c.members {
		out[i] = "http://" + m.client
	}
	return out
}

// Version returns what `etcd --version` says the members' version is.
func (c *EtcdProcCluster) Version() (string, error) {
	return (&EtcdProc{bin: c.bin}).Version()
}

// Members returns the number of members.
func (c *EtcdProcCluster) Members() int { return len(c.members) }

// Pid returns member i's process id, or 0 once it was killed or closed.
func (c *EtcdProcCluster) Pid(i int) int {
	m := c.members[i]
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.proc == nil {
		return 0
	}
	return m.proc.cmd.Process.Pid
}

// Client returns a new client over every member's endpoint, with a silent
// logger and a 5 s dial timeout. The caller closes it.
func (c *EtcdProcCluster) Client() (*clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("sandbox: etcd client: %w", err)
	}
	return cli, nil
}

// MemberStatus is one member's answer to the Status RPC.
type MemberStatus struct {
	Index    int
	Endpoint string
	Leader   bool
	DBSize   int64 // bytes allocated to the backend file
	DBInUse  int64 // bytes in use in it
	Revision int64
	Err      error // the member did not answer (killed, or no quorum)
}

// Status asks each live member for its status (endpoint status).
func (c *EtcdProcCluster) Status(ctx context.Context, cli *clientv3.Client) []MemberStatus {
	out := make([]MemberStatus, len(c.members))
	for i, ep := range c.Endpoints() {
		out[i] = MemberStatus{Index: i, Endpoint: ep}
		if c.Pid(i) == 0 {
			out[i].Err = errors.New("not running")
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		s, err := cli.Status(sctx, ep)
		cancel()
		if err != nil {
			out[i].Err = err
			continue
		}
		out[i].Leader = s.Header.MemberId == s.Leader
		out[i].DBSize, out[i].DBInUse, out[i].Revision = s.DbSize, s.DbSizeInUse, s.Header.Revision
	}
	return out
}

// Leader returns the index of the member that says it is the leader, or
// an error if none does.
func (c *EtcdProcCluster) Leader(ctx context.Context, cli *clientv3.Client) (int, error) {
	for _, s := range c.Status(ctx, cli) {
		if s.Err == nil && s.Leader {
			return s.Index, nil
		}
	}
	return -1, errors.New("sandbox: etcd cluster: no member says it leads")
}

// Kill kills member i with SIGKILL and waits for it, as a crashed node.
func (c *EtcdProcCluster) Kill(i int) error {
	m := c.members[i]
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.proc == nil {
		return fmt.Errorf("sandbox: etcd member %s: not running", m.name)
	}
	if err := m.proc.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return fmt.Errorf("sandbox: kill etcd member %s: %w", m.name, err)
	}
	<-m.proc.done
	m.proc = nil
	return nil
}

// Close stops every member (SIGTERM, then SIGKILL) and waits; idempotent.
// The data dirs stay.
func (c *EtcdProcCluster) Close() {
	if c == nil {
		return
	}
	for _, m := range c.members {
		m.mu.Lock()
		if m.proc != nil {
			stopProc(m.proc)
			m.proc = nil
		}
		m.mu.Unlock()
	}
}
