package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// EtcdClusterConfig configures an embedded multi-member etcd cluster. Dir
// is required.
type EtcdClusterConfig struct {
	// Size is the number of members; 0 means 3.
	Size int
	// Dir holds the members' data dirs (Dir/m0, Dir/m1, ...).
	Dir string
	// Fast sets TickMs=10 and ElectionMs=100 (see EtcdConfig.Fast): a lost
	// leader is replaced within a few hundred milliseconds.
	Fast bool
	// Logger receives the members' warnings and errors; nil means silent.
	Logger *slog.Logger
	// StartTimeout bounds each wait for readiness; 0 means
	// DefaultStartTimeout.
	StartTimeout time.Duration
}

// EtcdCluster is a real etcd cluster of embedded members in this process,
// each on its own free 127.0.0.1 client and peer ports, for leader-loss and
// member-restart tests. Members keep their ports and data dirs across Stop
// and Restart.
type EtcdCluster struct {
	cfg     EtcdClusterConfig
	members []*clusterMember

	mu     sync.Mutex // serialises Stop, Restart and Close
	closed bool
}

type clusterMember struct {
	name       string
	dir        string
	clientAddr string
	peerAddr   string

	srv   atomic.Pointer[embed.Etcd] // nil while stopped
	quiet *atomic.Bool
}

// StartEtcdCluster starts every member and returns once all are ready
// (which needs a leader). On error nothing is left running; ctx only bounds
// the start.
func StartEtcdCluster(ctx context.Context, cfg EtcdClusterConfig) (*EtcdCluster, error) {
	if cfg.Dir == "" {
		return nil, errors.New("sandbox: etcd cluster: Dir is required")
	}
	if cfg.Size == 0 {
		cfg.Size = 3
	}
	if cfg.Size < 1 {
		return nil, fmt.Errorf("sandbox: etcd cluster: size %d", cfg.Size)
	}
	var lastErr error
	for attempt := range 3 {
		c := &EtcdCluster{cfg: cfg}
		for i := range cfg.Size {
			ca, _, err := resolveAddr("")
			if err != nil {
				return nil, err
			}
			pa, _, err := resolveAddr("")
			if err != nil {
				return nil, err
			}
			c.members = append(c.members, &clusterMember{
				name:       fmt.Sprintf("m%d", i),
				dir:        filepath.Join(cfg.Dir, fmt.Sprintf("a%d-m%d", attempt, i)),
				clientAddr: ca,
				peerAddr:   pa,
			})
		}
		err := c.startAll(ctx)
		if err == nil {
			return c, nil
		}
		c.Close()
		lastErr = err
		if !addrInUse(err) {
			break // not a port race
		}
	}
	return nil, lastErr
}

func (c *EtcdCluster) startAll(ctx context.Context) error {
	// Every member must be started before any can be ready: readiness
	// needs a quorum.
	for _, m := range c.members {
		if err := c.launch(m); err != nil {
			return err
		}
	}
	for _, m := range c.members {
		if err := c.waitReady(ctx, m); err != nil {
			return err
		}
	}
	return nil
}

// launch starts m's server without waiting for it.
func (c *EtcdCluster) launch(m *clusterMember) error {
	quiet := new(atomic.Bool)
	srv, err := embed.StartEtcd(c.embedConfig(m, quiet))
	if err != nil {
		return fmt.Errorf("sandbox: etcd cluster: start %s: %w", m.name, err)
	}
	m.quiet = quiet
	m.srv.Store(srv)
	return nil
}

