package main

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/agent/bridge"
)

// modbusStatus returns the Modbus part of a home gateway's status, or nil.
func modbusStatus(st *agent.Status) *bridge.Status {
	if st.Bridge == nil {
		return nil
	}
	raw, err := json.Marshal(st.Bridge)
	if err != nil {
		return nil
	}
	var bs bridge.Status
	if json.Unmarshal(raw, &bs) != nil || len(bs.Units) == 0 && len(bs.Buses) == 0 {
		return nil
	}
	return &bs
}

// printModbus prints the Modbus devices this gateway is home for (bus,
// unit, profile, last poll, errors) and its buses (transactions, errors,
// utilisation), below the devices table.
func printModbus(w io.Writer, bs *bridge.Status, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\nMODBUS DEVICE\tBUS\tUNIT\tPROFILE\tLAST POLL\tPOLLS\tPOLL ERRORS\tLAST ERROR")
	for _, u := range bs.Units {
		last := "-"
		if !u.LastPoll.IsZero() {
			last = fmtAge(now.Sub(u.LastPoll)) + " ago"
		}
		errCell := "-"
		if u.LastError != "" {
			errCell = oneLine(u.LastError) + " (" + fmtAge(now.Sub(u.ErrorAt)) + " ago)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%d\t%d\t%s\n", u.Device, u.Bus, u.Unit, orDash(u.Profile), last, u.Polls, u.PollErrs, errCell)
	}
	fmt.Fprintln(tw, "\nBUS\tTRANSPORT\tTARGET\tTRANSACTIONS\tTIMEOUTS\tCRC\tFRAME\tEXCEPTIONS\tNOT SENT\tBUSY\tPOLLS\tPOLL BUSY/CAP")
	for _, b := range bs.Buses {
		s := b.Stats
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%d\t%s/%.0f%%\n", b.Name, b.Transport, b.Target, s.Transactions, s.Timeouts,
			s.CRCErrors, s.FrameErrors, s.Exceptions, s.NotSent, s.Busy.Round(time.Millisecond), b.Polls, b.PollBusy.Round(time.Millisecond), 100*b.PollCap)
	}
	_ = tw.Flush()
}
