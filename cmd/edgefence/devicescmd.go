package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/edgefence/edgefence/agent"
)

func cmdDevices(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("devices", flag.ContinueOnError)
	fs.SetOutput(stderr)
	sock := socketFlags(fs)
	asJSON := fs.Bool("json", false, "print JSON: the devices part of status --json")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: edgefence devices [flags]

One row per configured device of the running agent: its state (holding,
campaigning, lost, autonomous, …), the token it holds, where it is fenced
(device: the firmware's shim; gateway: its home gateway's table), its
autonomy policy, its auth policy (required: signed commands; off: plain
envelopes), the commands pending in the outbox and the age of the
oldest, how this agent's commands to it ended since start, the last one to
end, and why the device is lost or refused. On the home gateway of Modbus
devices, a second table shows each one's bus, unit id, profile, last
answered poll and last error, and a third each bus's transactions, errors
by kind, the time it was busy (rate of edgefence_modbus_busy_seconds_total
is its utilisation) and the polls' share of it against the cap.

ACCEPTED/STALE counts every command that ended so, whoever decided it: STALE
includes the commands the agent ended stale itself without sending them
(superseded: another session held the lock), which the parenthesis splits
out with duplicate, invalid and expired (expired: never sent within its
time to live) when there are any. LAST VERDICT is the last command that
ended, by either.

`)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	st, err := agentStatus(sock)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(stdout, st.Devices)
	}
	printDevices(stdout, st.Devices, time.Now())
	if bs := modbusStatus(st); bs != nil {
		printModbus(stdout, bs, time.Now())
	}
	return nil
}

func printDevices(w io.Writer, devs []agent.DeviceStatus, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DEVICE\tSTATE\tTOKEN\tFENCE\tPOLICY\tAUTH\tPENDING\tOLDEST\tACCEPTED/STALE\tLAST VERDICT\tREASON")
	for _, d := range devs {
		tok := "-"
		if d.Token != 0 {
			tok = fmt.Sprint(d.Token)
		}
		fenceAt := orDash(d.Fence)
		if d.Home != "" {
			fenceAt += "@" + d.Home
		}
		oldest := "-"
		if !d.Oldest.IsZero() {
			oldest = fmtAge(now.Sub(d.Oldest))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", d.ID, d.State, tok, fenceAt, orDash(d.Policy), orDash(d.Auth), d.Queued, oldest,
			verdictCounts(d.Verdicts), lastVerdict(d.LastAck, false), orDash(reasonCell(d, now)))
	}
	_ = tw.Flush()
}

// verdictCounts is the ACCEPTED/STALE cell: stale counts the fence point's
// stale verdicts and the agent's superseded commands alike, since both
// ended stale; the parenthesis splits out the rarer verdicts when any.
func verdictCounts(v agent.VerdictCounts) string {
	s := fmt.Sprintf("%d/%d", v.Accepted, v.Stale+v.Superseded)
	var more []string
	for _, c := range []struct {
		name string
		n    uint64
	}{{"superseded", v.Superseded}, {"dup", v.Duplicate}, {"inv", v.Invalid}, {"exp", v.Expired}, {"unknown", v.Unknown}} {
		if c.n != 0 {
			more = append(more, fmt.Sprintf("%s %d", c.name, c.n))
		}
	}
	if len(more) > 0 {
		s += " (" + strings.Join(more, ", ") + ")"
	}
	return s
}
