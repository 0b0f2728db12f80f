package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/offline"
)

const outboxUsage = `usage: edgefence outbox <command> [flags]

Inspect the agent's durable outbox: the commands queued for delivery and the
terminal state (accepted, duplicate, stale, invalid, expired) of each one
delivered. With no agent running the file is read directly; while an agent
runs it holds the file, and with --config (or --socket) the commands ask
that agent over its local API instead.

commands:
  list [source flags] [--device D] [--state pending|terminal|all] [--limit N] [--json]
                     the entries (pending by default) and a summary of the pending ones
  show [source flags] [--json] ID...
                     the named entries with their acks; ID may be the short id list prints

source flags: --file FILE | --state-dir DIR | --config FILE | --socket PATH
The outbox file is --file, or <state_dir>/` + offline.File + ` of --state-dir or of the
--config file's agent, or ` + agent.DefaultStateDir + `/` + offline.File + `.
`

func cmdOutbox(args []string, stdout, stderr io.Writer) error {
	return subcommand("outbox", outboxUsage, map[string]command{"list": cmdOutboxList, "show": cmdOutboxShow}, args, stdout, stderr)
}

// outboxFlags are the flags of the outbox commands.
type outboxFlags struct {
	fenceFlags // fs, config, socket, asJSON, timeout; its table is --file
	stateDir   string
}

func newOutboxFlags(name, args string, stderr io.Writer) *outboxFlags {
	f := &outboxFlags{fenceFlags: fenceFlags{fs: flag.NewFlagSet("outbox "+name, flag.ContinueOnError)}}
	f.fs.SetOutput(stderr)
	f.fs.StringVar(&f.table, "file", "", "outbox file")
	f.fs.StringVar(&f.stateDir, "state-dir", "", "agent state directory: the outbox is <state-dir>/"+offline.File)
	f.fs.StringVar(&f.config, "config", "", "agent config file: the outbox is <state_dir>/"+offline.File+"; a running agent is asked over its socket")
	f.fs.StringVar(&f.socket, "socket", "", "ask the agent listening on this API socket")
	f.fs.BoolVar(&f.asJSON, "json", false, "print JSON")
	f.fs.DurationVar(&f.timeout, "timeout", offline.DefaultTimeout, "give up waiting for the file lock after this long")
	f.fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: edgefence outbox %s [flags]%s\n", name, args)
		f.fs.PrintDefaults()
	}
	return f
}

// outboxSource is where the records come from: the file, or a running agent.
type outboxSource interface {
	// List returns the selected records and the pending summary; an error
	// wrapping offline.ErrCorrupt comes with the readable records.
	List(f offline.Filter) ([]offline.Record, offline.Summary, error)
	Find(id string) (offline.Record, error)
	Close() error
}

// outboxFile reads the outbox file, read-only.
type outboxFile struct{ *offline.Outbox }

func (o outboxFile) List(f offline.Filter) ([]offline.Record, offline.Summary, error) {
	recs, listErr := o.Outbox.List(f)
	s, err := o.Summary(f.Device)
	return recs, s, errors.Join(listErr, err)
}

// outboxAgent asks a running agent over its API.
type outboxAgent struct{ c *agent.APIClient }

func (a outboxAgent) List(f offline.Filter) ([]offline.Record, offline.Summary, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := a.c.OutboxList(ctx, f)
	if l == nil {
		return nil, offline.Summary{}, err
	}
	return l.Records, l.Summary, err
}

func (a outboxAgent) Find(id string) (offline.Record, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return a.c.OutboxGet(ctx, id)
}

func (outboxAgent) Close() error { return nil }

