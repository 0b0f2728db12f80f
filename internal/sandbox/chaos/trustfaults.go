package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/internal/backoff"
)

// trustBound bounds each wait of the trust scenarios for something the
// agents do by themselves (put the trust back, let a device go).
const trustBound = 30 * time.Second

// offlineAtAcquisition is FaultOffline: the device simulator is killed, the
// busiest holder frozen past its lease so that the other gateway acquires
// its devices while they are offline (a gateway they may never have
// heard of: they were provisioned with the root only), commands queue;
// then the holder wakes and the devices come back on a fresh MQTT session
// (a new client id: nothing the broker queued for the old one), where
// the new holder's retained trust update and its resends must reach them.
func (r *round) offlineAtAcquisition(ctx context.Context) error {
	r.devsimMu.Lock()
	p := r.devsim
	r.devsimMu.Unlock()
	if err := p.Kill(); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	<-p.Done()
	r.fault(FaultOffline)
	r.logf("device simulator down; freezing the busiest holder so that the other acquires its devices while they are offline")
	if err := r.freeze(ctx, r.busiestHolder(ctx), r.outage(r.cfg.TTL+time.Second, 2*r.cfg.TTL+time.Second)); err != nil {
		return err
	}
	backoff.Sleep(ctx, r.jitter(200*time.Millisecond, time.Second))
	r.devsimMu.Lock()
	r.devsimClientID = fmt.Sprintf("devsim-chaos-%d", r.devsimRuns+1)
	r.devsimMu.Unlock()
	r.logf("devices back on a fresh session (client id %s)", r.devsimClientID)
	return r.startDevsim(ctx)
}

// etcdRebuilt is FaultEtcdRebuilt: etcd is wiped mid-run (revisions start
// again at 1, the trust statements are gone). Signed, the agents must put
// the statements back by themselves; the tokens regress, so the devices
// refuse the new holders as stale until the round recovers as the README
// runbook says: every gateway's status and the home gateway's fence list,
// then `edgefence etcd bump-revision --from …` past the highest token,
// then a restart of the agents that refused a device.
func (r *round) etcdRebuilt(ctx context.Context) error {
	if err := r.etcd.Wipe(ctx); err != nil {
		return err
	}
	r.fault(FaultEtcdRebuilt)
	r.logf("etcd wiped: revisions start again at 1")
	if err := r.awaitTrustRepublished(ctx); err != nil {
		return err
	}
	r.awaitRefused(ctx)
	// Recovery. TODO(epoch): a signed epoch statement will recover signed
	// devices after a rebuild in one step; when it lands, this is where
	// the round issues and publishes it instead of (or before) raising
	// the revision.
	return r.bumpRevision(ctx)
}

// agedRevision is etcd's revision before the agents start in the
// etcd-rebuilt round, as if it had run for a while: the wiped etcd's
// revisions then stay below the tokens in use for longer than the agents
// take to see it went back (they look every 10 s), and the devices
// refuse the regressed tokens until the round recovers.
const agedRevision = 3000

// agedEtcd raises a fresh etcd's revision to agedRevision in the
// etcd-rebuilt round (`edgefence etcd bump-revision --to`).
func (r *round) agedEtcd(ctx context.Context) error {
	if r.sc != FaultEtcdRebuilt {
		return nil
	}
	_, err := r.edgefenceAt(ctx, nodeA, "etcd", "bump-revision", "--etcd", r.etcdURL, "--to", fmt.Sprint(agedRevision))
	return err
}

