package chaos

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/fence/history"
	"github.com/edgefence/edgefence/internal/backoff"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// maxReplays bounds the captured commands replayed per reset device.
const maxReplays = 40

// resetMidRun is FaultReset: a broker client (the operator's read-only
// login) captures the signed commands on the devices' command topics for
// a moment; then the operator resets one or two shim devices, and in half
// the rounds the first serial device behind gw-b's table, with `edgefence
// fence reset DEV --config <gw-a's config> --yes`: their marks lowered
// below every token captured, each into an epoch of its own. The captured
// commands of those devices are replayed from a gateway's broker login
// and must be refused (T2 checks the fence points' verdicts; I1 too). The
// shim devices are reset and their commands replayed while both agents
// are frozen (SIGSTOP), so that no command of the new epoch moves their
// marks past the replays first: only the epoch can refuse them. Then
// every agent must take the new epochs (from etcd's
// <prefix>/trust/resets/, or the devices' "epoch closed" answers) and the
// devices be held and commanded again (L1).
func (r *round) resetMidRun(ctx context.Context) error {
	cap, err := r.startCapture(ctx)
	if err != nil {
		return err
	}
	backoff.Sleep(ctx, r.jitter(500*time.Millisecond, 1500*time.Millisecond))
	captured := cap.stop()
	shim, serial := r.resetVictims()
	epochs := map[string]uint64{}
	for _, dev := range serial { // its fence point is gw-b's table: not frozen
		if epochs[dev], err = r.resetDevice(ctx, dev, captured[dev]); err != nil {
			return err
		}
	}
	if err := r.frozen(ctx, func() error {
		for _, dev := range shim {
			if epochs[dev], err = r.resetDevice(ctx, dev, captured[dev]); err != nil {
				return err
			}
			if err := r.replay(ctx, dev, captured[dev]); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return err
	}
	for _, dev := range append(shim, serial...) {
		if err := r.awaitEpoch(ctx, dev, epochs[dev]); err != nil {
			return err
		}
	}
	for _, dev := range serial {
		if err := r.replay(ctx, dev, captured[dev]); err != nil {
			return err
		}
	}
	return nil
}

// frozen runs f with every agent frozen (SIGSTOP), and resumes them.
func (r *round) frozen(ctx context.Context, f func() error) error {
	var stopped []*agentProc
	defer func() {
		for _, a := range stopped {
			if err := a.current().Resume(); err != nil {
				r.logf("%s not resumed: %v", a.name, err)
			}
		}
	}()
	for _, a := range r.agents {
		if err := a.current().Freeze(); err != nil {
			return err
		}
		stopped = append(stopped, a)
		r.fault(FaultFreeze)
	}
	start := time.Now()
	err := f()
	r.logf("agents frozen (SIGSTOP) for %v while the operator reset and a client replayed", time.Since(start).Round(time.Millisecond))
	return err
}

// resetVictims draws the devices to reset: one or two shim devices, and
// in half the rounds the first serial device.
func (r *round) resetVictims() (shim, serial []string) {
	r.faultMu.Lock()
	defer r.faultMu.Unlock()
	devs := slices.Clone(r.shimDevs)
	r.rnd.Shuffle(len(devs), func(i, j int) { devs[i], devs[j] = devs[j], devs[i] })
	shim = devs[:1+r.rnd.IntN(min(2, len(devs)))]
	if len(r.serialDevs) > 0 && r.rnd.IntN(2) == 0 {
		serial = []string{r.serialDevs[0]}
	}
	return shim, serial
}

var resetEpochRe = regexp.MustCompile(`in epoch (\d+) \(reset `)

// resetDevice resets dev as the operator does, signed with the round's
// root: its new mark a token below every command captured for it (so that
// only the epoch can refuse their replays), the epoch the command's
// default. It returns the reset's epoch, as the device answered.
func (r *round) resetDevice(ctx context.Context, dev string, captured [][]byte) (uint64, error) {
	low := uint64(0) // the lowest token captured (0: none)
	for _, raw := range captured {
		if env, err := auth.Peek(raw); err == nil && (low == 0 || uint64(env.Token) < low) {
			low = uint64(env.Token)
		}
	}
	to := uint64(1) // in [1, low-1]
	if low > 2 {
		to += uint64(r.jitter(0, time.Duration(low-1)))
	}
	a := r.agents[0]
	out, err := r.edgefenceEnv(ctx, a.node, a.env, "fence", "reset", dev, "--to", fmt.Sprint(to), "--root-key", r.trust.kit.RootKey(),
		"--root-kid", r.trust.kit.RootKID, "--config", a.cfgPath, "--yes")
	if err != nil {
		return 0, err
	}
	m := resetEpochRe.FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("fence reset %s: no epoch in its answer: %s", dev, out)
	}
	r.fault(FaultReset)
	e, _ := strconv.ParseUint(string(m[1]), 10, 64)
	r.logf("operator reset %s to %d/max in epoch %d (%d of its commands captured before)", dev, to, e, len(captured))
	return e, nil
}

// awaitEpoch waits (trustBound) until every agent stamps dev's commands
// with epoch e at least (from etcd's <prefix>/trust/resets/, or the
// device's answer) and one of them holds dev.
func (r *round) awaitEpoch(ctx context.Context, dev string, e uint64) error {
	deadline := time.Now().Add(trustBound)
	for {
		behind, held := []string{}, false
		for _, a := range r.agents {
			st, err := r.status(ctx, a)
			if err != nil {
				behind = append(behind, a.name+" (no status)")
				continue
			}
			for _, d := range st.Devices {
				if d.ID != dev {
					continue
				}
				if d.Epoch < e {
					behind = append(behind, fmt.Sprintf("%s (epoch %d)", a.name, d.Epoch))
				}
				held = held || d.State == agent.StateHolding
			}
		}
		if len(behind) == 0 && held {
			r.logf("every agent took %s's epoch %d; it is held", dev, e)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s's reset epoch %d not taken %v after the reset: %s, held %v", dev, e, trustBound, strings.Join(behind, ", "), held)
		}
		if !backoff.Sleep(ctx, 100*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// replay publishes up to maxReplays of the commands captured for dev
// before its reset again, from gw-a's broker login, and waits (bounded)
// for dev's fence point to decide each; it logs the verdicts.
func (r *round) replay(ctx context.Context, dev string, captured [][]byte) error {
	if len(captured) > maxReplays {
		captured = captured[len(captured)-maxReplays:]
	}
	ids := map[string]int{} // command id → its verdicts recorded before the replay
	for _, raw := range captured {
		if env, err := auth.Peek(raw); err == nil {
			ids[env.ID] = 0
		}
	}
	for _, e := range r.verdicts(dev, ids) {
		ids[e.ID]++
	}
	cl, err := r.brokerClient(ctx, "gw-a", "replay-gw-a")
	if err != nil {
		return err
	}
	defer cl.Close(context.Background())
	for _, raw := range captured {
		if err := cl.Publish(ctx, mqtt.Message{Topic: mqtt.Topics{}.Cmd(dev), Payload: raw}); err != nil {
			return err
		}
		r.fault(FaultReplayed)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		seen, got := map[string]int{}, map[string]int{}
		for _, e := range r.verdicts(dev, ids) {
			if seen[e.ID]++; seen[e.ID] > ids[e.ID] {
				got[e.Verdict]++
			}
		}
		n := 0
		for _, c := range got {
			n += c
		}
		if n >= len(captured) || time.Now().After(deadline) || !backoff.Sleep(ctx, 100*time.Millisecond) {
			r.logf("%d commands captured before %s's reset replayed: verdicts %v", len(captured), dev, got)
			return nil
		}
	}
}

// verdicts returns the fence points' verdicts on dev's commands whose ids
// are in ids, in history order.
func (r *round) verdicts(dev string, ids map[string]int) []history.Event {
	var out []history.Event
	for _, f := range []string{"hist-devsim.jsonl", "hist-bridge-gw-b.jsonl"} {
		evs, _ := history.Read(r.path(f))
		for _, e := range evs {
			if _, ok := ids[e.ID]; ok && e.Op == history.OpVerdict && e.Device == dev {
				out = append(out, e)
			}
		}
	}
	return out
}

// capture is a broker client recording the signed commands published on
// the devices' command topics, per device, until stopped.
type capture struct {
	cl   *mqtt.Client
	mu   sync.Mutex
	cmds map[string][][]byte // nil once stopped
}

// startCapture subscribes the operator's read-only login to every
// device's command topic.
func (r *round) startCapture(ctx context.Context) (*capture, error) {
	c := &capture{cmds: map[string][][]byte{}}
	cl, err := r.brokerClient(ctx, "operator", "capture-operator", mqtt.Subscription{Filter: mqtt.Topics{}.Cmd("+"), Handler: c.take})
	if err != nil {
		return nil, err
	}
	c.cl = cl
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := cl.AwaitSubscribed(sctx); err != nil {
		cl.Close(context.Background())
		return nil, fmt.Errorf("capture: %w", err)
	}
	return c, nil
}

// take keeps m if it is a signed command (not a trust update or a reset).
func (c *capture) take(m mqtt.Message) {
	if auth.IsUpdate(m.Payload) || auth.IsReset(m.Payload) {
		return
	}
	env, err := auth.Peek(m.Payload)
	if err != nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmds != nil {
		c.cmds[env.Device] = append(c.cmds[env.Device], slices.Clone(m.Payload))
	}
}

// stop ends the capture and returns what it kept, per device.
func (c *capture) stop() map[string][][]byte {
	c.cl.Close(context.Background())
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.cmds
	c.cmds = nil
	return out
}

// brokerClient connects to the round's broker as user (one of its
// logins), with a fresh session.
func (r *round) brokerClient(ctx context.Context, user, clientID string, subs ...mqtt.Subscription) (*mqtt.Client, error) {
	pass, err := r.auth.User(user)
	if err != nil {
		return nil, err
	}
	cl, err := mqtt.Dial(ctx, mqtt.Config{Brokers: []string{r.mqttURL}, ClientID: clientID, CleanStart: true,
		Username: user, Password: []byte(pass), Subscriptions: subs})
	if err != nil {
		return nil, err
	}
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := cl.AwaitConnection(actx); err != nil {
		cl.Close(context.Background())
		return nil, fmt.Errorf("%s at the broker: %w", user, err)
	}
	return cl, nil
}