// open opens the outbox file read-only, or, when a running agent holds it
// and its socket is known, asks that agent.
func (f *outboxFlags) open() (outboxSource, error) {
	if f.table != "" && (f.config != "" || f.socket != "" || f.stateDir != "") || f.stateDir != "" && f.config != "" {
		f.fs.Usage()
		return nil, exitError{2}
	}
	loc, err := locateState(f.table, f.config, f.socket, f.stateDir, offline.File)
	if err != nil {
		return nil, err
	}
	if loc.agentOnly {
		return outboxAgent{agent.NewAPIClient(loc.socket)}, nil
	}
	ob, err := offline.Open(loc.path, &offline.Options{ReadOnly: true, Timeout: f.timeout})
	switch {
	case errors.Is(err, offline.ErrLocked) && loc.socket != "":
		return outboxAgent{agent.NewAPIClient(loc.socket)}, nil
	case errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("%w (no agent has kept an outbox there)", err)
	case err != nil:
		return nil, err
	}
	return outboxFile{ob}, nil
}

func cmdOutboxList(args []string, stdout, stderr io.Writer) error {
	f := newOutboxFlags("list", "", stderr)
	var filter offline.Filter
	f.fs.StringVar(&filter.Device, "device", "", "only this device's entries")
	state := f.fs.String("state", "pending", "pending, terminal or all")
	f.fs.IntVar(&filter.Limit, "limit", 0, "print at most this many entries (0: all)")
	rest, err := f.parse(args)
	if err != nil {
		return err
	}
	switch *state {
	case "pending":
		filter.PendingOnly = true
	case "terminal":
		filter.TerminalOnly = true
	case "all":
	default:
		fmt.Fprintf(stderr, "edgefence outbox list: --state %q: want pending, terminal or all\n", *state)
		return exitError{2}
	}
	if len(rest) > 0 || filter.Limit < 0 {
		f.fs.Usage()
		return exitError{2}
	}
	src, err := f.open()
	if err != nil {
		return err
	}
	defer src.Close()
	recs, sum, listErr := src.List(filter) // the readable records even if some are not
	if errors.Is(listErr, agent.ErrUnreachable) {
		return listErr
	}
	if recs == nil {
		recs = []offline.Record{}
	}
	if f.asJSON {
		if err := printJSON(stdout, agent.OutboxList{Records: recs, Summary: sum}); err != nil {
			return err
		}
		return listErr
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DEVICE\tID\tTOKEN\tSEQ\tKIND\tSTATE\tAGE\tREASON")
	for _, r := range recs {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\n", r.Device, shortID(r.ID), r.Token, r.Seq, r.Kind,
			r.StateString(), fmtAge(r.Age), orDash(oneLine(r.Reason())))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(stdout)
	if err := printSummary(stdout, sum); err != nil {
		return err
	}
	return listErr
}

func cmdOutboxShow(args []string, stdout, stderr io.Writer) error {
	f := newOutboxFlags("show", " ID...", stderr)
	ids, err := f.parse(args)
	if err != nil {
		return err
	}
	if len(ids) == 0 {
		f.fs.Usage()
		return exitError{2}
	}
	src, err := f.open()
	if err != nil {
		return err
	}
	defer src.Close()
	recs := []offline.Record{}
	var errs []error
	for _, id := range ids {
		r, err := src.Find(id)
		switch {
		case errors.Is(err, agent.ErrUnreachable):
			return err
		case errors.Is(err, offline.ErrNotFound):
			errs = append(errs, fmt.Errorf("%s: no such entry in the outbox (never appended, or compacted after its retention)", id))
		case err != nil:
			errs = append(errs, err)
		default:
			recs = append(recs, r)
		}
	}
	if f.asJSON {
		if err := printJSON(stdout, recs); err != nil {
			return err
		}
		return errors.Join(errs...)
	}
	for i, r := range recs {
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		printEntry(stdout, &r)
	}
	return errors.Join(errs...)
}

// printEntry writes one record, its ack included, as aligned lines.
func printEntry(w io.Writer, r *offline.Record) {
	const ts = "2006-01-02T15:04:05.000Z"
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "id\t%s\n", r.ID)
	fmt.Fprintf(tw, "device\t%s\n", r.Device)
	fmt.Fprintf(tw, "token\t%d\n", r.Token)
	fmt.Fprintf(tw, "seq\t%d\n", r.Seq)
	fmt.Fprintf(tw, "kind\t%s\n", r.Kind)
	fmt.Fprintf(tw, "body\t%s\n", fmtBody(r))
	fmt.Fprintf(tw, "position\t%d\n", r.Pos)
	fmt.Fprintf(tw, "state\t%s\n", r.StateString())
	fmt.Fprintf(tw, "created\t%s (%s ago)\n", r.Created.UTC().Format(ts), fmtAge(r.Age))
	fmt.Fprintf(tw, "deadline\t%s\n", r.Deadline.UTC().Format(ts))
	if !r.Pending() {
		fmt.Fprintf(tw, "resolved\t%s\n", r.Resolved.UTC().Format(ts))
	}
	switch a := r.Ack; {
	case a != nil && agent.EndedUnsent(a):
		// No fence point answered: there is no mark to show.
		fmt.Fprintf(tw, "ack\t- (ended %s by the agent, never sent; token %d seq %d)\n", a.Verdict, a.Token, a.Seq)
	case a != nil:
		fmt.Fprintf(tw, "ack\t%s: token %d seq %d; fence point at token %d seq %d\n", a.Verdict, a.Token, a.Seq, a.MaxToken, a.LastSeq)
	case r.State == fence.Expired:
		fmt.Fprintf(tw, "ack\t- (expired in the outbox: no ack within its time to live)\n")
	default:
		fmt.Fprintf(tw, "ack\t- (pending)\n")
	}
	if a := r.Ack; a != nil && a.Reason != "" {
		fmt.Fprintf(tw, "reason\t%s\n", oneLine(a.Reason))
	}
	_ = tw.Flush()
}

