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

// TestKillAfterAcceptedBeforeVerdictRecord: with outbox.verdict_delay
// the caller gets "accepted" while the verdict's record waits for the
// outbox's next commit. The agent is killed with SIGKILL right then: the
// file holds the command pending, the restarted agent resends it, the
// device answers duplicate (it applied it once) and the command ends
// once, duplicate — nothing lost (I4), nothing applied twice (I1).
func TestKillAfterAcceptedBeforeVerdictRecord(t *testing.T) {
	e := newEnv(t, "dev-1")
	cfg, sock := e.config("gw-1", 30*time.Second)
	f, err := os.OpenFile(cfg, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	// An hour: only another commit, or a clean shutdown, records it.
	if _, err := f.WriteString("outbox:\n  verdict_delay: 1h\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	a := e.startAgent("gw-1", cfg)
	e.waitHolding(a, sock)
	r := edgefence(t, "send", "--json", "--socket", sock, "dev-1", "set", `{"setpoint":1}`)
	res := sendResult(t, r)
	if r.code != 0 || res.Verdict != "accepted" {
		t.Fatalf("send: %+v\n%s", res, r)
	}
	// Ended in the agent's views before its record is durable.
	if l := outboxList(t, sock); len(l.Records) != 1 || l.Records[0].State != fence.Accepted || l.Summary.Pending != 0 {
		t.Fatalf("outbox list before the kill: %+v", l)
	}
	if err := a.Kill(); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(e.dir, "gw-1-state", offline.File)
	ob, err := offline.Open(state, &offline.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := ob.Get(res.ID)
	ob.Close()
	if err != nil || !rec.Pending() {
		t.Fatalf("in the file after the kill: %+v %v, want pending (its record was waiting)", rec, err)
	}

	a2 := e.startAgent("gw-1-restarted", cfg)
	e.waitHolding(a2, sock)
	for deadline := time.Now().Add(60 * time.Second); ; {
		l := outboxList(t, sock)
		if len(l.Records) == 1 && !l.Records[0].Pending() {
			if got := l.Records[0]; got.ID != res.ID || got.State != fence.Duplicate {
				t.Fatalf("after the restart: %+v, want %s duplicate", got, res.ID)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ended after the restart: %+v", l)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if m, err := e.fleet.Mark("dev-1"); err != nil || m.Seq != 1 {
		t.Fatalf("device mark %+v %v, want seq 1 (applied once)", m, err)
	}
	final, r := status(t, sock)
	if final == nil || final.Counters.Duplicate != 1 || final.Counters.Accepted != 0 {
		t.Fatalf("counters after the restart: %+v\n%s", final, r)
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
