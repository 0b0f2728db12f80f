package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	systemd "github.com/coreos/go-systemd/v22/daemon"
)

// The systemd notify protocol (sd_notify(3)) for the daemon under
// deploy/edgefence.service (Type=notify, WatchdogSec=). Without
// NOTIFY_SOCKET in the environment every message is a no-op.
//
//   - READY=1 (with a STATUS= line) once the local state is open (the
//     outbox and fence table are opened before the agent exists), lease
//     campaigning has begun (the first etcd session is open) and the broker
//     is connected — or readyBound has passed: the outbox accepts commands
//     offline, so an unreachable broker or etcd does not hold the start back
//     (nor fail it through TimeoutStartSec). The STATUS line then says what
//     was not up yet.
//   - STATUS= with devices held and link states, checked every second and
//     sent when it changes (and at least every statusRefresh) — only when
//     someone listens: without NOTIFY_SOCKET nothing reads it, and the
//     summary walks every device's lock, so it is not checked after READY.
//   - WATCHDOG=1 every half WATCHDOG_USEC, only while the agent's Run loop
//     is healthy (agent.Healthy): a stuck loop stops the pings and systemd
//     restarts the service (Restart=on-failure).
//   - STOPPING=1 at the start of a shutdown, before the agent releases its
//     locks.

const (
	readyBound    = 5 * time.Second
	statusEvery   = time.Second
	statusRefresh = 30 * time.Second
)

// sdNotify sends one notification; it is systemd.SdNotify unless
// Options.Notify replaces it.
type sdNotify func(state string) error

// notifyListens reports whether a notification can reach anyone: given
// Options.Notify, or with NOTIFY_SOCKET in the environment (systemd.SdNotify
// is a no-op without it).
func notifyListens(o Options) bool { return o.Notify != nil || os.Getenv("NOTIFY_SOCKET") != "" }

func systemdNotify(state string) error {
	_, err := systemd.SdNotify(false, state)
	return err
}

// startWaitNotice is the notification sent while the start waits for
// something it cannot do without (etcd, to authenticate): the reason, the
// start timeout extended past the next attempt, and a watchdog ping — the
// process is not stuck, it waits on purpose.
func startWaitNotice(why string, next time.Duration) string {
	extend := next + 10*time.Second
	return fmt.Sprintf("STATUS=starting: %s\nEXTEND_TIMEOUT_USEC=%d\nWATCHDOG=1", why, extend.Microseconds())
}

// notifier drives the notifications for one run of the agent. Create it
// with its fields set, start run in a goroutine, call stopping once the
// shutdown begins.
type notifier struct {
	send sdNotify
	log  *slog.Logger

	// Readiness: both closed, or readyBound passed.
	campaigning <-chan struct{}
	brokerUp    <-chan struct{}
	bound       time.Duration // readyBound if 0

	status   func() string // the STATUS= text
	healthy  func() error  // nil: healthy
	watchdog time.Duration // ping interval (half WATCHDOG_USEC); 0: no watchdog
	every    time.Duration // status check interval; statusEvery if 0
	// noStatus: nobody reads STATUS= (no NOTIFY_SOCKET); status is called
	// once, for READY, and not checked after it.
	noStatus bool

	stopped atomic.Bool
	once    sync.Once
}

// notify sends state, logging a failure (systemd would restart us for a
// missing READY or pings; there is nothing better to do with the error).
func (n *notifier) notify(state string) {
	if err := n.send(state); err != nil {
		n.log.Warn("systemd notify", "state", strings.SplitN(state, "\n", 2)[0], "err", err)
	}
}

// stopping sends STOPPING=1 once; no STATUS updates follow it.
func (n *notifier) stopping() {
	n.once.Do(func() {
		n.stopped.Store(true)
		n.notify("STOPPING=1\nSTATUS=stopping: releasing locks")
	})
}

// run sends READY, STATUS and WATCHDOG messages until ctx ends.
func (n *notifier) run(ctx context.Context) {
	bound, every := n.bound, n.every
	if bound == 0 {
		bound = readyBound
	}
	if every == 0 {
		every = statusEvery
	}
	var ping <-chan time.Time
	if n.watchdog > 0 {
		t := time.NewTicker(n.watchdog)
		defer t.Stop()
		ping = t.C
	}
	unhealthy := new(bool)
	check := time.NewTicker(every)
	defer check.Stop()
	checkC := check.C
	deadline := time.NewTimer(bound)
	defer deadline.Stop()
	campaigning, brokerUp := n.campaigning, n.brokerUp
	ready, expired := false, false
	var last string
	var lastAt time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-ping:
			n.pingIfHealthy(unhealthy)
			continue
		case <-campaigning:
			campaigning = nil
		case <-brokerUp:
			brokerUp = nil
		case <-deadline.C:
			expired = true
		case <-checkC:
		}
		if !ready {
			var missing []string
			if campaigning != nil {
				missing = append(missing, "etcd session not open yet")
			}
			if brokerUp != nil {
				missing = append(missing, "broker not connected yet")
			}
			if len(missing) > 0 && !expired {
				continue
			}
			ready = true
			last, lastAt = n.status(), time.Now()
			st := last
			if len(missing) > 0 {
				st += "; offline start (" + strings.Join(missing, ", ") + ")"
				n.log.Warn("ready without every link: the outbox accepts commands offline", "after", bound, "missing", missing)
			}
			n.notify("READY=1\nSTATUS=" + st)
			if n.noStatus {
				check.Stop()
				checkC = nil // the watchdog pings and ctx remain
			}
			continue
		}
		if n.stopped.Load() {
			continue
		}
		if s := n.status(); s != last || time.Since(lastAt) >= statusRefresh {
			last, lastAt = s, time.Now()
			n.notify("STATUS=" + s)
		}
	}
}

// pingIfHealthy sends WATCHDOG=1 if the agent is healthy, and logs when
// its health changes (*unhealthy tracks it).
func (n *notifier) pingIfHealthy(unhealthy *bool) {
	if err := n.healthy(); err != nil {
		if !*unhealthy {
			n.log.Error("agent unhealthy: withholding systemd watchdog pings", "err", err)
		}
		*unhealthy = true
		return
	}
	if *unhealthy {
		n.log.Info("agent healthy again: watchdog pings resume")
	}
	*unhealthy = false
	n.notify("WATCHDOG=1")
}

// watchdogInterval returns the ping interval systemd asks for (half of
// WATCHDOG_USEC), or 0 if the watchdog is off for this process.
func watchdogInterval(log *slog.Logger) time.Duration {
	d, err := systemd.SdWatchdogEnabled(false)
	if err != nil {
		log.Warn("systemd watchdog settings", "err", err)
		return 0
	}
	return d / 2
}
