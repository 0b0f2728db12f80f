package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/fence"
)

const fenceUsage = `usage: edgefence fence <command> [flags]

Inspect the gateway's fence table (the high-water marks of the devices this
gateway fences). With no agent running the file is read directly; while an
agent runs it holds the file, and with --config (or --socket) the commands
ask that agent over its local API instead.

commands:
  list [--table FILE | --config FILE | --socket PATH] [--json]           every device's mark
  show [--table FILE | --config FILE | --socket PATH] [--json] DEVICE... the named devices' marks
  reset DEVICE --to TOKEN --root-key FILE --root-kid KID (--out FILE | --config FILE)
        set a device's mark by the operator's signed authority (any fence
        point: a device's shim or a gateway's table); reset -h for more

The table file is --table, or <state_dir>/` + fence.TableFile + ` of the --config file's
agent, or ` + agent.DefaultStateDir + `/` + fence.TableFile + `.
`

func cmdFence(args []string, stdout, stderr io.Writer) error {
	return subcommand("fence", fenceUsage, map[string]command{"list": cmdFenceList, "show": cmdFenceShow, "reset": cmdFenceReset}, args, stdout, stderr)
}

// command is one subcommand of a command group (fence list, twin set …).
type command func(args []string, stdout, stderr io.Writer) error

// subcommand runs the subcommand args[0] of group from cmds; help prints
// usage; a missing or unknown one is a usage error (exit 2).
func subcommand(group, usage string, cmds map[string]command, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitError{2}
	}
	if c, ok := cmds[args[0]]; ok {
		return c(args[1:], stdout, stderr)
	}
	switch args[0] {
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprintf(stderr, "edgefence %s: unknown command %q\n\n%s", group, args[0], usage)
	return exitError{2}
}

// fenceFlags are the flags of the fence commands.
type fenceFlags struct {
	fs      *flag.FlagSet
	table   string
	config  string
	socket  string
	asJSON  bool
	timeout time.Duration
}

func newFenceFlags(name, args string, stderr io.Writer) *fenceFlags {
	f := &fenceFlags{fs: flag.NewFlagSet("fence "+name, flag.ContinueOnError)}
	f.fs.SetOutput(stderr)
	f.fs.StringVar(&f.table, "table", "", "fence table file")
	f.fs.StringVar(&f.config, "config", "", "agent config file: the table is <state_dir>/"+fence.TableFile+"; a running agent is asked over its socket")
	f.fs.StringVar(&f.socket, "socket", "", "ask the agent listening on this API socket")
	f.fs.BoolVar(&f.asJSON, "json", false, "print JSON")
	f.fs.DurationVar(&f.timeout, "timeout", fence.DefaultTableTimeout, "give up waiting for the file lock after this long")
	f.fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: edgefence fence %s [flags]%s\n", name, args)
		f.fs.PrintDefaults()
	}
	return f
}

// parse parses flags placed before, between and after the arguments, and
// returns the arguments.
func (f *fenceFlags) parse(args []string) ([]string, error) {
	var rest []string
	for {
		if err := f.fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, exitError{2}
		}
		args = f.fs.Args()
		if len(args) == 0 {
			return rest, nil
		}
		rest = append(rest, args[0])
		args = args[1:]
	}
}

// fenceSource is where the records come from: the file, or a running agent.
type fenceSource interface {
	List() ([]fence.Record, error)
	Get(device string) (fence.Record, bool, error)
	Close() error
}

// agentSource reads the fence table of a running agent over its API.
type agentSource struct{ c *agent.APIClient }

func (a agentSource) List() ([]fence.Record, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	recs, err := a.c.FenceList(ctx)
	return recs, a.explain(err)
}

func (a agentSource) Get(device string) (fence.Record, bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rec, found, err := a.c.FenceGet(ctx, device)
	return rec, found, a.explain(err)
}

// explain says which agent keeps no fence table.
func (a agentSource) explain(err error) error {
	if errors.Is(err, agent.ErrNoFenceTable) {
		return errNoTable("the gateway of the agent at " + a.c.Socket)
	}
	return err
}

// errNoTable is the error of the fence commands on a gateway without a
// fence table: who is home of no gateway-fenced device.
func errNoTable(who string) error {
	return fmt.Errorf("%w: %s is home of no `fence: gateway` device, so it keeps none "+
		"(a `fence: device` device keeps its mark itself: edgefence devices)", agent.ErrNoFenceTable, who)
}

func (agentSource) Close() error { return nil }

