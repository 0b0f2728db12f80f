package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/edgefence/edgefence/internal/backoff"
)

// devicePIDFile is the file where edgefence-devsim --firmware keeps the
// pid of a device's current process, in the device's directory.
const devicePIDFile = "pid"

// firmwareFaults injects fwFaultsMin to fwFaultsMax faults drawn from the
// seed, one at a time and each healed before the next, a random moment
// apart: the holder SIGSTOPped past its lease, the holder SIGKILLed (and
// restarted), a device process SIGKILLed (a power loss; the supervisor
// starts it again). Past fwFaultsMin it stops once every execution ended.
func (r *round) firmwareFaults(ctx context.Context) error {
	ttl := r.cfg.TTL
	n := fwFaultsMin + int(r.jitter(0, time.Duration(fwFaultsMax-fwFaultsMin+1)))
	for i := range n {
		if !backoff.Sleep(ctx, r.jitter(100*time.Millisecond, 1200*time.Millisecond)) {
			return ctx.Err()
		}
		if i >= fwFaultsMin {
			if execs, err := r.executions(ctx); err == nil && r.ended(execs) {
				r.logf("every execution ended after %d faults", i)
				return nil
			}
		}
		var err error
		switch int(r.jitter(0, 3)) {
		case 0:
			err = r.freezeHolder(ctx, r.outage(ttl+500*time.Millisecond, 2*ttl+time.Second))
		case 1:
			err = r.killAgent(ctx, r.busiestHolder(ctx))
		default:
			err = r.killDevice(ctx, r.shimDevs[int(r.jitter(0, time.Duration(len(r.shimDevs))))])
		}
		if err != nil {
			return err
		}
	}
	return nil
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
