package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/edgefence/edgefence/agent/jobs"
	"github.com/edgefence/edgefence/fence/history"
	"github.com/edgefence/edgefence/internal/backoff"
)

// devicePIDFile is the file where edgefence-devsim --firmware keeps the
// pid of a device's current process, in the device's directory.
const devicePIDFile = "pid"

// Fault kinds of the firmware round, as firmwareFaults draws them.
const (
	fwFreeze = iota
	fwKillHolder
	fwKillDevice
	fwKinds
)

// fwTargets are the moments firmwareFaults aims a fault at: just after a
// device accepted a step of that kind (from the devices' history file),
// that is while it downloads, installs, or reboots into its trial and
// checks its health.
var fwTargets = []string{"fw.begin", "fw.chunk", "fw.install", "fw.activate"}

// fwTargetWait bounds the wait for a device to reach a fault's target
// moment; then the fault goes in anyway. fwRebootWait bounds it for a
// freeze aimed at a device's reboot: the download may come before it.
const (
	fwTargetWait = 4 * time.Second
	fwRebootWait = 60 * time.Second
)

// firmwareFaults injects fwFaultsMin to fwFaultsMax faults drawn from the
// seed, one at a time and each healed before the next: the device's
// holder SIGSTOPped past its lease, the holder SIGKILLed (and restarted),
// the device's process SIGKILLed (a power loss; the supervisor starts it
// again). The first three are the three kinds in a random order, the
// others random. Each aims at a moment drawn from fwTargets, at the first
// device that reaches it; in half the rounds (seeded) the first freeze
// aims at the next fw.activate a device accepts and lands at once: the
// holder frozen while the device reboots into its trial, before its
// fw.commit. Past fwFaultsMin it stops once every execution ended.
func (r *round) firmwareFaults(ctx context.Context) error {
	n := fwFaultsMin + int(r.jitter(0, time.Duration(fwFaultsMax-fwFaultsMin+1)))
	kinds := []int{fwFreeze, fwKillHolder, fwKillDevice}
	r.faultMu.Lock()
	r.rnd.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
	rebootFreeze := r.rnd.IntN(2) == 0
	r.faultMu.Unlock()
	for i := range n {
		execs, err := r.executions(ctx)
		if i >= fwFaultsMin && err == nil && r.ended(execs) {
			r.logf("every execution ended after %d faults", i)
			return nil
		}
		kind := int(r.jitter(0, fwKinds))
		if i < len(kinds) {
			kind = kinds[i]
		}
		targets := r.reachable()
		target := targets[int(r.jitter(0, time.Duration(len(targets))))]
		wait, delay := fwTargetWait, r.jitter(0, 300*time.Millisecond)
		if kind == fwFreeze && rebootFreeze && slices.Contains(targets, "fw.activate") {
			target, wait, delay, rebootFreeze = "fw.activate", fwRebootWait, 0, false
			r.logf("fault %d of %d: the holder frozen in a device's reboot", i+1, n)
		}
		dev, err := r.awaitStep(ctx, target, wait, delay)
		if err != nil {
			return err
		}
		r.logf("fault %d of %d at %s after its %s; executions: %s", i+1, n, dev, target, steps(execs))
		if err := r.firmwareFault(ctx, kind, dev); err != nil {
			return err
		}
	}
	return nil
}

// firmwareFault injects one fault of kind aimed at dev, and heals it.
func (r *round) firmwareFault(ctx context.Context, kind int, dev string) error {
	ttl := r.cfg.TTL
	switch kind {
	case fwFreeze, fwKillHolder:
		victim := r.busiestHolder(ctx)
		if hs := r.holders(ctx)[dev]; len(hs) > 0 {
			victim = hs[0]
		}
		if kind == fwFreeze {
			return r.freeze(ctx, victim, r.outage(ttl+500*time.Millisecond, 2*ttl+time.Second))
		}
		return r.killAgent(ctx, victim)
	}
	return r.killDevice(ctx, dev)
}

// reachable returns the kinds of fwTargets some device has not accepted
// yet (by the devices' history file; fw.chunk until every device accepted
// fw.install); fw.commit when every device accepted them all.
func (r *round) reachable() []string {
	evs, _ := history.Read(r.path(fwHistory)) // none yet: every target
	done := map[string]map[string]bool{}
	for _, e := range evs {
		if e.Op == history.OpVerdict && e.Verdict == "accepted" {
			if done[e.Kind] == nil {
				done[e.Kind] = map[string]bool{}
			}
			done[e.Kind][e.Device] = true
		}
	}
	var out []string
	for _, k := range fwTargets {
		n := len(r.shimDevs)
		if len(done[k]) < n || k == "fw.chunk" && len(done["fw.install"]) < n { // chunks go on until the install
			out = append(out, k)
		}
	}
	if len(out) == 0 {
		return []string{"fw.commit"}
	}
	return out
}

// awaitStep waits until a device accepts a firmware step of kind (as the
// devices' history file shows; at most wait), then a further delay, and
// returns that device (a random one when none did).
func (r *round) awaitStep(ctx context.Context, kind string, wait, delay time.Duration) (string, error) {
	path := r.path(fwHistory)
	seen := 0
	if evs, err := history.Read(path); err == nil {
		seen = len(evs)
	}
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		if !backoff.Sleep(ctx, 20*time.Millisecond) {
			return "", ctx.Err()
		}
		evs, err := history.Read(path)
		if err != nil || len(evs) <= seen {
			continue // a line being written; or nothing new
		}
		for _, e := range evs[seen:] {
			if e.Op == history.OpVerdict && e.Kind == kind && e.Verdict == "accepted" {
				backoff.Sleep(ctx, delay)
				return e.Device, ctx.Err()
			}
		}
		seen = len(evs)
	}
	return r.shimDevs[int(r.jitter(0, time.Duration(len(r.shimDevs))))], nil
}

// steps describes executions for the round's log: device=status/step.
func steps(execs []jobs.Execution) string {
	var b strings.Builder
	for _, e := range execs {
		fmt.Fprintf(&b, " %s=%s/%s", e.Device, e.Status, e.Step)
	}
	return strings.TrimSpace(b.String())
}

// devicePID reads the pid of dev's current process.
func (r *round) devicePID(dev string) (int, error) {
	b, err := os.ReadFile(r.path("devices/" + dev + "/" + devicePIDFile))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// killDevice SIGKILLs dev's process (a power loss) and waits until the
// supervisor has started another one. A process that is gone already (it
// was rebooting) is looked up again.
func (r *round) killDevice(ctx context.Context, dev string) error {
	deadline := time.Now().Add(30 * time.Second)
	var pid int
	for {
		var err error
		if pid, err = r.devicePID(dev); err == nil {
			if err = syscall.Kill(pid, syscall.SIGKILL); err == nil {
				break
			}
		}
		if !errors.Is(err, syscall.ESRCH) || time.Now().After(deadline) {
			return fmt.Errorf("kill -9 of device %s: %w", dev, err)
		}
		if !backoff.Sleep(ctx, 50*time.Millisecond) {
			return ctx.Err()
		}
	}
	r.fault(FaultKillDevice)
	r.logf("device %s (pid %d) killed (SIGKILL): power loss", dev, pid)
	for {
		if p, err := r.devicePID(dev); err == nil && p != pid {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("device %s not restarted after its kill -9", dev)
		}
		if !backoff.Sleep(ctx, 50*time.Millisecond) {
			return ctx.Err()
		}
	}
}
