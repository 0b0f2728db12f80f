package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/fence"
)

const sendUsage = `usage: edgefence send [flags] DEVICE KIND [JSON-BODY]
       edgefence send [flags] --devices LIST|GLOB | --selector SEL KIND [JSON-BODY]

Issue one command via the running agent and print the device's verdict, one
line: VERDICT DEVICE token T seq S id ID, then what the device said. With
--json, the agent's answer as JSON (device, id, token, seq, verdict, ack, error).

The body is checked before the agent issues anything: one JSON value, with no
number that CBOR cannot carry as written (1e999 would be +Inf; an integer
beyond 64 bits) — else exit 1, naming where in the body. Which kinds and
fields a device takes is the device's own; the simulated ones are in README
("Command kinds and bodies"); a device refuses the others as invalid.

Exit status:
  0  the device applied the command: accepted, or duplicate (it had already
     applied this very command — a resend after a lost ack — and did not
     apply it again; do not send it again)
  3  the device refused it: stale (another holder has a newer token) or
     invalid (the reason says why)
  4  queued: stored in the agent's outbox without a verdict yet (it is
     delivered when it can be: see edgefence outbox show ID)
  1  refused by the agent (not the holder, unknown device, outbox full, a bad
     body) or failed
  2  usage
  6  no agent answers on the socket`

func cmdSend(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("send", flag.ContinueOnError)
	fs.SetOutput(stderr)
	sock := socketFlags(fs)
	timeout := fs.Duration("timeout", 30*time.Second, "give up after this long")
	noWait := fs.Bool("no-wait", false, "return once the command is stored in the agent's outbox (exit 4), without waiting for the device's verdict")
	asJSON := fs.Bool("json", false, "print the agent's answer as JSON (a fan-out: its NDJSON lines)")
	fan := registerFanoutFlags(fs)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), sendUsage+"\n"+fanoutUsage+"\n\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, -1); err != nil {
		return err
	}
	first := 1 // the KIND argument's index
	if fan.set() {
		first = 0
	}
	if fs.NArg() < first+1 || fs.NArg() > first+2 || *fan.devices != "" && *fan.selector != "" {
		fs.Usage()
		return exitError{exitUsage}
	}
	body, err := sendBody(fs.Args()[first+1:])
	if err != nil {
		return err
	}
	path, err := sock()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	api := agent.NewAPIClient(path)
	if fan.set() {
		req := agent.FanoutRequest{Selection: fan.selection(), Kind: fs.Arg(0), Body: body, NoWait: *noWait}
		return runFanout(ctx, api, req, *asJSON, stdout, stderr)
	}
	send := api.Send
	if *noWait {
		send = api.Enqueue
	}
	res, err := send(ctx, fs.Arg(0), fs.Arg(1), body)
	if res == nil {
		return err
	}
	if *asJSON {
		if err := printJSON(stdout, res); err != nil {
			return err
		}
	} else {
		printSendResult(stdout, res)
	}
	switch {
	case res.Verdict != "":
		var v fence.Verdict
		if v.UnmarshalText([]byte(res.Verdict)) == nil && (v == fence.Accepted || v == fence.Duplicate) {
			return nil // applied, exactly once
		}
		if v == fence.Unknown {
			return exitError{exitUnknown}
		}
		return exitError{exitVerdict}
	case res.Queued:
		if res.Error != "" {
			fmt.Fprintf(stderr, "edgefence: no verdict yet; queued as %s (edgefence outbox show %s)\n", res.ID, res.ID)
		}
		return exitError{exitQueued}
	}
	// No verdict: the agent refused (unknown device, not the holder,
	// outbox full). Say why on stderr; with --json stdout has it too.
	if res.Error != "" {
		fmt.Fprintln(stderr, "edgefence:", res.Error)
	} else if err != nil {
		fmt.Fprintln(stderr, "edgefence:", err)
	}
	return exitError{exitFailure}
}

// sendBody checks send's JSON-BODY argument (args: none or it) as the
// agent would, so that what it would refuse is refused here: it uses up
// no seq.
func sendBody(args []string) (json.RawMessage, error) {
	if len(args) == 0 {
		return nil, nil
	}
	arg := args[0]
	body := json.RawMessage(arg)
	if !json.Valid(body) {
		return nil, fmt.Errorf("body is not valid JSON: %s", arg)
	}
	if _, err := agent.JSONToBody(body); err != nil {
		return nil, err
	}
	return body, nil
}

// printSendResult prints send's answer for people: one line with the
// verdict, device, token, seq and command id, and what the verdict means.
// A refusal by the agent (no verdict, not queued) prints nothing here: the
// error goes to stderr.
func printSendResult(w io.Writer, res *agent.SendResult) {
	var what string
	switch {
	case res.Verdict != "":
		what = res.Verdict
	case res.Queued:
		what = "queued"
	default:
		return
	}
	fmt.Fprintf(w, "%s %s token %d seq %d id %s", what, res.Device, res.Token, res.Seq, res.ID)
	a := res.Ack
	switch {
	case res.Verdict == fence.Duplicate.String():
		fmt.Fprint(w, ": the device had already applied this command; not applied again")
	case res.Verdict == fence.Stale.String() && a != nil:
		fmt.Fprintf(w, ": the device's fence is at token %d seq %d, a newer holder", a.MaxToken, a.LastSeq)
	case res.Queued:
		fmt.Fprintf(w, ": no verdict yet (edgefence outbox show %s)", res.ID)
	}
	if a != nil && a.Reason != "" && res.Verdict != fence.Duplicate.String() {
		fmt.Fprintf(w, "; reason: %s", a.Reason)
	}
	fmt.Fprintln(w)
}