// fmtBody is the size of the envelope's body and, if the outbox dropped it
// when the entry ended, that and its SHA-256.
func fmtBody(r *offline.Record) string {
	switch {
	case r.BodyDropped:
		return fmt.Sprintf("%d bytes (dropped at %s, sha256 %x)", r.BodyBytes, r.StateString(), r.BodySHA256)
	case r.BodyBytes == 0:
		return "none"
	}
	return fmt.Sprintf("%d bytes", r.BodyBytes)
}

// printSummary writes the pending count and bytes per device, and the age
// of each device's oldest pending entry: a table, one device a line, and a
// total line; or "pending: none".
func printSummary(w io.Writer, s offline.Summary) error {
	if s.Pending == 0 {
		_, err := fmt.Fprintln(w, "pending: none")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DEVICE\tPENDING\tBYTES\tOLDEST")
	for _, d := range s.Devices {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\n", d.Device, d.Pending, d.Bytes, fmtAge(d.OldestAge))
	}
	if len(s.Devices) != 1 {
		// Not a device id: those have no parentheses.
		fmt.Fprintf(tw, "(total)\t%d\t%d\t%s\n", s.Pending, s.Bytes, fmtAge(s.OldestAge))
	}
	return tw.Flush()
}

// shortID is the first 12 characters of a command id: enough to tell
// entries apart, and accepted by show.
func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// fmtAge prints a duration to the second, in at most two units.
func fmtAge(d time.Duration) string {
	if d < 0 {
		d = 0 // created "in the future": another clock
	}
	s := int64(d / time.Second)
	switch {
	case s < 60:
		return fmt.Sprintf("%ds", s)
	case s < 3600:
		return fmt.Sprintf("%dm%02ds", s/60, s%60)
	case s < 86400:
		return fmt.Sprintf("%dh%02dm", s/3600, s%3600/60)
	}
	return fmt.Sprintf("%dd%02dh", s/86400, s%86400/3600)
}

// oneLine keeps a reason on its table row.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
