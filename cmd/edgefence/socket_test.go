package main

import (
	"context"
	"os"
	"testing"
	"time"
)

// An agent killed with SIGKILL leaves its socket file behind; the next
// agent on the same config replaces it and serves.
func TestStaleSocket(t *testing.T) {
	e := newEnv(t, "dev-1")
	cfg, sock := e.config("gw-1", 2*time.Second) // the killed agent's lease expires soon
	a := e.startAgent("gw-1", cfg)
	stA := e.waitHolding(a, sock)
	if err := a.Kill(); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(sock); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("no stale socket after kill -9: %v", err)
	}

	a2 := e.startAgent("gw-1-restarted", cfg)
	st := e.waitHolding(a2, sock)
	// Within the killed agent's TTL the restart re-attaches to its lease
	// (same token); later it campaigns afresh (a higher one).
	if tok, old := st.Devices[0].Token, stA.Devices[0].Token; tok < old || (tok == old && st.Counters.Reattached != 1) {
		t.Fatalf("token %d after restart (re-attached %d), want %d re-attached or above", tok, st.Counters.Reattached, old)
	}
	r := edgefence(t, "send", "--json", "--socket", sock, "dev-1", "set", `{"setpoint":22}`)
	if res := sendResult(t, r); r.code != 0 || res.Verdict != "accepted" {
		t.Fatalf("send after restart: %+v\n%s", res, r)
	}
}

// A second agent on a socket a running agent serves fails with a clear
// error, and before it touches etcd or the broker: it must not campaign,
// nor take over the first agent's MQTT session (same config, same client
// id).
func TestSocketInUse(t *testing.T) {
	e := newEnv(t, "dev-1", "dev-2")
	cfg, sock := e.config("gw-1", 10*time.Second)
	a := e.startAgent("gw-1", cfg)
	stA := e.waitHolding(a, sock)
	for deadline := time.Now().Add(30 * time.Second); stA.Transport["connected"] != true; {
		if time.Now().After(deadline) {
			t.Fatalf("first agent not connected to the broker: %v", stA.Transport)
		}
		time.Sleep(20 * time.Millisecond)
		stA = e.waitHolding(a, sock)
	}
	rev := e.revision()

	b := e.startAgent("gw-1-again", cfg)
	select {
	case <-b.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("second agent on a busy socket did not exit")
	}
	if err := b.Stop(0); err == nil {
		t.Fatal("second agent exited 0")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := b.WaitLine(ctx, sock+" is in use by a running agent"); err != nil {
		t.Fatal(err)
	}

	if got := e.revision(); got != rev {
		t.Errorf("etcd revision %d → %d: the second agent wrote to etcd (campaigned) before finding the socket taken", rev, got)
	}
	st, r := status(t, sock)
	if st == nil {
		t.Fatalf("first agent's status\n%s", r)
	}
	if st.Etcd.Sessions != 1 || st.Etcd.Lease != stA.Etcd.Lease {
		t.Errorf("first agent's session changed: %+v, was %+v", st.Etcd, stA.Etcd)
	}
	if n, _ := st.Transport["reconnects"].(float64); n != 0 || st.Transport["connected"] != true {
		t.Errorf("first agent's MQTT connection was disturbed: %v", st.Transport)
	}
	for i, d := range st.Devices {
		if d.State != "holding" || d.Token != stA.Devices[i].Token {
			t.Errorf("%s: %+v, want still holding under token %d", d.ID, d, stA.Devices[i].Token)
		}
	}
	r = edgefence(t, "send", "--json", "--socket", sock, "dev-2", "set", `{"setpoint":22}`)
	if res := sendResult(t, r); r.code != 0 || res.Verdict != "accepted" {
		t.Fatalf("first agent's send after the second failed: %+v\n%s", res, r)
	}
}
