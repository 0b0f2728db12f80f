package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/offline"
)

// TestSendFanout, on a running agent and real devices: `send --devices
// GLOB` commands every device under its own token with its own seq, each
// applied once; a device a newer holder reached answers stale, listed with
// its reason, and the exit status is 3 while the others are accepted; a
// list naming a device the agent does not know exits 1 and says why;
// --json prints the NDJSON lines; --selector selects by the config's
// labels.
func TestSendFanout(t *testing.T) {
	devs := []string{"dev-1", "dev-2", "dev-3", "dev-4", "dev-5"}
	e := newEnv(t, devs...)
	e.labels = map[string]map[string]string{"dev-1": {"site": "a"}, "dev-2": {"site": "a", "kind": "pump"},
		"dev-4": {"site": "a", "kind": "valve"}, "dev-5": {"site": "b"}}
	cfg, sock := e.config("gw-1", 10*time.Second)
	st := e.waitHolding(e.startAgent("gw-1", cfg), sock)
	tokens := map[string]uint64{}
	for _, d := range st.Devices {
		tokens[d.ID] = uint64(d.Token)
	}

	// Another holder, with a newer token, reaches dev-3 first.
	other := e.commander("gw-9", "dev-3")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	newer := fence.Token(tokens["dev-3"] + 1000)
	if ack, err := other.Send(ctx, &fence.Envelope{V: fence.Version, Device: "dev-3", Token: newer, Seq: 1, ID: "newer-holder", Kind: "ping", Holder: "gw-9"}); err != nil || ack.Verdict != fence.Accepted {
		t.Fatalf("newer holder: %+v %v", ack, err)
	}

	r := edgefence(t, "send", "--socket", sock, "--devices", "dev-*", "set", `{"setpoint":23}`)
	if r.code != exitVerdict || !strings.HasPrefix(r.stdout, "5 devices in ") || !strings.Contains(r.stdout, "accepted 4 stale 1") ||
		!strings.Contains(r.stdout, fmt.Sprintf("\n  stale dev-3 token %d seq 1 id ", tokens["dev-3"])) || !strings.Contains(r.stdout, fmt.Sprint(newer)) {
		t.Fatalf("want exit 3, 4 accepted, dev-3 stale with the newer token\n%s", r)
	}
	for _, d := range devs {
		s, err := e.fleet.State(d) // dev-3: the newer holder's ping only
		if err != nil || s.Applied != 1 || d != "dev-3" && (uint64(s.LastToken) != tokens[d] || s.LastSeq != 1 || s.Setpoint != 23) {
			t.Errorf("%s: state %+v %v; want applied once, under its own token %d, seq 1", d, s, err, tokens[d])
		}
	}

	r = edgefence(t, "send", "--json", "--socket", sock, "--devices", "dev-1,nope,dev-2", "ping")
	var sum *agent.FanoutSummary
	results := map[string]agent.SendResult{}
	for line := range strings.Lines(r.stdout) {
		var ev agent.FanoutEvent
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("--json line %q: %v\n%s", line, err, r)
		}
		if ev.Result != nil {
			results[ev.Result.Device] = *ev.Result
		}
		if ev.Summary != nil {
			sum = ev.Summary
		}
	}
	if r.code != exitFailure || sum == nil || sum.ByOutcome["accepted"] != 2 || !strings.Contains(results["nope"].Error, "unknown device") || results["dev-1"].Seq != 2 {
		t.Fatalf("want exit 1, dev-1 and dev-2 accepted (seq 2), nope refused as unknown\n%s", r)
	}
	t.Run("a progress line on a terminal", func(t *testing.T) {
		out := sendOnTerminal(t, "send", "--socket", sock, "--devices", "dev-1,dev-2,dev-4,dev-5", "ping")
		if !strings.Contains(out, "\r\x1b[K4/4 done, accepted 4") {
			t.Fatalf("the terminal shows no final progress line %q:\n%q", "4/4 done, accepted 4", out)
		}
	})
	r = edgefence(t, "send", "--socket", sock, "--selector", "site=a,kind!=pump", "set", `{"setpoint":24}`)
	if r.code != exitOK || !strings.HasPrefix(r.stdout, "2 devices in ") || !strings.Contains(r.stdout, "accepted 2") {
		t.Fatalf("--selector site=a,kind!=pump: want exit 0, dev-1 and dev-4 accepted\n%s", r)
	}
	for _, d := range devs {
		s, err := e.fleet.State(d)
		if selected := d == "dev-1" || d == "dev-4"; err != nil || selected != (s.Setpoint == 24) {
			t.Errorf("%s: state %+v %v; selected by site=a,kind!=pump: %v", d, s, err, selected)
		}
	}
	if r := edgefence(t, "send", "--socket", sock, "--selector", "site=c", "ping"); r.code != exitFailure || !strings.Contains(r.stderr, "selects no configured device") {
		t.Fatalf("a selector that selects nothing\n%s", r)
	}
	if r := edgefence(t, "send", "--socket", sock, "--devices", "dev-1", "--selector", "site=a", "ping"); r.code != exitUsage {
		t.Fatalf("--devices with --selector: want usage\n%s", r)
	}
	if r := edgefence(t, "send", "--socket", sock, "--devices", "pump-*", "ping"); r.code != exitFailure || !strings.Contains(r.stderr, "selects no configured device") {
		t.Fatalf("a glob that selects nothing\n%s", r)
	}
}