// waitReady waits until m serves; on failure it stops m.
func (c *EtcdCluster) waitReady(ctx context.Context, m *clusterMember) error {
	srv := m.srv.Load()
	timeout := c.cfg.StartTimeout
	if timeout <= 0 {
		timeout = DefaultStartTimeout
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	var err error
	select {
	case <-srv.Server.ReadyNotify():
		return nil
	case err = <-srv.Err():
	case <-srv.Server.StopNotify():
		err = errors.New("stopped before ready")
	case <-ctx.Done():
		err = context.Cause(ctx)
	case <-t.C:
		err = fmt.Errorf("not ready after %v", timeout)
	}
	c.stopMember(m)
	return fmt.Errorf("sandbox: etcd cluster: start %s: %w", m.name, err)
}

func (c *EtcdCluster) stopMember(m *clusterMember) { c.haltMember(m, false) }

// haltMember stops m; hard skips the leadership transfer a graceful stop
// of the leader does, so the others notice only by missing heartbeats.
func (c *EtcdCluster) haltMember(m *clusterMember, hard bool) {
	srv := m.srv.Swap(nil)
	if srv == nil {
		return
	}
	m.quiet.Store(true)
	if hard {
		// Stops raft and its peer transport first: with no connected
		// peer left, Close's leadership transfer is skipped.
		srv.Server.HardStop()
	}
	srv.Close()
}

func (c *EtcdCluster) embedConfig(m *clusterMember, quiet *atomic.Bool) *embed.Config {
	cfg := embed.NewConfig()
	cfg.Name = m.name
	cfg.Dir = m.dir
	client := url.URL{Scheme: "http", Host: m.clientAddr}
	peer := url.URL{Scheme: "http", Host: m.peerAddr}
	cfg.ListenClientUrls = []url.URL{client}
	cfg.AdvertiseClientUrls = []url.URL{client}
	cfg.ListenPeerUrls = []url.URL{peer}
	cfg.AdvertisePeerUrls = []url.URL{peer}
	var ic []string
	for _, o := range c.members {
		ic = append(ic, o.name+"=http://"+o.peerAddr)
	}
	cfg.InitialCluster = strings.Join(ic, ",")
	cfg.InitialClusterToken = "edgefence-sandbox-cluster"
	cfg.ClusterState = embed.ClusterStateFlagNew // ignored once the data dir has a WAL
	cfg.ListenMetricsUrls = nil
	if c.cfg.Fast {
		cfg.TickMs = 10
		cfg.ElectionMs = 100
	}
	var lg *slog.Logger
	if c.cfg.Logger != nil {
		lg = c.cfg.Logger.With("component", "etcd", "member", m.name)
	}
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(newZapLogger(lg, zapcore.WarnLevel, quiet))
	return cfg
}

// Size returns the number of members.
func (c *EtcdCluster) Size() int { return len(c.members) }

// Endpoint returns member i's client URL, "http://127.0.0.1:PORT".
func (c *EtcdCluster) Endpoint(i int) string { return "http://" + c.members[i].clientAddr }

// Endpoints returns every member's client URL, running or not.
func (c *EtcdCluster) Endpoints() []string {
	eps := make([]string, len(c.members))
	for i := range c.members {
		eps[i] = c.Endpoint(i)
	}
	return eps
}

// Client returns a new client for all members (it fails over between
// them) with a silent logger and a 5 s dial timeout. The caller closes it.
func (c *EtcdCluster) Client() (*clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   c.Endpoints(),
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("sandbox: etcd cluster client: %w", err)
	}
	return cli, nil
}

// Running reports whether member i is running.
func (c *EtcdCluster) Running(i int) bool { return c.members[i].srv.Load() != nil }

// Leader returns the index of the member that running members agree is
// the leader (and that is itself running), or -1 if there is none now.
func (c *EtcdCluster) Leader() int {
	ids := make(map[uint64]int, len(c.members))
	var leads []uint64
	for i, m := range c.members {
		if srv := m.srv.Load(); srv != nil {
			ids[uint64(srv.Server.MemberID())] = i
			leads = append(leads, srv.Server.Lead())
		}
	}
	if len(leads) == 0 {
		return -1
	}
	for _, l := range leads[1:] {
		if l != leads[0] {
			return -1
		}
	}
	if i, ok := ids[leads[0]]; ok {
		return i
	}
	return -1
}

// WaitLeader polls until running members agree on a running leader other
// than not (pass -1 for any) and returns its index.
func (c *EtcdCluster) WaitLeader(ctx context.Context, not int) (int, error) {
	tk := time.NewTicker(5 * time.Millisecond)
	defer tk.Stop()
	for {
		if l := c.Leader(); l >= 0 && l != not {
			return l, nil
		}
		select {
		case <-ctx.Done():
			return -1, fmt.Errorf("sandbox: etcd cluster: no leader: %w", context.Cause(ctx))
		case <-tk.C:
		}
	}
}

// Stop stops member i gracefully and waits for it, keeping its data dir
// and ports. A leader hands its leadership to a peer first, as etcd does on
// SIGTERM. Stopping a stopped member is a no-op.
func (c *EtcdCluster) Stop(i int) error { return c.halt(i, false) }

// Kill stops member i abruptly, like a crash or kill -9 of its process: a
// leader does not hand over, the others elect a new one after the election
// timeout. The data dir keeps what was committed; Restart brings it back.
func (c *EtcdCluster) Kill(i int) error { return c.halt(i, true) }

func (c *EtcdCluster) halt(i int, hard bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i < 0 || i >= len(c.members) {
		return fmt.Errorf("sandbox: etcd cluster: no member %d", i)
	}
	c.haltMember(c.members[i], hard)
	return nil
}

// Restart starts member i again on the same ports and data dir (stopping
// it first if it runs) and returns once it is ready, which needs a quorum
// of the cluster running.
func (c *EtcdCluster) Restart(ctx context.Context, i int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	if i < 0 || i >= len(c.members) {
		return fmt.Errorf("sandbox: etcd cluster: no member %d", i)
	}
	m := c.members[i]
	c.stopMember(m)
	if err := c.launch(m); err != nil {
		return err
	}
	return c.waitReady(ctx, m)
}

// Close stops every member and waits. It is idempotent. Close clients
// first: an open client stream holds up a member's stop.
//
// A few of etcd's peer HTTP connection goroutines may outlive Close by up
// to rafthttp.ConnReadTimeout (5 s): etcd's listener re-arms a read
// deadline that net/http relies on to abort a pending read. Leak checks
// should wait for them (the package's tests do).
func (c *EtcdCluster) Close() error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	// Hard stops, concurrently: a graceful stop of the leader would wait
	// for a transferee that is itself stopping.
	var wg sync.WaitGroup
	for _, m := range c.members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.haltMember(m, true)
		}()
	}
	wg.Wait()
	return nil
}
