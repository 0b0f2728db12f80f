package main

import (
	"flag"
	"fmt"
	"io"
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
autonomy policy, the commands pending in the outbox and the age of the
oldest, and the fence point's verdicts on this agent's commands since start
(accepted/stale, and duplicate/invalid when any).

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
	return nil
}

func printDevices(w io.Writer, devs []agent.DeviceStatus, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DEVICE\tSTATE\tTOKEN\tFENCE\tPOLICY\tPENDING\tOLDEST\tACCEPTED/STALE\tLAST VERDICT")
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
		v := d.Verdicts
		counts := fmt.Sprintf("%d/%d", v.Accepted, v.Stale)
		if v.Duplicate != 0 || v.Invalid != 0 || v.Expired != 0 {
			counts += fmt.Sprintf(" (dup %d, inv %d, exp %d)", v.Duplicate, v.Invalid, v.Expired)
		}
		last := "-"
		if d.LastAck != nil {
			last = fmt.Sprintf("%s (token %d seq %d)", d.LastAck.Verdict, d.LastAck.Token, d.LastAck.Seq)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", d.ID, d.State, tok, fenceAt, orDash(d.Policy), d.Queued, oldest, counts, last)
	}
	_ = tw.Flush()
}
