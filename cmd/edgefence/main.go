// Command edgefence is the gateway agent and its operator CLI.
//
//	edgefence run --config FILE        run the agent (systemd: Type=notify comes later)
//	edgefence status [--socket PATH]   leases held, token per device, connections
//	edgefence send DEVICE KIND [JSON]  issue one command via the running agent; prints the verdict
//	edgefence check-config FILE        validate a config file
//	edgefence fence list|show          read the gateway's fence table file
//	edgefence outbox list|show         read the agent's outbox (queued commands and their terminal states)
//	edgefence twin get|set|watch       read, write and follow a device's twin in etcd
//	edgefence version
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/fence"
)

// version and commit are set at build time with -ldflags
// "-X main.version=... -X main.commit=..." (make build, make cross). Without
// a commit, the VCS revision go build stamps into the binary is used.
var (
	version = "dev"
	commit  = ""
)

// versionLine is what `edgefence version` prints.
func versionLine() string {
	c := commit
	if c == "" {
		if bi, ok := debug.ReadBuildInfo(); ok {
			for _, s := range bi.Settings {
				if s.Key == "vcs.revision" && len(s.Value) >= 12 {
					c = s.Value[:12]
				}
			}
		}
	}
	if c == "" {
		c = "unknown"
	}
	return fmt.Sprintf("edgefence %s (commit %s, %s %s/%s)", version, c, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `usage: edgefence <command> [flags]

commands:
  run --config FILE          run the agent
  status                     show leases, tokens and connections of the running agent
  send DEVICE KIND [JSON]    issue one command via the running agent and print the verdict
  check-config FILE          validate a config file and print it with defaults filled in
  fence list | show DEVICE   print the fence table's marks (read from its file)
  outbox list | show ID      print the outbox's queued commands and terminal states
  twin get | set | watch     read a device's twin, merge into its desired state, follow it live
  version                    print the version

Run 'edgefence <command> -h' for the flags of a command.
`

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "run":
		err = cmdRun(args[1:], stderr)
	case "status":
		err = cmdStatus(args[1:], stdout)
	case "send":
		err = cmdSend(args[1:], stdout, stderr)
	case "check-config":
		err = cmdCheckConfig(args[1:], stdout)
	case "fence":
		err = cmdFence(args[1:], stdout, stderr)
	case "outbox":
		err = cmdOutbox(args[1:], stdout, stderr)
	case "twin":
		err = cmdTwin(args[1:], stdout, stderr)
	case "version", "--version":
		fmt.Fprintln(stdout, versionLine())
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
	default:
		fmt.Fprintf(stderr, "edgefence: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		var ex exitError
		if errors.As(err, &ex) {
			return ex.code
		}
		fmt.Fprintln(stderr, "edgefence:", err)
		return 1
	}
	return 0
}

// exitError carries an exit code for a failure already reported.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit %d", e.code) }

// socketFlag registers the flags that locate a running agent's socket.
func socketFlags(fs *flag.FlagSet) func() (string, error) {
	socket := fs.String("socket", "", "agent API socket (default: from --config, $EDGEFENCE_SOCKET, or "+agent.DefaultSocket+")")
	config := fs.String("config", "", "agent config file, to find its socket")
	return func() (string, error) {
		switch {
		case *socket != "":
			return *socket, nil
		case *config != "":
			c, err := agent.LoadConfig(*config)
			if err != nil {
				return "", err
			}
			return c.API.Socket, nil
		case os.Getenv("EDGEFENCE_SOCKET") != "":
			return os.Getenv("EDGEFENCE_SOCKET"), nil
		}
		return agent.DefaultSocket, nil
	}
}

func cmdStatus(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	sock := socketFlags(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	path, err := sock()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := agent.NewAPIClient(path).Status(ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	printStatus(stdout, st)
	return nil
}

func printStatus(w io.Writer, st *agent.Status) {
	sess := "none"
	if st.Etcd.Session {
		sess = "lease " + st.Etcd.Lease + " (ttl " + st.Etcd.TTL + ")"
	}
	fmt.Fprintf(w, "gateway  %s\netcd     %s  session: %s, %d opened\n", st.Gateway, strings.Join(st.Etcd.Endpoints, ","), sess, st.Etcd.Sessions)
	if st.Transport != nil {
		b, _ := json.Marshal(st.Transport)
		fmt.Fprintf(w, "mqtt     %s\n", b)
	}
	fmt.Fprintf(w, "\n%-20s %-12s %10s %8s  %s\n", "DEVICE", "STATE", "TOKEN", "SEQ", "LAST VERDICT")
	for _, d := range st.Devices {
		last := "-"
		if d.LastAck != nil {
			last = fmt.Sprintf("%s (token %d seq %d; fence at %d/%d)", d.LastAck.Verdict, d.LastAck.Token, d.LastAck.Seq, d.LastAck.MaxToken, d.LastAck.LastSeq)
		}
		tok := "-"
		if d.Token != 0 {
			tok = fmt.Sprint(d.Token)
		}
		fmt.Fprintf(w, "%-20s %-12s %10s %8d  %s\n", d.ID, d.State, tok, d.Seq, last)
	}
	c := st.Counters
	fmt.Fprintf(w, "\nsent %d: accepted %d, duplicate %d, stale %d, invalid %d, no ack %d, send errors %d\n",
		c.Sent, c.Accepted, c.Duplicate, c.Stale, c.Invalid, c.NoAck, c.SendErrors)
}

func cmdSend(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("send", flag.ContinueOnError)
	sock := socketFlags(fs)
	timeout := fs.Duration("timeout", 30*time.Second, "give up after this long")
	noWait := fs.Bool("no-wait", false, "return once the command is stored in the agent's outbox (exit 4), without waiting for the device's verdict")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), `usage: edgefence send [flags] DEVICE KIND [JSON-BODY]

Exit status: 0 accepted by the device; 3 another verdict (duplicate, stale,
invalid); 4 queued: stored in the agent's outbox without a verdict yet (it is
delivered when it can be: see edgefence outbox show ID); 1 refused (not the
holder, unknown device, outbox full) or failed; 2 usage.`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() < 2 || fs.NArg() > 3 {
		fs.Usage()
		return exitError{2}
	}
	var body json.RawMessage
	if fs.NArg() == 3 {
		body = json.RawMessage(fs.Arg(2))
		if !json.Valid(body) {
			return fmt.Errorf("body is not valid JSON: %s", fs.Arg(2))
		}
	}
	path, err := sock()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	api := agent.NewAPIClient(path)
	send := api.Send
	if *noWait {
		send = api.Enqueue
	}
	res, err := send(ctx, fs.Arg(0), fs.Arg(1), body)
	if res != nil {
		enc := json.NewEncoder(stdout)
		_ = enc.Encode(res)
		if res.Verdict != "" {
			var v fence.Verdict
			if v.UnmarshalText([]byte(res.Verdict)) == nil && v != fence.Accepted {
				return exitError{3} // a verdict other than accepted
			}
			return nil
		}
		if res.Queued {
			if res.Error != "" {
				fmt.Fprintf(stderr, "edgefence: no verdict yet; queued as %s (edgefence outbox show %s)\n", res.ID, res.ID)
			}
			return exitError{4}
		}
		// No verdict: the agent refused (unknown device, not the holder,
		// outbox full). The JSON on stdout says so for scripts; say it
		// on stderr for people.
		if res.Error != "" {
			fmt.Fprintln(stderr, "edgefence:", res.Error)
		} else if err != nil {
			fmt.Fprintln(stderr, "edgefence:", err)
		}
		return exitError{1}
	}
	return err
}

func cmdCheckConfig(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("check-config", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: edgefence check-config FILE\n\nValidates FILE and prints it, with the defaults filled in, as a config file.")
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return exitError{2}
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return exitError{2}
	}
	c, err := agent.LoadConfig(fs.Arg(0))
	if err != nil {
		return err
	}
	if _, err := bridgeDevices(c); err != nil { // serial port settings
		return fmt.Errorf("%s: %w", fs.Arg(0), err)
	}
	enc := yaml.NewEncoder(stdout)
	enc.SetIndent(2)
	if err := enc.Encode(c); err != nil {
		return err
	}
	return enc.Close()
}

func newLogger(c agent.LogConfig, w *os.File) *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(c.Level))
	opts := &slog.HandlerOptions{Level: lvl}
	format := c.Format
	if format == "auto" {
		format = "json"
		if fi, err := w.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			format = "text"
		}
	}
	if format == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
}
