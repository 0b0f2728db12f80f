package main

import (
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/history"
	"github.com/edgefence/edgefence/fence/history/linear"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// TestDevsimHistory runs the devsim with --history on a real broker, kills
// it with SIGKILL and restarts it on the same directory and history file.
// The test plays the agent's outbox in a history file of its own (created,
// then the ack as terminal state); the two files together check clean, and
// the devsim's file holds exactly its decisions.
func TestDevsimHistory(t *testing.T) {
	url := startBroker(t)
	dir, tmp := t.TempDir(), t.TempDir()
	hpath, opath := filepath.Join(tmp, "devsim.jsonl"), filepath.Join(tmp, "outbox.jsonl")
	k := sandbox.NewCommander(t, url, mqtt.Topics{})
	outbox, err := history.Create(opath, "outbox:test")
	if err != nil {
		t.Fatal(err)
	}
	defer outbox.Close()
	send := func(dev string, tok fence.Token, seq uint64, want fence.Verdict) {
		t.Helper()
		e := history.Event{Op: history.OpCreated, Device: dev, Token: uint64(tok), Seq: seq}
		e.ID = k.Publish(t, dev, tok, seq, sim.SetBody{Setpoint: ptr(float64(seq))})
		if err := outbox.Record(e); err != nil {
			t.Fatal(err)
		}
		a := k.Await(t, e.ID)
		if a.Verdict != want {
			t.Fatalf("%s %d/%d: %+v, want %v", dev, tok, seq, a, want)
		}
		e.Op, e.Verdict = history.OpTerminal, a.Verdict.String()
		if err := outbox.Record(e); err != nil {
			t.Fatal(err)
		}
	}

	args := []string{"--mqtt", url, "--devices", "dev-1,dev-2", "--dir", dir, "--log", filepath.Join(tmp, "v.jsonl"),
		"--history", hpath}
	d := startDevsim(t, args...)
	d.awaitReady(t)
	send("dev-1", 70, 1, fence.Accepted)
	send("dev-2", 71, 1, fence.Accepted)
	send("dev-1", 72, 1, fence.Accepted)
	send("dev-1", 70, 2, fence.Stale) // the frozen holder wakes up
	d.cmd.Process.Signal(syscall.SIGKILL)
	d.wait(t)

	d = startDevsim(t, append(args, "--history-source", "devsim-2")...)
	d.awaitReady(t)
	send("dev-1", 72, 2, fence.Accepted)
	send("dev-2", 71, 2, fence.Accepted)
	d.stop(t, syscall.SIGTERM)

	evs, err := history.Read(hpath)
	if err != nil {
		t.Fatal(err)
	}
	// The broker may redeliver a command whose PUBACK the kill cut off: it
	// is decided again (duplicate, or stale again), and recorded again.
	var got []string
	first := map[string]string{}
	for _, e := range evs {
		if e.Op != history.OpVerdict || e.Kind != sim.KindSet || e.ID == "" {
			t.Fatalf("devsim history event %+v", e)
		}
		if v, seen := first[e.ID]; seen {
			if e.Verdict != "duplicate" && e.Verdict != v {
				t.Fatalf("redelivery of %s (%s) decided %s", e.ID, v, e.Verdict)
			}
			continue
		}
		first[e.ID] = e.Verdict
		got = append(got, e.Source+" "+e.ID+" "+e.Verdict)
	}
	want := []string{
		"devsim dev-1-70-1 accepted", "devsim dev-2-71-1 accepted", "devsim dev-1-72-1 accepted", "devsim dev-1-70-2 stale",
		"devsim-2 dev-1-72-2 accepted", "devsim-2 dev-2-71-2 accepted",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("devsim history\n got %q\nwant %q", got, want)
	}
	all, err := history.Read(hpath, opath)
	if err != nil {
		t.Fatal(err)
	}
	r := history.Check(all)
	if !r.OK() || r.Created != 6 || r.Terminal["accepted"] != 5 || r.Devices != 2 {
		t.Fatalf("check:\n%s", r)
	}
	t.Logf("\n%s", r)
	// The acks as the outbox recorded them fit one fenced register per
	// device, in real time.
	if res, err := linear.Check(all, 10*time.Second); err != nil || res != porcupine.Ok {
		t.Fatalf("linearizability: %v %v", res, err)
	}
}
