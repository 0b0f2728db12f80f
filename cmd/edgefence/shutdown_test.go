package main

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgefence/edgefence/agent"
)

// SIGTERM is a clean shutdown: the agent unlocks its devices and revokes
// its lease before it exits 0, so a waiting agent takes over at once rather
// than after the lease TTL. The test proves the release without timing it:
// A's lock keys are gone and its lease is revoked the moment A has exited,
// although A renewed that 10 s lease until the signal.
func TestSIGTERMReleasesLocks(t *testing.T) {
	e := newEnv(t, "dev-1", "dev-2", "dev-3")
	cfgA, sockA := e.config("gw-a", 10*time.Second)
	cfgB, sockB := e.config("gw-b", 10*time.Second)

	a := e.startAgent("gw-a", cfgA)
	stA := e.waitHolding(a, sockA)
	leaseA := parseLease(t, stA.Etcd.Lease)

	// B campaigns for the same devices: its lock keys wait behind A's.
	b := e.startAgent("gw-b", cfgB)
	deadline := time.Now().Add(30 * time.Second)
	for waiting := 0; waiting < len(e.devices); {
		waiting = 0
		for _, d := range e.devices {
			for _, l := range e.lockKeys(d) {
				if l != leaseA {
					waiting++
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("gw-b is not campaigning for every device")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if st, r := status(t, sockB); st == nil {
		t.Fatalf("gw-b status\n%s", r)
	} else {
		for _, d := range st.Devices {
			if d.State != agent.StateCampaigning || d.Token != 0 {
				t.Fatalf("gw-b %s: %+v, want campaigning while gw-a holds", d.ID, d)
			}
		}
	}

	r := edgefence(t, "send", "--socket", sockB, "dev-1", "set", `{"setpoint":25}`)
	if r.code != 1 || !strings.Contains(r.stderr, "not the lease holder") {
		t.Fatalf("send via the waiting gw-b: want exit 1, not the lease holder\n%s", r)
	}

	if err := a.Stop(30 * time.Second); err != nil { // SIGTERM
		t.Fatalf("gw-a after SIGTERM: %v, want exit 0", err)
	}
	for i, d := range e.devices {
		keys := e.lockKeys(d)
		if _, ok := keys[stA.Devices[i].LockKey]; ok {
			t.Errorf("%s: gw-a's lock key %s is still in etcd after gw-a exited", d, stA.Devices[i].LockKey)
		}
		for k, l := range keys {
			if l == leaseA {
				t.Errorf("%s: key %s under gw-a's lease is still in etcd", d, k)
			}
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if ttl, err := e.etcd.TimeToLive(ctx, leaseA); err != nil || ttl.TTL != -1 {
		t.Errorf("gw-a's lease %x after exit: %+v, %v; want revoked (TTL -1)", int64(leaseA), ttl, err)
	}
	if err := a.WaitLine(ctx, `"released locks"`); err != nil {
		t.Error(err)
	}

	// B takes over, with tokens above A's, and commands.
	stB := e.waitHolding(b, sockB)
	for i, d := range stB.Devices {
		if d.Token <= stA.Devices[i].Token {
			t.Errorf("%s: gw-b token %d not above gw-a's %d", d.ID, d.Token, stA.Devices[i].Token)
		}
	}
	r = edgefence(t, "send", "--json", "--socket", sockB, "dev-1", "set", `{"setpoint":25}`)
	if res := sendResult(t, r); r.code != 0 || res.Verdict != "accepted" || res.Token != uint64(stB.Devices[0].Token) {
		t.Fatalf("gw-b send: %+v\n%s", res, r)
	}
}

func parseLease(t *testing.T, hex string) clientv3.LeaseID {
	t.Helper()
	id, err := strconv.ParseInt(hex, 16, 64)
	if err != nil || id == 0 {
		t.Fatalf("lease %q: %v", hex, err)
	}
	return clientv3.LeaseID(id)
}