// awaitTrustRepublished waits until etcd holds the trust statements again:
// the device certificates and each running gateway's certificate, which
// only the agents (their <state_dir>/trust.db) can have put back.
func (r *round) awaitTrustRepublished(ctx context.Context) error {
	if r.trust == nil {
		return nil
	}
	var want []string
	for _, d := range r.shimDevs {
		want = append(want, agent.TrustDeviceKey(agent.DefaultEtcdPrefix, d))
	}
	for _, a := range r.agents {
		want = append(want, agent.TrustCertKey(agent.DefaultEtcdPrefix, r.trust.key(a.name).KeyID))
	}
	cli, err := r.etcd.Client()
	if err != nil {
		return err
	}
	defer cli.Close()
	deadline := time.Now().Add(trustBound)
	for {
		var missing []string
		for _, k := range want {
			gctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			resp, err := cli.Get(gctx, k, clientv3.WithCountOnly())
			cancel()
			if err != nil || resp.Count == 0 {
				missing = append(missing, k)
			}
		}
		if len(missing) == 0 {
			r.logf("the agents put the trust statements back into etcd")
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("trust statements not back in etcd %v after the wipe: %s", trustBound, strings.Join(missing, ", "))
		}
		if !backoff.Sleep(ctx, 200*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// awaitRefused waits a while for the regression to show (a device
// `refused` at some agent), so that the recovery is of a regressed
// fleet; it goes on without one (a campaign's revisions may have passed
// the marks already).
func (r *round) awaitRefused(ctx context.Context) {
	deadline := time.Now().Add(4 * r.cfg.TTL)
	for time.Now().Before(deadline) {
		for _, a := range r.agents {
			st, err := r.status(ctx, a)
			if err != nil {
				continue
			}
			for _, d := range st.Devices {
				if d.State == agent.StateRefused {
					r.logf("%s: %s refused (%s)", a.name, d.ID, d.Reason)
					return
				}
			}
		}
		if !backoff.Sleep(ctx, 100*time.Millisecond) {
			return
		}
	}
	r.logf("no device refused yet")
}

// bumpRevision is the runbook's recovery: `edgefence status --json` of
// every gateway and `edgefence fence list --json` of the home gateway
// into files, then `edgefence etcd bump-revision --from` them all, which
// raises etcd's revision past the highest token any of them names.
func (r *round) bumpRevision(ctx context.Context) error {
	var from []string
	save := func(name string, args ...string) error {
		out, err := r.edgefenceAt(ctx, nodeA, args...)
		if err != nil {
			return err
		}
		path := r.path(name)
		from = append(from, "--from", path)
		return os.WriteFile(path, out, 0o644)
	}
	for _, a := range r.agents {
		if err := save("recovery-status-"+a.name+".json", "status", "--socket", a.sock, "--json"); err != nil {
			return err
		}
	}
	if len(r.serialDevs) > 0 {
		home := r.agents[1] // gw-b: the serial devices' home
		if err := save("recovery-fence-"+home.name+".json", "fence", "list", "--socket", home.sock, "--json"); err != nil {
			return err
		}
	}
	out, err := r.edgefenceAt(ctx, nodeA, append([]string{"etcd", "bump-revision", "--config", r.agents[0].cfgPath}, from...)...)
	if err != nil {
		return err
	}
	r.fault(FaultRecovered)
	r.logf("revision bumped: %s", strings.TrimSpace(lastLine(string(out))))
	return r.restartRefusing(ctx)
}

// restartRefusing restarts (SIGTERM, then start again) every agent that
// refused a device for a token regression, as bump-revision's last line
// tells the operator: a campaign it had waiting from before the bump
// would win with a token below it and be refused again, and a device
// could stay unheld for a minute and more (seen without it).
func (r *round) restartRefusing(ctx context.Context) error {
	for _, a := range r.agents {
		st, err := r.status(ctx, a)
		if err != nil || st.Counters.Regressions == 0 {
			continue
		}
		if p := a.current(); p != nil {
			if err := p.Stop(15 * time.Second); err != nil && !killedBefore(err) {
				return fmt.Errorf("%s shutdown: %w", a.name, err)
			}
		}
		if err := r.runAgent(ctx, a); err != nil {
			return err
		}
		r.logf("%s restarted (it had refused %d tokens)", a.name, st.Counters.Regressions)
	}
	return nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// gatewayRevoked is FaultRevoked: mid-load the operator revokes gw-a's key
// (not the serial devices' home: a revoked home could not answer for
// them) and publishes the list; gw-a must let every `auth: required`
// device go by itself (state untrusted), gw-b takes them and relays the
// list; a late command signed by gw-a's key must be refused at the
// device (T1), and the liveness check after the round sees gw-b command
// every device. The load stops sending to gw-a a moment before: a command
// of a strict device that gw-a queues as it lets the device go never ends
// (it waits for a lock a revoked gateway never campaigns for again, and
// nothing supersedes it) — a gap of the agent the round does not cover.
func (r *round) gatewayRevoked(ctx context.Context) error {
	victim, other := r.agents[0], r.agents[1]
	r.retired.Store(victim)
	backoff.Sleep(ctx, time.Second) // the load's commands in flight to gw-a get their verdicts
	k := r.trust.key(victim.name)
	if err := r.revoke(ctx, other, k.KeyID); err != nil {
		return err
	}
	r.fault(FaultRevoked)
	if err := r.awaitUntrusted(ctx, victim); err != nil {
		return err
	}
	return r.lateEnvelope(ctx, victim.name, k)
}

// awaitUntrusted waits (trustBound) until a says its certificate is not
// OK and holds no device: nobody stops it. One that still holds some is
// left to the liveness check.
func (r *round) awaitUntrusted(ctx context.Context, a *agentProc) error {
	deadline := time.Now().Add(trustBound)
	for {
		st, err := r.status(ctx, a)
		held := 0
		if err == nil {
			for _, d := range st.Devices {
				if d.State == agent.StateHolding || d.State == agent.StateAutonomous {
					held++
				}
			}
			if st.Trust != nil && !st.Trust.CertificateOK && held == 0 {
				r.logf("%s let every device go by itself: %s", a.name, st.Trust.CertificateProblem)
				return nil
			}
		}
		if time.Now().After(deadline) {
			// The liveness check (L1) fails the round on it.
			r.logf("%s still holds %d devices %v after its key was revoked (status error %v)", a.name, held, trustBound, err)
			return nil
		}
		if !backoff.Sleep(ctx, 200*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// keyRotated is FaultRotated: gw-a gets a new key and certificate (key id
// gw-a/2, serial 2) while the old one is valid, and is restarted with it
// (the README's "Rotate a gateway key with overlap"); then the operator
// revokes gw-a/1. Nothing the old key signs after that may be admitted:
// the round sends one such command (T1 checks the devices' verdicts).
func (r *round) keyRotated(ctx context.Context) error {
	a := r.agents[0]
	old, next, err := r.rotate(a.name)
	if err != nil {
		return err
	}
	if _, err := r.agentConfig(a.name); err != nil {
		return err
	}
	if p := a.current(); p != nil {
		if err := p.Stop(15 * time.Second); err != nil && !killedBefore(err) {
			return fmt.Errorf("%s shutdown: %w", a.name, err)
		}
	}
	r.fault(FaultRotated)
	if err := r.runAgent(ctx, a); err != nil {
		return err
	}
	r.logf("%s restarted with %s", a.name, next.KeyID)
	backoff.Sleep(ctx, r.jitter(500*time.Millisecond, 2*time.Second))
	if err := r.revoke(ctx, r.agents[1], old.KeyID); err != nil {
		return err
	}
	return r.lateEnvelope(ctx, a.name, old)
}
