package agent

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/edgefence/edgefence/internal/backoff"
)

// What a service manager (systemd, via cmd/edgefence) asks of the agent:
// when it is ready, whether it is alive, and a one-line summary.

// heartbeatEvery is how often the Run loop beats while a session lasts.
const heartbeatEvery = time.Second

// beat is the Run loop's heartbeat. It takes the leases' lock and every
// device's lock in turn, so a goroutine stuck holding one of them (a wedged
// controller, campaign or status reader) stops the heartbeat as surely as a
// wedged Run loop does. Only the Run loop calls it.
func (l *leases) beat() {
	l.mu.Lock()
	//lint:ignore SA2001 the probe is that the lock can be taken
	l.mu.Unlock()
	for _, id := range l.order {
		d := l.devices[id]
		d.mu.Lock()
		//lint:ignore SA2001 as above
		d.mu.Unlock()
	}
	l.beatAt.Store(l.now().UnixNano())
}

// sleepBeating is backoff.Sleep for the Run loop: it beats at least every
// heartbeatEvery while it waits.
func (l *leases) sleepBeating(ctx context.Context, d time.Duration) bool {
	for d > 0 {
		step := min(d, heartbeatEvery)
		if !backoff.Sleep(ctx, step) {
			return false
		}
		d -= step
		l.beat()
	}
	return true
}

// Healthy reports whether the agent's Run loop is alive: it returns an
// error if the loop has not beaten within maxAge (or has not started).
//
// What it covers: the Run loop goroutine — the one that opens etcd
// sessions, starts the campaigns, notices a lost session and drops its
// controllers — is scheduled, and neither it nor any other goroutine is
// stuck holding the agent's lock or a device's lock. The loop beats every
// second while a session lasts and between retries while etcd is down; one
// blocking step (opening a session) takes at most etcd.dial_timeout, so a
// maxAge above dial_timeout + 1 s never fails a live loop. What it does not
// cover: a command stuck in a transport Send (bounded by its own ack
// timeout) or a hung outbox disk write. A broken link to etcd or the broker
// is not unhealthy: the agent keeps running offline, and restarting it
// would not bring the link back.
func (a *Agent) Healthy(maxAge time.Duration) error { return a.leases.healthy(maxAge) }

// healthy is Agent.Healthy: the session loop beats (beat).
func (l *leases) healthy(maxAge time.Duration) error {
	at := l.beatAt.Load()
	if at == 0 {
		return fmt.Errorf("agent: run loop has not started")
	}
	if age := l.now().Sub(time.Unix(0, at)); age > maxAge {
		return fmt.Errorf("agent: run loop last beat %v ago (max %v)", age.Round(time.Millisecond), maxAge)
	}
	return nil
}

// Campaigning is closed once the agent has opened its first etcd session
// and started campaigning for its devices under it.
func (a *Agent) Campaigning() <-chan struct{} { return a.leases.campaigning }

// connected is implemented by senders that know their link state (the MQTT
// transport).
type connected interface {
	Connected() bool
}

// Summary is a one-line, human-readable status for a service manager
// (systemd's STATUS=): devices held, then link states. For example
// "holding 3/3 devices; mqtt connected; etcd session up".
func (a *Agent) Summary() string {
	held := 0
	for _, id := range a.order {
		d := a.devices[id]
		d.mu.Lock()
		if d.ctl != nil && d.state == StateHolding {
			held++
		}
		d.mu.Unlock()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "holding %d/%d devices", held, len(a.order))
	if c, ok := a.sender.(connected); ok {
		if c.Connected() {
			b.WriteString("; mqtt connected")
		} else {
			b.WriteString("; mqtt disconnected")
		}
	}
	if up, _, _ := a.leases.session(); up {
		b.WriteString("; etcd session up")
	} else {
		b.WriteString("; etcd session down")
	}
	return b.String()
}
