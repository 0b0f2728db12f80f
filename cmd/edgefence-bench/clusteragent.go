package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/internal/sandbox"
)

// clusterAgent is one `edgefence run` of the cluster benchmark. A restart
// keeps its name, state dir, socket and metrics port.
type clusterAgent struct {
	name    string
	dir     string
	sock    string
	metrics string // host:port
	log     string
	devs    int
	proc    *rssProc
	api     *agent.APIClient
}

// startAgent starts agent i (gw-i) with devs, its state under the run's
// dir: a restart of gw-i finds its previous run's state (and lease).
func (e *clusterEnv) startAgent(i int, devs []string) (*clusterAgent, error) {
	a := &clusterAgent{name: fmt.Sprintf("gw-%d", i), devs: len(devs)}
	a.dir = filepath.Join(e.cfg.Dir, "cluster", a.name)
	a.sock, a.log = filepath.Join(a.dir, "api.sock"), filepath.Join(a.dir, "agent.log")
	if old := e.agents[i]; old != nil {
		a.metrics = old.metrics
	} else {
		port, err := sandbox.FreePort()
		if err != nil {
			return nil, err
		}
		a.metrics = fmt.Sprintf("127.0.0.1:%d", port)
	}
	if err := os.MkdirAll(a.dir, 0o700); err != nil {
		return nil, err
	}
	auth, err := e.trust.auth(a.name)
	if err != nil {
		return nil, err
	}
	cpath := filepath.Join(a.dir, "edgefence.yaml")
	if err := os.WriteFile(cpath, e.agentYAML(a, devs, auth), 0o600); err != nil {
		return nil, err
	}
	// The log is appended across restarts (startRSSProc truncates: keep
	// each run's log apart).
	logPath := a.log
	if _, err := os.Stat(logPath); err == nil {
		logPath = filepath.Join(a.dir, fmt.Sprintf("agent-%d.log", time.Now().UnixNano()))
	}
	p, err := startRSSProc(e.cfg.AgentBin, cpath, e.cfg.Env, logPath, e.cfg.TimerSlack)
	if err != nil {
		return nil, err
	}
	a.log, a.proc, a.api = logPath, p, agent.NewAPIClient(a.sock)
	return a, nil
}

// agentYAML is a's config: every etcd member, the run's prefix and TTL;
// signed with auth (its devices `auth: required`), or unsigned (`auth:
// off`) if nil.
func (e *clusterEnv) agentYAML(a *clusterAgent, devs []string, auth *agent.AuthConfig) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, `gateway: %s
state_dir: %s
etcd:
  endpoints: [%s]
  prefix: %s
  lease_ttl: %s
mqtt:
  brokers: [%s]
  prefix: %s
  client_id: bench-cluster-%s
api:
  socket: %s
metrics:
  listen: %s
  pprof: %t
command:
  timeout: 30s
log:
  level: warn
  format: text
`, a.name, filepath.Join(a.dir, "state"), strings.Join(e.etcd.Endpoints(), ", "), e.prefix, e.cfg.TTL, e.broker.url, clusterMQTTPrefix,
		a.name, a.sock, a.metrics, e.cfg.ProfDir != "")
	if auth != nil {
		b.WriteString(authYAML(*auth))
	}
	b.WriteString("devices:\n")
	for _, d := range devs {
		fmt.Fprintf(&b, "  - id: %s\n", d)
		if auth == nil {
			b.WriteString("    auth: off\n")
		}
	}
	return []byte(b.String())
}

// kill kills the agent with SIGKILL and waits for it.
func (a *clusterAgent) kill() error {
	if err := a.proc.cmd.Process.Kill(); err != nil {
		return fmt.Errorf("kill %s: %w", a.name, err)
	}
	err := <-a.proc.exited
	a.proc.exited <- err
	a.proc.logf.Close()
	return nil
}

// stop stops the agent (SIGTERM) if it still runs.
func (a *clusterAgent) stop() {
	if a != nil && !a.exited() {
		a.proc.stop()
	}
}

func (a *clusterAgent) exited() bool {
	select {
	case err := <-a.proc.exited:
		a.proc.exited <- err
		return true
	default:
		return false
	}
}

// waitSession waits until the agent's API answers with its etcd session
// open.
func (a *clusterAgent) waitSession(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		st, err := a.api.Status(ctx)
		if err == nil && st.Etcd.Session {
			return nil
		}
		if a.exited() {
			return fmt.Errorf("%s exited (log %s)", a.name, a.log)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: no etcd session after %v (%v; log %s)", a.name, limit, err, a.log)
		}
		if !sleepCtx(ctx, 50*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// sessions returns how many etcd sessions the agent opened since its
// start (0 if its status does not answer).
func (a *clusterAgent) sessions(ctx context.Context) uint64 {
	st, err := a.api.Status(ctx)
	if err != nil {
		return 0
	}
	return st.Etcd.Sessions
}

// holdingSince returns when each device in set (all if nil) the agent
// holds became held, and how many etcd sessions it opened so far.
func (a *clusterAgent) holdingSince(ctx context.Context, set map[string]bool) ([]time.Time, uint64, error) {
	st, err := a.api.Status(ctx)
	if err != nil {
		return nil, 0, fmt.Errorf("%s status: %w", a.name, err)
	}
	var out []time.Time
	for _, d := range st.Devices {
		if d.State == agent.StateHolding && (set == nil || set[d.ID]) {
			out = append(out, d.Since)
		}
	}
	return out, st.Etcd.Sessions, nil
}
