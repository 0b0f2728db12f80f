package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/offline"
)

// TestKillAfterAcceptedReplyKeepsVerdict: the record never contradicts
// the reply (invariant I9). With outbox.verdict_delay an hour, `edgefence
// send` prints "accepted" only once that verdict is durable: the agent
// killed with SIGKILL right after it, the file holds the command accepted,
// and the restarted agent keeps it so. (Before, the reply came while the
// record waited for the outbox's next commit: the file held it pending,
// and the restarted agent resent it and recorded the device's "duplicate"
// — or "stale" had another gateway moved the mark meanwhile — for a
// command the caller was told was accepted.) A command nobody waits for
// (`--no-wait`) keeps riding on the next commit: killed before one, it is
// pending in the file, and the restarted agent resends it, the device
// answers duplicate (it applied it once) and it ends once, duplicate —
// nothing lost (I4), nothing applied twice (I1).
func TestKillAfterAcceptedReplyKeepsVerdict(t *testing.T) {
	e := newEnv(t, "dev-1")
	cfg, sock := e.config("gw-1", 30*time.Second)
	f, err := os.OpenFile(cfg, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	// An hour: only another commit, a waiter's, or a clean shutdown
	// records a verdict.
	if _, err := f.WriteString("outbox:\n  verdict_delay: 1h\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	state := filepath.Join(e.dir, "gw-1-state", offline.File)
	inFile := func(id string) offline.Record {
		t.Helper()
		ob, err := offline.Open(state, &offline.Options{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		defer ob.Close()
		rec, err := ob.Get(id)
		if err != nil {
			t.Fatal(err)
		}
		return rec
	}
	a := e.startAgent("gw-1", cfg)
	e.waitHolding(a, sock)
	r := edgefence(t, "send", "--json", "--socket", sock, "dev-1", "set", `{"setpoint":1}`)
	told := sendResult(t, r)
	if r.code != 0 || told.Verdict != "accepted" {
		t.Fatalf("send: %+v\n%s", told, r)
	}
	if err := a.Kill(); err != nil {
		t.Fatal(err)
	}
	if rec := inFile(told.ID); rec.State != fence.Accepted {
		t.Fatalf("in the file after the kill: %+v; the caller was told accepted", rec)
	}

	a = e.startAgent("gw-1-restarted", cfg)
	e.waitHolding(a, sock)
	r = edgefence(t, "send", "--json", "--no-wait", "--socket", sock, "dev-1", "set", `{"setpoint":2}`)
	queued := sendResult(t, r)
	if r.code != 4 || queued.ID == "" {
		t.Fatalf("send --no-wait: %+v\n%s", queued, r)
	}
	waitEnded(t, sock, 2) // in the agent's views; its record rides
	if err := a.Kill(); err != nil {
		t.Fatal(err)
	}
	if rec := inFile(queued.ID); !rec.Pending() {
		t.Fatalf("the --no-wait command in the file after the kill: %+v, want pending (its record was riding)", rec)
	}

	a = e.startAgent("gw-1-restarted-again", cfg)
	e.waitHolding(a, sock)
	for _, got := range waitEnded(t, sock, 2).Records {
		if want := map[string]fence.Verdict{told.ID: fence.Accepted, queued.ID: fence.Duplicate}[got.ID]; got.State != want {
			t.Fatalf("after the restarts: %+v, want %v", got, want)
		}
	}
	if m, err := e.fleet.Mark("dev-1"); err != nil || m.Seq != 2 {
		t.Fatalf("device mark %+v %v, want seq 2 (each applied once)", m, err)
	}
	final, r := status(t, sock)
	if final == nil || final.Counters.Duplicate != 1 || final.Counters.Accepted != 0 {
		t.Fatalf("counters after the restart: %+v\n%s", final, r)
	}
}

// waitEnded waits until the agent's outbox lists n commands, none pending.
func waitEnded(t *testing.T, sock string, n int) agent.OutboxList {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; {
		l := outboxList(t, sock)
		if len(l.Records) == n && l.Summary.Pending == 0 {
			return l
		}
		if time.Now().After(deadline) {
			t.Fatalf("want %d commands ended: %+v", n, l)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// outboxList is `edgefence outbox list --json --state all`.
func outboxList(t *testing.T, sock string) agent.OutboxList {
	t.Helper()
	r := edgefence(t, "outbox", "list", "--json", "--state", "all", "--socket", sock)
	var l agent.OutboxList
	if err := json.Unmarshal([]byte(r.stdout), &l); r.code != 0 || err != nil {
		t.Fatalf("outbox list: %v\n%s", err, r)
	}
	return l
}
