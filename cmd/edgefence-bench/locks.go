package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/edgefence/edgefence/agent/daemon"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/internal/sandbox"
)

// locksConfig configures the lock acquisition benchmark.
type locksConfig struct {
	N    int // devices
	Runs int
	Dir  string
	Log  io.Writer
}

// Lock benchmark variants, as printed.
const (
	locksAgent     = "agent.Run: start → all held (1 goroutine per device: Lock + Get)"
	locksRelease   = "agent shutdown: release all (sequential Unlock + revoke)"
	locksBare16    = "bare: 16 goroutines, Mutex.Lock"
	locksBare16Get = "bare: 16 goroutines, Mutex.Lock + Get (the agent's work)"
	locksBareAll   = "bare: 1 goroutine per device, Mutex.Lock + Get (the agent's shape)"
)

var locksVariants = []string{locksAgent, locksRelease, locksBare16, locksBare16Get, locksBareAll}

type locksResult struct {
	N     int
	Times map[string][]time.Duration // per variant, one per run
}

func runLocks(ctx context.Context, etcd *sandbox.Etcd, cfg locksConfig) (*locksResult, error) {
	cli, err := etcd.Client()
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	// The agent's broker: it subscribes to the devices' ack topics, as in
	// production, while it campaigns.
	br, err := sandbox.StartBroker(sandbox.BrokerConfig{})
	if err != nil {
		return nil, err
	}
	defer br.Close()
	res := &locksResult{N: cfg.N, Times: map[string][]time.Duration{}}
	fmt.Fprintf(cfg.Log, "locks: %d devices, %d runs\n", cfg.N, cfg.Runs)
	for r := range cfg.Runs {
		// The variants take turns within each run.
		acq, rel, err := agentAcquire(ctx, etcd, br.URL(), filepath.Join(cfg.Dir, fmt.Sprintf("locks-%d", r)), cfg.N)
		if err != nil {
			return nil, err
		}
		res.Times[locksAgent] = append(res.Times[locksAgent], acq)
		res.Times[locksRelease] = append(res.Times[locksRelease], rel)
		for _, v := range []struct {
			name    string
			workers int
			get     bool
		}{{locksBare16, 16, false}, {locksBare16Get, 16, true}, {locksBareAll, cfg.N, true}} {
			d, err := bareAcquire(ctx, cli, cfg.N, v.workers, v.get, fmt.Sprintf("/bench/locks/bare-%d-%v-%d-%d", v.workers, v.get, r, time.Now().UnixNano()))
			if err != nil {
				return nil, fmt.Errorf("%s: %w", v.name, err)
			}
			res.Times[v.name] = append(res.Times[v.name], d)
		}
		fmt.Fprintf(cfg.Log, "locks: run %d: agent %v (release %v)\n", r+1, acq.Round(time.Millisecond), rel.Round(time.Millisecond))
	}
	return res, nil
}

// heldCounter counts acquisitions (agent.Options.OnHolding) and closes all
// when n have been seen: the exact moment the last device is held, without
// polling Status.
type heldCounter struct {
	n    int64
	seen atomic.Int64
	all  chan struct{}
	at   atomic.Int64 // UnixNano of the n-th acquisition
}

func (h *heldCounter) onHolding(string, fence.Token) {
	if h.seen.Add(1) == h.n {
		h.at.Store(time.Now().UnixNano())
		close(h.all)
	}
}

// agentAcquire runs a fresh agent for n devices (agent/daemon, its state
// in dir) and returns the time from Run's start to the last device held,
// and the time its clean shutdown took (locks released, lease revoked,
// everything closed).
func agentAcquire(ctx context.Context, etcd *sandbox.Etcd, brokerURL, dir string, n int) (acquire, release time.Duration, err error) {
	cfg := agentConfig("bench-locks", dir, etcd, brokerURL, deviceIDs("dev-", n))
	cfg.Command.Timeout = time.Second
	hc := &heldCounter{n: int64(n), all: make(chan struct{})}
	a, err := startAgent(ctx, cfg, daemon.Options{OnHolding: hc.onHolding})
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = a.stop() }()
	start := a.started

	select {
	case <-hc.all:
		acquire = time.Unix(0, hc.at.Load()).Sub(start)
	case <-time.After(60 * time.Second):
		return 0, 0, fmt.Errorf("agent holds %d of %d devices after 60s", a.Status().Counters.Acquired, n)
	}
	if got := a.Status().Counters.Acquired; got != uint64(n) {
		return 0, 0, fmt.Errorf("agent acquired %d locks, want %d", got, n)
	}
	t0 := time.Now()
	if err := a.stop(); err != nil {
		return 0, 0, err
	}
	return acquire, time.Since(t0), nil
}

// bareAcquire takes n locks on one new session with workers goroutines
// (each device's concurrency.Mutex.Lock, then, if get, a Get of its key
// as the agent does for the token), from session creation to the last lock,
// then revokes the session.
func bareAcquire(ctx context.Context, cli *clientv3.Client, n, workers int, withGet bool, prefix string) (time.Duration, error) {
	start := time.Now()
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(10))
	if err != nil {
		return 0, err
	}
	defer sess.Close()
	var get func(*concurrency.Mutex) error
	if withGet {
		get = func(m *concurrency.Mutex) error {
			_, err := cli.Get(ctx, m.Key())
			return err
		}
	}
	err = bareLockAll(ctx, sess, bareKeys(prefix, n), workers, get)
	if err != nil {
		return 0, err
	}
	return time.Since(start), nil
}