// open opens the table file read-only, or, when a running agent holds it
// and its socket is known, asks that agent.
func (f *fenceFlags) open() (fenceSource, error) {
	if f.table != "" && (f.config != "" || f.socket != "") {
		f.fs.Usage()
		return nil, exitError{2}
	}
	loc, err := locateState(f.table, f.config, f.socket, "", fence.TableFile)
	if err != nil {
		return nil, err
	}
	if loc.agentOnly {
		return agentSource{agent.NewAPIClient(loc.socket)}, nil
	}
	t, err := fence.OpenTable(loc.path, &fence.TableOptions{ReadOnly: true, Timeout: f.timeout})
	switch {
	case errors.Is(err, fence.ErrTableLocked) && loc.socket != "":
		return agentSource{agent.NewAPIClient(loc.socket)}, nil
	case errors.Is(err, os.ErrNotExist) && loc.cfg != nil && len(loc.cfg.Bridged()) == 0:
		return nil, errNoTable("gateway " + loc.cfg.Gateway)
	case errors.Is(err, os.ErrNotExist) && loc.cfg != nil:
		return nil, fmt.Errorf("%w (gateway %s is home of %d `fence: gateway` devices: its agent creates the table when it first starts)",
			err, loc.cfg.Gateway, len(loc.cfg.Bridged()))
	case err != nil:
		return nil, err
	}
	return t, nil
}

// stateLocation is where a state file of the agent is, and the socket of
// the agent to ask when it holds the file.
type stateLocation struct {
	path      string
	socket    string
	agentOnly bool          // only a socket was given: ask the agent
	cfg       *agent.Config // the --config file's, if given
}

// locateState resolves the --file/--table, --config, --socket and
// --state-dir flags of the commands that read the agent's state files
// (fence, outbox): an explicit file, else <state_dir>/name of the config
// or of --state-dir, else the default state dir; the socket is the flag's
// or the config's.
func locateState(file, config, socket, stateDir, name string) (stateLocation, error) {
	loc := stateLocation{path: file, socket: socket}
	switch {
	case socket != "" && config == "" && stateDir == "" && file == "":
		loc.agentOnly = true
	case config != "":
		c, err := agent.LoadConfig(config)
		if err != nil {
			return loc, err
		}
		loc.path, loc.cfg = filepath.Join(c.StateDir, name), c
		if loc.socket == "" {
			loc.socket = c.API.Socket
		}
	case stateDir != "":
		loc.path = filepath.Join(stateDir, name)
	case file == "":
		loc.path = filepath.Join(agent.DefaultStateDir, name)
	}
	return loc, nil
}

func cmdFenceList(args []string, stdout, stderr io.Writer) error {
	f := newFenceFlags("list", "", stderr)
	rest, err := f.parse(args)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		f.fs.Usage()
		return exitError{2}
	}
	tab, err := f.open()
	if err != nil {
		return err
	}
	defer tab.Close()
	recs, listErr := tab.List() // the readable records even if some are not
	if errors.Is(listErr, agent.ErrUnreachable) || errors.Is(listErr, agent.ErrNoFenceTable) {
		return listErr
	}
	if err := printRecords(stdout, recs, f.asJSON); err != nil {
		return err
	}
	return listErr
}

func cmdFenceShow(args []string, stdout, stderr io.Writer) error {
	f := newFenceFlags("show", " DEVICE...", stderr)
	devices, err := f.parse(args)
	if err != nil {
		return err
	}
	if len(devices) == 0 {
		f.fs.Usage()
		return exitError{2}
	}
	tab, err := f.open()
	if err != nil {
		return err
	}
	defer tab.Close()
	var recs []fence.Record
	var errs []error
	for _, dev := range devices {
		r, found, err := tab.Get(dev)
		switch {
		case errors.Is(err, agent.ErrUnreachable), errors.Is(err, agent.ErrNoFenceTable):
			return err
		case err != nil:
			errs = append(errs, err)
		case !found:
			errs = append(errs, fmt.Errorf("%s: no mark: the table never accepted a command for it", dev))
		default:
			recs = append(recs, r)
		}
	}
	if err := printRecords(stdout, recs, f.asJSON); err != nil {
		return err
	}
	return errors.Join(errs...)
}

// printRecords writes records as an aligned table or as a JSON array.
func printRecords(w io.Writer, recs []fence.Record, asJSON bool) error {
	if asJSON {
		if recs == nil {
			recs = []fence.Record{}
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(recs)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DEVICE\tTOKEN\tSEQ\tHOLDER\tWHEN\tCOMMAND")
	for _, r := range recs {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\n", r.Device, r.Mark.Token, r.Mark.Seq,
			orDash(r.Holder), r.At.UTC().Format("2006-01-02T15:04:05.000Z"), orDash(r.ID))
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