// TestFanoutKill9: the agent is killed with SIGKILL while a fan-out to
// more devices than one outbox commit takes is under way, and started
// again. Every device's command is either in the outbox and applied once
// (after the restart if not before), or was never appended and never
// applied: none lost, none applied twice, the outbox and the devices agree.
func TestFanoutKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("1,100 devices")
	}
	n := agent.FanoutChunk + 76
	devs := make([]string, n)
	for i := range devs {
		devs[i] = fmt.Sprintf("dev-%04d", i)
	}
	e := newEnv(t, devs...)
	cfg, sock := e.config("gw-1", 30*time.Second)
	a := e.startAgent("gw-1", cfg)
	e.waitHolding(a, sock)

	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	// The kill lands as the first device acks: the first commit's devices
	// are being delivered, the last chunk is being built or committed.
	killed := make(chan error, 1)
	go func() {
		for e.fleet.Stats().AcksPublished == 0 && ctx.Err() == nil {
			time.Sleep(100 * time.Microsecond)
		}
		killed <- a.Kill() // no revoke: the lease lives on
	}()
	reported := map[string]agent.SendResult{}
	_, err := agent.NewAPIClient(sock).FanOut(ctx, agent.FanoutRequest{Selection: agent.Selection{Glob: "dev-*"}, Kind: "ping"}, func(ev agent.FanoutEvent) {
		if ev.Result != nil {
			reported[ev.Result.Device] = *ev.Result
		}
	})
	if err := <-killed; err != nil {
		t.Fatal(err)
	}
	if err == nil {
		t.Fatal("the fan-out's answer ended with a summary although the agent was killed")
	}
	applied := 0
	for _, d := range devs {
		if s, _ := e.fleet.State(d); s.Applied > 0 {
			applied++
		}
	}
	a2 := e.startAgent("gw-1-restarted", cfg)
	e.waitHolding(a2, sock)
	recs := waitOutboxEnded(t, sock)
	byDev := map[string]offline.Record{}
	for _, rec := range recs {
		if _, dup := byDev[rec.Device]; dup {
			t.Errorf("%s: two entries in the outbox", rec.Device)
		}
		byDev[rec.Device] = rec
	}
	duplicates := 0
	for _, d := range devs {
		s, err := e.fleet.State(d)
		if err != nil {
			t.Fatal(err)
		}
		rec, stored := byDev[d]
		switch {
		case stored:
			if rec.State == fence.Duplicate {
				duplicates++ // applied before the kill, its ack lost with the agent: resent, not applied again
			}
			if (rec.State == fence.Accepted || rec.State == fence.Duplicate) && s.Applied == 1 && s.LastID == rec.ID {
				continue
			}
			t.Errorf("%s: stored %s ended %v, device applied %d (last %s): want applied once", d, rec.ID, rec.State, s.Applied, s.LastID)
		case !stored && s.Applied != 0:
			t.Errorf("%s: never stored, yet applied %d", d, s.Applied)
		case !stored && reported[d].ID != "":
			t.Errorf("%s: reported %+v before the kill, not in the outbox", d, reported[d])
		}
	}
	t.Logf("%d of %d devices' commands stored before the kill, %d applied when it was seen dead (%d answered duplicate after the restart: applied, ack lost), %d results reported before the kill",
		len(byDev), n, applied, duplicates, len(reported))
}

