package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence"
)

// TestKillRestartKeepsQueue is the power cut: commands are queued for
// devices that are away (`send --no-wait`), the agent is killed with
// SIGKILL and started again within its lease TTL, and the devices come
// back. The restarted agent re-attaches to its previous run's lease instead
// of waiting behind its own lock keys, so it holds the devices under the
// same tokens at once and every queued command is accepted exactly once —
// none is ended "superseded" by a session that was its own.
func TestKillRestartKeepsQueue(t *testing.T) {
	for _, kind := range etcdKinds { // Debian's etcd 3.4 and the embedded one
		t.Run(kind.name, func(t *testing.T) { testKillRestartKeepsQueue(t, kind.start) })
	}
}

func testKillRestartKeepsQueue(t *testing.T, startEtcd func(*testing.T, *env) agentEtcd) {
	devs := []string{"dev-1", "dev-2"}
	e := newEnv(t, devs...)
	e.etcdURL = startEtcd(t, e).url
	cfg, sock := e.config("gw-1", 30*time.Second)
	a := e.startAgent("gw-1", cfg)
	st := e.waitHolding(a, sock)

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := e.fleet.Close(ctx); err != nil { // the devices go away
		t.Fatal(err)
	}
	const perDevice = 5
	var ids []string
	for _, d := range devs {
		for i := range perDevice {
			r := edgefence(t, "send", "--json", "--no-wait", "--socket", sock, d, "set", `{"setpoint":`+string(rune('0'+i))+`}`)
			res := sendResult(t, r)
			if !res.Queued || res.ID == "" {
				t.Fatalf("send --no-wait: %+v\n%s", res, r)
			}
			ids = append(ids, res.ID)
		}
	}
	if err := a.Kill(); err != nil { // no revoke, no unlock: the lease lives on
		t.Fatal(err)
	}
	restarted := time.Now()
	a2 := e.startAgent("gw-1-restarted", cfg)
	st2 := e.waitHolding(a2, sock)
	t.Logf("restart → every device held again: %v (lease TTL 30 s)", time.Since(restarted).Round(time.Millisecond))
	for i, d := range st2.Devices {
		if d.Token != st.Devices[i].Token {
			t.Errorf("%s: token %d after the restart, want the same %d (the re-attached lease's key)", d.ID, d.Token, st.Devices[i].Token)
		}
	}
	fleet, err := sim.NewFleet(ctx, sim.FleetConfig{Devices: devs, DataDir: filepath.Join(e.dir, "devices"),
		Broker: e.world.Broker.URL(), ClientID: "devsim-" + t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = fleet.Close(cctx)
	})
	for deadline := time.Now().Add(60 * time.Second); ; {
		r := edgefence(t, "outbox", "list", "--json", "--state", "all", "--socket", sock)
		var l agent.OutboxList
		if err := json.Unmarshal([]byte(r.stdout), &l); r.code != 0 || err != nil {
			t.Fatalf("outbox list: %v\n%s", err, r)
		}
		// The records and the summary are two reads: judge by the records.
		ended := len(l.Records) == len(ids)
		for _, rec := range l.Records {
			ended = ended && !rec.Pending()
		}
		if ended {
			for _, rec := range l.Records {
				if rec.State != fence.Accepted {
					t.Errorf("%s %s token %d seq %d ended %v: %s", rec.Device, rec.ID, rec.Token, rec.Seq, rec.State, rec.Reason())
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue not delivered:\n%s", r.stdout)
		}
		time.Sleep(100 * time.Millisecond)
	}
	final, r := status(t, sock)
	if final == nil {
		t.Fatalf("status\n%s", r)
	}
	if c := final.Counters; c.Superseded != 0 || c.Reattached != 1 || c.Stale != 0 || c.Accepted != uint64(len(ids)) {
		t.Fatalf("counters %+v", c)
	}
	for _, d := range devs {
		m, err := fleet.Mark(d)
		if err != nil || m.Seq != perDevice {
			t.Fatalf("%s: device mark %+v %v, want seq %d", d, m, err, perDevice)
		}
	}
	// A new command carries on above the previous run's seqs.
	r = edgefence(t, "send", "--json", "--socket", sock, "dev-1", "set", `{"setpoint":30}`)
	if res := sendResult(t, r); r.code != 0 || res.Verdict != "accepted" || res.Seq != perDevice+1 {
		t.Fatalf("send after the restart: %+v\n%s", res, r)
	}
}

// TestWaitingAgentNamesHolder: a standby's `status` and `devices` say who
// holds the device it waits for — the gateway id the holder wrote on its
// lock key, with the key's token — instead of a bare "campaigning".
func TestWaitingAgentNamesHolder(t *testing.T) {
	e := newEnv(t, "dev-1")
	cfg1, sock1 := e.config("gw-1", 10*time.Second)
	st1 := e.waitHolding(e.startAgent("gw-1", cfg1), sock1)
	cfg2, sock2 := e.config("gw-2", 10*time.Second)
	e.startAgent("gw-2", cfg2)
	want := fmt.Sprintf("lock held by gateway gw-1, token %d", st1.Devices[0].Token)
	for deadline := time.Now().Add(30 * time.Second); ; {
		st, r := status(t, sock2)
		if st != nil && st.Devices[0].Holder != nil {
			if h := st.Devices[0].Holder; h.Gateway != "gw-1" || h.Token != st1.Devices[0].Token || st.Devices[0].State != agent.StateCampaigning {
				t.Fatalf("gw-2's view of dev-1: %+v holder %+v", st.Devices[0], h)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("gw-2 does not name the holder\n%s", r)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, cmd := range []string{"status", "devices"} {
		if r := edgefence(t, cmd, "--socket", sock2); r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Errorf("%s of the waiting agent lacks %q\n%s", cmd, want, r)
		}
	}
}
