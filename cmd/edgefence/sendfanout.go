package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/edgefence/edgefence/agent"
)

const fanoutUsage = `
Fan-out: with --devices or --selector, send takes KIND [JSON-BODY] and
commands every device selected, each under its own token and seq, in one
request (POST /v1/fanout):
  --devices dev-1,dev-2   a list of device ids
  --devices 'meter-*'     a glob over the configured ids (Go's path.Match:
                          * any run, ? one character, [a-z] a class)
  --selector site=a,kind!=pump
                          the devices whose config labels match every term
On a terminal a line shows the progress (n/N done, by outcome); at the end
one line per outcome with its count, and each device that was not applied
with its reason. --json prints the agent's NDJSON lines as they come
(selected, one result a device, the summary). The exit status is the worst
device's: 1 if the agent refused any device (unknown, not held, queue
full), else 3 if a device refused its command (stale, invalid, expired),
else 7 if a device's fate is unknown, else 4 if any is still queued, else 0.`

// fanoutFlags are send's fan-out selection flags.
type fanoutFlags struct {
	devices, selector *string
}

func registerFanoutFlags(fs *flag.FlagSet) fanoutFlags {
	return fanoutFlags{
		devices:  fs.String("devices", "", "fan-out: a comma-separated list of device ids, or a glob (path.Match) over the configured ids; then KIND [JSON-BODY]"),
		selector: fs.String("selector", "", "fan-out: the devices whose labels match, e.g. site=a,kind!=pump; then KIND [JSON-BODY]"),
	}
}

func (f fanoutFlags) set() bool { return *f.devices != "" || *f.selector != "" }

// selection is the request's selection: a glob if --devices has a glob
// metacharacter, else a comma-separated list.
func (f fanoutFlags) selection() agent.Selection {
	switch {
	case *f.selector != "":
		return agent.Selection{Selector: *f.selector}
	case strings.ContainsAny(*f.devices, "*?[\\"):
		return agent.Selection{Glob: *f.devices}
	}
	var ids []string
	for d := range strings.SplitSeq(*f.devices, ",") {
		if d = strings.TrimSpace(d); d != "" {
			ids = append(ids, d)
		}
	}
	return agent.Selection{Devices: ids}
}

// fanoutExit ranks outcomes, worst first, with their exit codes.
var fanoutExit = []struct {
	outcomes []string
	code     int
}{
	{[]string{"refused"}, exitFailure},
	{[]string{"stale", "invalid", "expired"}, exitVerdict},
	{[]string{"unknown"}, exitUnknown},
	{[]string{"queued"}, exitQueued},
}

// fanoutCode is the exit code of a fan-out's summary: its worst outcome's.
func fanoutCode(by map[string]int) int {
	for _, e := range fanoutExit {
		for _, o := range e.outcomes {
			if by[o] > 0 {
				return e.code
			}
		}
	}
	return 0
}

// runFanout sends the fan-out and prints its progress and result.
func runFanout(ctx context.Context, api *agent.APIClient, req agent.FanoutRequest, asJSON bool, stdout, stderr io.Writer) error {
	p := &fanoutProgress{w: stderr, live: isTerminal(stderr), by: map[string]int{}}
	var notApplied []agent.SendResult
	sum, err := api.FanOut(ctx, req, func(ev agent.FanoutEvent) {
		if asJSON {
			_ = json.NewEncoder(stdout).Encode(ev)
		}
		switch {
		case ev.Selected != nil:
			p.total = ev.Selected.Devices
		case ev.Result != nil:
			o := ev.Result.Outcome()
			p.add(o)
			if o != "accepted" && o != "duplicate" {
				notApplied = append(notApplied, *ev.Result)
			}
		}
	})
	p.end()
	if err != nil {
		fmt.Fprintln(stderr, "edgefence:", err)
		if len(p.by) > 0 {
			fmt.Fprintf(stderr, "edgefence: the answer stopped after %d of %d devices; see edgefence outbox list for the others\n", p.done, p.total)
		}
		return exitError{exitFailure}
	}
	if asJSON {
		_ = json.NewEncoder(stdout).Encode(agent.FanoutEvent{Summary: sum})
	} else {
		printFanoutSummary(stdout, sum, notApplied)
	}
	if code := fanoutCode(sum.ByOutcome); code != 0 {
		return exitError{code}
	}
	return nil
}

// printFanoutSummary prints the counts by outcome and the devices that
// did not apply the command, with their reasons.
func printFanoutSummary(w io.Writer, sum *agent.FanoutSummary, notApplied []agent.SendResult) {
	fmt.Fprintf(w, "%d devices in %.0f ms (stored in %.0f ms, %d outbox commits):", sum.Devices, sum.ElapsedMs, sum.IssuedMs, sum.Commits)
	for _, o := range outcomeOrder(sum.ByOutcome) {
		fmt.Fprintf(w, " %s %d", o, sum.ByOutcome[o])
	}
	fmt.Fprintln(w)
	slices.SortFunc(notApplied, func(a, b agent.SendResult) int { return strings.Compare(a.Device, b.Device) })
	for _, r := range notApplied {
		why := r.Error
		if r.Ack != nil && r.Ack.Reason != "" {
			why = r.Ack.Reason
		} else if r.Verdict == "stale" && r.Ack != nil {
			why = fmt.Sprintf("the device's fence is at token %d, a newer holder", r.Ack.MaxToken)
		}
		fmt.Fprintf(w, "  %s %s", r.Outcome(), r.Device)
		if r.ID != "" {
			fmt.Fprintf(w, " token %d seq %d id %s", r.Token, r.Seq, r.ID)
		}
		if why != "" {
			fmt.Fprintf(w, ": %s", why)
		}
		fmt.Fprintln(w)
	}
}

// outcomeOrder is the outcomes present in by, the applied ones first.
func outcomeOrder(by map[string]int) []string {
	var out []string
	for _, o := range []string{"accepted", "duplicate", "stale", "invalid", "expired", "unknown", "queued", "refused"} {
		if by[o] > 0 {
			out = append(out, o)
		}
	}
	return out
}

// fanoutProgress is the progress line on a terminal: n/N done, by
// outcome, redrawn at most every 100 ms.
type fanoutProgress struct {
	w           io.Writer
	live        bool
	total, done int
	by          map[string]int
	last        time.Time
}

func (p *fanoutProgress) add(outcome string) {
	p.done++
	p.by[outcome]++
	if p.live && (time.Since(p.last) >= 100*time.Millisecond || p.done == p.total) {
		p.last = time.Now()
		var b strings.Builder
		fmt.Fprintf(&b, "\r\x1b[K%d/%d done", p.done, p.total)
		for _, o := range outcomeOrder(p.by) {
			fmt.Fprintf(&b, ", %s %d", o, p.by[o])
		}
		io.WriteString(p.w, b.String())
	}
}

func (p *fanoutProgress) end() {
	if p.live && p.done > 0 {
		fmt.Fprintln(p.w)
	}
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