// waitOutboxEnded polls the outbox until every record has a terminal
// state, and returns the records.
func waitOutboxEnded(t *testing.T, sock string) []offline.Record {
	t.Helper()
	for deadline := time.Now().Add(90 * time.Second); ; {
		r := edgefence(t, "outbox", "list", "--json", "--state", "all", "--socket", sock)
		var l agent.OutboxList
		if err := json.Unmarshal([]byte(r.stdout), &l); r.code != 0 || err != nil {
			t.Fatalf("outbox list: %v\n%s", err, r)
		}
		ended := true
		for _, rec := range l.Records {
			ended = ended && !rec.Pending()
		}
		if ended {
			return l.Records
		}
		if time.Now().After(deadline) {
			t.Fatalf("outbox not delivered: %d records", len(l.Records))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestFanoutExitAndSelection: the exit status is the worst device's, in
// the order the help gives; --devices is a glob when it has a glob
// metacharacter, else a list.
func TestFanoutExitAndSelection(t *testing.T) {
	for _, tc := range []struct {
		by   map[string]int
		want int
	}{
		{map[string]int{"accepted": 3, "duplicate": 1}, 0},
		{map[string]int{"accepted": 3, "queued": 1}, exitQueued},
		{map[string]int{"queued": 1, "unknown": 1}, exitUnknown},
		{map[string]int{"unknown": 1, "expired": 1}, exitVerdict},
		{map[string]int{"stale": 1, "invalid": 1}, exitVerdict},
		{map[string]int{"stale": 5, "refused": 1}, exitFailure},
		{map[string]int{}, 0},
	} {
		if got := fanoutCode(tc.by); got != tc.want {
			t.Errorf("%v: exit %d, want %d", tc.by, got, tc.want)
		}
	}
	sel := func(devices, selector string) agent.Selection {
		return fanoutFlags{devices: &devices, selector: &selector}.selection()
	}
	if s := sel("meter-*", ""); s.Glob != "meter-*" || s.Devices != nil {
		t.Errorf("glob: %+v", s)
	}
	if s := sel(" a, b,,c ", ""); strings.Join(s.Devices, "|") != "a|b|c" || s.Glob != "" {
		t.Errorf("list: %+v", s)
	}
	if s := sel("", "site=a"); s.Selector != "site=a" {
		t.Errorf("selector: %+v", s)
	}
}

// sendOnTerminal runs the CLI with its stderr on a pty (stdout a pipe)
// and returns what the terminal got.
func sendOnTerminal(t *testing.T, args ...string) string {
	t.Helper()
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer ptmx.Close()
	ctx, cancel := context.WithTimeout(t.Context(), cliTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), subprocEnv()...)
	cmd.Stderr = tty
	read := make(chan string, 1)
	go func() {
		var b bytes.Buffer
		_, _ = io.Copy(&b, ptmx) // ends with EIO once the tty's last holder closed it
		read <- b.String()
	}()
	err = cmd.Run()
	tty.Close()
	if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return <-read
}
